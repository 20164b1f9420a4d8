"""One training loop for every learner here (the target LM, the probe, the PRM, the RL policy): optax, orbax,
TensorBoard.

Functional core: `make_train_step(loss_fn, tx)`, a jitted step over (params, opt_state, batch, rng, frozen), or a
caller's own step of that signature (`step_fn`: the RL loop's rollout -> advantages -> jitted update).
Shell: `Trainer.fit`, which feeds step i the batch `batches(i)` and the key fold_in(key(seed), i) (pure functions of
i, so a run killed and resumed sees what an uninterrupted run would), keeps each step's metrics on the device and
fetches them every `log_every` steps (no host sync per step), writes TensorBoard scalars, evaluates, keeps the latest
and the best checkpoint in one orbax `CheckpointManager`, and stops early after `patience` evaluations without
improvement. Library code stays quiet: progress goes to an `on_step` callback (the CLI passes tqdm).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from typing import Any, Callable, Mapping

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging

from reprobe_jax.errors import CheckpointError, ConfigError
from reprobe_jax.fields import SEED, check_fields
from reprobe_jax.models.sharding import as_global, as_local
from reprobe_jax.train import checksum
from reprobe_jax.train.tblog import ScalarWriter

LossFn = Callable[..., Any]  # (params, batch, rng, frozen) -> loss, or (loss, {name: scalar}) with has_aux


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
  """The loop's settings; none of them changes the compiled step.

  eval_every: evaluate (and checkpoint) every N steps and at the last step; 0 = never. best_metric: the name in
  `evaluate`'s dict that ranks checkpoints (`best_mode` 'max' or 'min'; a non-finite value never improves).
  patience: stop after this many evaluations in a row without improvement (None = never). keep_latest: how many
  of the latest checkpoints orbax keeps besides the best.
  """

  steps: int
  seed: int = 0
  log_every: int = 10
  checkpoint_every: int = 100
  eval_every: int = 0
  best_metric: str | None = None
  best_mode: str = "max"
  patience: int | None = None
  keep_latest: int = 1

  def __post_init__(self):
    check_fields(self, {"seed": SEED})
    for name in ("steps", "log_every", "checkpoint_every", "keep_latest"):
      if getattr(self, name) < 1:
        raise ConfigError(f"TrainerConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.eval_every < 0:
      raise ConfigError(f"TrainerConfig.eval_every must be >= 0, got {self.eval_every}")
    if self.best_mode not in ("max", "min"):
      raise ConfigError(f"TrainerConfig.best_mode must be 'max' or 'min', got {self.best_mode!r}")
    if (self.best_metric is None) != (self.eval_every == 0):
      raise ConfigError(
        f"TrainerConfig: best_metric ({self.best_metric!r}) and eval_every ({self.eval_every}) go "
        "together: set both or neither"
      )
    if self.patience is not None and (self.patience < 1 or self.best_metric is None):
      raise ConfigError(f"TrainerConfig.patience={self.patience} needs a best_metric and must be >= 1")


@dataclasses.dataclass
class TrainResult:
  """params: after the last step run; best_params: at the best evaluation (None when no evaluation improved, or
  none ran); metrics: {name: [value at step 1, 2, ...]}; history: one entry per evaluation."""

  params: Any
  best_params: Any
  opt_state: Any
  metrics: dict[str, list[float]]
  history: list[dict]
  step: int
  stopped_early: bool


def make_train_step(loss_fn: LossFn, tx: optax.GradientTransformation, *, has_aux: bool = False):
  """loss_fn(params, batch, rng, frozen) -> jitted step(params, opt_state, batch, rng, frozen) ->
  (params, opt_state, {'loss': scalar, **aux}); params and opt_state are donated, `frozen` (inputs that are not
  trained: a probe's RNG state, a reference policy) is not."""

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state, batch, rng, frozen):
    if has_aux:
      (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, rng, frozen)
    else:
      loss, grads = jax.value_and_grad(loss_fn)(params, batch, rng, frozen)
      aux = {}
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, {"loss": loss, **aux}

  return step


class Trainer:
  """The shell around one train step: `fit(params, batches)` trains from scratch or resumes from `workdir`.

  Writes `workdir/train_state` (orbax steps: {'state': params and optimiser state, 'meta': JSON of per-step
  metrics, evaluations and the best step, what the checkpoint depends on: the TrainerConfig, the caller's
  `signature` (e.g. the model's shape and optimiser settings) and the shape and dtype of every state leaf, and the
  `checksum` of the state's bytes and of this meta (`train.checksum`), written with each save}) and
  `workdir/tb` (train/<metric> means every `log_every` steps, train/learning_rate, and at each evaluation
  train/mean_loss since the last one and val/<metric>). A resume refuses, with a CheckpointError naming the
  folder, a checkpoint made with another config or state shapes, one orbax cannot read (truncated, deleted
  or garbled files), one whose state or meta does not match its checksum (changed in place), and one without a
  checksum (written before checkpoints carried one: its data cannot be checked).
  """

  def __init__(
    self,
    loss_fn: LossFn,
    tx: optax.GradientTransformation,
    cfg: TrainerConfig,
    workdir: str,
    *,
    has_aux: bool = False,
    learning_rate: Callable[[int], Any] | None = None,
    evaluate: Callable[[Any], Mapping[str, float]] | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    on_eval: Callable[[int, dict], None] | None = None,
    signature: Mapping[str, Any] | None = None,
    step_fn: Callable | None = None,
  ):
    if (loss_fn is None) == (step_fn is None):
      raise ConfigError("Trainer: give a loss_fn (the jitted step is built from it) or a step_fn, not both")
    if (evaluate is None) != (cfg.best_metric is None):
      raise ConfigError("Trainer: an `evaluate` function and TrainerConfig.best_metric go together")
    try:  # stored as JSON and compared with what the JSON gives back
      self.signature = json.loads(json.dumps({"trainer": dataclasses.asdict(cfg), **(signature or {})}))
    except (TypeError, ValueError) as e:
      raise ConfigError(f"Trainer: the checkpoint signature must be JSON ({e})") from None
    self.tx, self.cfg, self.workdir = tx, cfg, workdir
    # step_fn(params, opt_state, batch, rng, frozen) -> (params, opt_state, metrics): a whole step built by the
    # caller (the RL loop's rollout -> update), run where the jitted step would be.
    self.step_fn = step_fn or make_train_step(loss_fn, tx, has_aux=has_aux)
    self.learning_rate, self.evaluate, self.on_step, self.on_eval = learning_rate, evaluate, on_step, on_eval

  @property
  def checkpoint_dir(self) -> str:
    return os.path.abspath(os.path.join(self.workdir, "train_state"))

  def _manager(self) -> ocp.CheckpointManager:
    cfg = self.cfg
    policies = ocp.checkpoint_managers
    latest = policies.LatestN(n=cfg.keep_latest)
    if cfg.best_metric is None:
      return ocp.CheckpointManager(
        self.checkpoint_dir, options=ocp.CheckpointManagerOptions(create=True, preservation_policy=latest)
      )
    # Every evaluated checkpoint carries metrics; only one that improved ranks, so ties in the metric never make
    # orbax keep a later checkpoint in place of the first that reached the best value.
    worst = -math.inf if cfg.best_mode == "max" else math.inf

    def rank(m):
      return m[cfg.best_metric] if m["improved"] else worst

    best = policies.BestN(
      get_metric_fn=rank, reverse=cfg.best_mode == "min", n=1, keep_checkpoints_without_metrics=False
    )
    return ocp.CheckpointManager(
      self.checkpoint_dir,
      options=ocp.CheckpointManagerOptions(
        create=True,
        best_fn=rank,
        best_mode=cfg.best_mode,
        preservation_policy=policies.AnyPreservationPolicy([latest, best]),
      ),
    )

  def _step_dir(self, step: int) -> str:
    return os.path.join(self.checkpoint_dir, str(step))

  def _unreadable(self, step: int, e: Exception) -> CheckpointError:
    what = " ".join(str(e).split())[:300]
    return CheckpointError(
      f"{self._step_dir(step)}: the checkpoint cannot be read ({type(e).__name__}: {what}); "
      f"delete that step folder to resume from an earlier one, or {self.workdir} to train anew"
    )

  def _restore_meta(self, mngr, step: int, tree: dict) -> dict:
    """The JSON part of a checkpoint, checked: the same config and state shapes as this run, and every field."""
    try:
      meta = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # orbax raises whatever its readers raise on damaged files
      raise self._unreadable(step, e) from None
    kinds = {
      "step": int,
      "metrics": dict,
      "history": list,
      "bad_evals": int,
      "best_step": (int, type(None)),
      "best_score": (int, float, type(None)),
    }
    bad = [
      k for k, kind in kinds.items() if not isinstance(meta, dict) or k not in meta or not isinstance(meta[k], kind)
    ]
    if bad or meta["step"] != step:
      raise self._unreadable(step, ValueError(f"training state without a valid {bad[0] if bad else 'step'!r}"))
    if not checksum.well_formed(meta.get(checksum.KEY)):
      raise CheckpointError(
        f"{self._step_dir(step)}: the checkpoint has no valid checksum (written before checkpoints carried one, or "
        f"its meta was edited), so its data cannot be checked; delete {self.workdir} to train anew"
      )
    if meta[checksum.KEY]["meta"] != checksum.meta_digest(meta):
      raise self._changed(step, "its meta (metrics, evaluations, best step, config)")
    for key, now in (("config", self.signature), ("tree", tree)):
      if key in meta and meta[key] != now:  # (a checkpoint from before these were stored has nothing to compare)
        diff = _first_difference(meta[key], now)
        raise CheckpointError(
          f"{self._step_dir(step)}: the checkpoint was made with {diff}; resuming it would "
          f"not be the run asked for: use another workdir, or delete {self.workdir} to train "
          "anew"
        )
    return meta

  def _changed(self, step: int, what: str) -> CheckpointError:
    return CheckpointError(
      f"{self._step_dir(step)}: {what} does not match the checksum written with it (changed or damaged after the "
      f"save); delete that step folder to resume from an earlier one, or {self.workdir} to train anew"
    )

  def _restore_state(self, mngr, step: int, abstract, meta: dict) -> dict:
    """The state saved at `step` (whose checked meta is `meta`), its bytes compared with the stored checksum."""
    try:
      state = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(as_global(abstract))))
      state = as_local(state["state"], abstract)
    except Exception as e:  # orbax raises whatever its readers raise on damaged files or other shapes
      raise self._unreadable(step, e) from None
    stored, now = meta[checksum.KEY]["state"], checksum.state_digests(state)
    if not checksum.same_state(stored, now):
      counts = f" (saved by {len(stored)} processes, restored by {len(now)})" if len(stored) != len(now) else ""
      raise self._changed(step, f"the saved state (parameters and optimizer state){counts}")
    return state

  def _improves(self, score: float, best: float | None) -> bool:
    if not np.isfinite(score):
      return False
    return best is None or (score > best if self.cfg.best_mode == "max" else score < best)

  def fit(self, params, batches: Callable[[int], Any], *, frozen=None) -> TrainResult:
    """Runs steps [resumed step, cfg.steps) from `params` (or the latest checkpoint); batches(i) is step i's batch
    (0-based), a pure function of i; `frozen` goes to every step untouched."""
    cfg = self.cfg
    opt_state = self.tx.init(params)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, {"params": params, "opt_state": opt_state})
    tree = {
      jax.tree_util.keystr(path): [list(leaf.shape), str(leaf.dtype)]
      for path, leaf in jax.tree_util.tree_leaves_with_path(abstract)
    }
    meta = {
      "step": 0,
      "metrics": {},
      "history": [],
      "best_step": None,
      "best_score": None,
      "bad_evals": 0,
      "config": self.signature,
      "tree": tree,
    }
    mngr = self._manager()
    # One event file per job: the processes of a multi-process job log the same values.
    tb = ScalarWriter(os.path.join(self.workdir, "tb")) if jax.process_index() == 0 else _NoScalars()
    try:
      latest = mngr.latest_step()
      if latest is not None:
        meta = self._restore_meta(mngr, latest, tree)
        state = self._restore_state(mngr, latest, abstract, meta)
        params, opt_state = state["params"], state["opt_state"]
        meta["config"], meta["tree"] = self.signature, tree
        self._check_best(mngr, meta)
        logging.info("resumed training from %s at step %d", self.checkpoint_dir, meta["step"])
      metrics, history = meta["metrics"], meta["history"]
      stop = self._patience_spent(meta)
      base_key = jax.random.key(cfg.seed)
      pending: list[tuple[int, dict]] = []  # (step, its metrics still on the device)
      for i in range(meta["step"], cfg.steps):
        if stop:
          break
        params, opt_state, m = self.step_fn(params, opt_state, batches(i), jax.random.fold_in(base_key, i), frozen)
        s = i + 1
        pending.append((s, m))
        evaluate = cfg.eval_every > 0 and (s % cfg.eval_every == 0 or s == cfg.steps)
        save = evaluate or s % cfg.checkpoint_every == 0 or s == cfg.steps
        log = s % cfg.log_every == 0
        if not (log or save):
          continue
        self._fetch(pending, metrics)
        if log:
          window = {f"train/{k}": np.mean(v[-cfg.log_every :]) for k, v in metrics.items()}
          if self.learning_rate is not None:
            window["train/learning_rate"] = self.learning_rate(i)
          tb.write(s, window)
        if not save:
          continue
        entry = self._evaluate(params, s, meta) if evaluate else None
        meta["step"] = s
        self._save(mngr, s, params, opt_state, meta, entry)
        if entry is not None:
          tb.write(
            s,
            {
              "train/mean_loss": entry["train_loss"],
              **{f"val/{k[4:]}": v for k, v in entry.items() if k.startswith("val_")},
            },
          )
          if self.on_eval is not None:
            self.on_eval(s, entry)
          stop = self._patience_spent(meta)
      mngr.wait_until_finished()
      best_params = None
      if meta["best_step"] is not None:
        self._check_best(mngr, meta)
        best = meta["best_step"]
        best_params = (
          params
          if best == meta["step"]
          else self._restore_state(mngr, best, abstract, self._restore_meta(mngr, best, tree))["params"]
        )
      return TrainResult(
        params=params,
        best_params=best_params,
        opt_state=opt_state,
        metrics=metrics,
        history=history,
        step=meta["step"],
        stopped_early=stop and meta["step"] < cfg.steps,
      )
    finally:
      mngr.close()
      tb.close()

  def _patience_spent(self, meta: dict) -> bool:
    return self.cfg.patience is not None and meta["bad_evals"] >= self.cfg.patience

  def _evaluate(self, params, step: int, meta: dict) -> dict:
    """Runs `evaluate`, updates the best step and the count of evaluations without improvement in `meta`."""
    values = {k: float(v) for k, v in self.evaluate(params).items()}
    if self.cfg.best_metric not in values:
      raise ConfigError(f"Trainer: evaluate() returned {sorted(values)}, without best_metric {self.cfg.best_metric!r}")
    score = values[self.cfg.best_metric]
    improved = self._improves(score, meta["best_score"])
    if improved:
      meta["best_step"], meta["best_score"], meta["bad_evals"] = step, score, 0
    else:
      meta["bad_evals"] += 1
    since = meta["history"][-1]["step"] if meta["history"] else 0
    entry = {
      "step": step,
      "train_loss": float(np.mean(meta["metrics"]["loss"][since:step])),
      **{f"val_{k}": v for k, v in values.items()},
      "improved": improved,
    }
    meta["history"].append(entry)
    return entry

  def _save(self, mngr, step: int, params, opt_state, meta: dict, entry: dict | None) -> None:
    ckpt_metrics = None
    if entry is not None:  # what orbax ranks by (see _manager); JSON has no NaN, so a non-finite score is None
      score = entry[f"val_{self.cfg.best_metric}"]
      ckpt_metrics = {self.cfg.best_metric: score if np.isfinite(score) else None, "improved": entry["improved"]}
    # The save may finish in the background while `meta` grows: it gets a copy (made through JSON, as restored).
    # On a multi-process job orbax saves only arrays of the whole job: process-local state is lent a replicated
    # global copy for the save (and restored through one).
    state = {"params": params, "opt_state": opt_state}
    saved = json.loads(json.dumps({k: v for k, v in meta.items() if k != checksum.KEY}))  # as restored
    saved[checksum.KEY] = checksum.stamp(saved, state)  # before the save: the next step donates these buffers
    mngr.save(
      step,
      args=ocp.args.Composite(state=ocp.args.StandardSave(as_global(state)), meta=ocp.args.JsonSave(saved)),
      metrics=ckpt_metrics,
    )

  def _fetch(self, pending: list[tuple[int, dict]], metrics: dict[str, list[float]]) -> None:
    """One device-to-host transfer for every step since the last fetch; then the progress callback per step."""
    values = jax.device_get([m for _, m in pending])
    steps = [s for s, _ in pending]
    pending.clear()
    for s, m in zip(steps, values):
      host = {k: float(v) for k, v in m.items()}
      for k, v in host.items():
        metrics.setdefault(k, []).append(v)
      if self.on_step is not None:
        self.on_step(s, host)

  def _check_best(self, mngr, meta: dict) -> None:
    """A best step named in the training state must still have its checkpoint: never hand back other parameters."""
    if meta["best_step"] is not None and meta["best_step"] not in mngr.all_steps():
      raise CheckpointError(
        f"{self.checkpoint_dir}: the saved training state names step {meta['best_step']} as the best "
        f"({self.cfg.best_metric}={meta['best_score']}), but that step's checkpoint is missing (found steps "
        f"{sorted(mngr.all_steps())}); the best parameters cannot be recovered: delete {self.workdir} to train anew"
      )


class _NoScalars:
  """The ScalarWriter of a process other than 0."""

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    del step, scalars

  def close(self) -> None:
    pass


def _first_difference(stored: Any, now: Any, path: str = "") -> str:
  """'<path>=<stored> (this run: <now>)' at the first place two JSON values differ."""
  if isinstance(stored, dict) and isinstance(now, dict):
    for key in sorted(set(stored) | set(now), key=str):
      if stored.get(key, _ABSENT) != now.get(key, _ABSENT):
        return _first_difference(stored.get(key, _ABSENT), now.get(key, _ABSENT), f"{path}.{key}" if path else key)
  shown = {id(_ABSENT): "nothing"}
  return f"{path or 'its config'}={shown.get(id(stored), repr(stored))} (this run: {shown.get(id(now), repr(now))})"


_ABSENT = object()
