"""Probe training (METHOD A5): weighted BCE, AdamW with warm-up and linear decay, early stopping on validation
PR-AUC, orbax checkpoints of the best and the latest epoch, exact resume.

Determinism: epoch e's batch order comes from (seed, e) and step k's dropout from (seed, k), so a run killed
between epochs and restarted ends with the same parameters and metrics as one that ran through.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

from reprobe_jax.errors import ConfigError
from reprobe_jax.metrics import pr_auc, roc_auc
from reprobe_jax.probe.data import Example, collate
from reprobe_jax.models.forward import StaticGraph
from reprobe_jax.probe.model import Probe, ProbeConfig, score_steps
from reprobe_jax.tblog import ScalarWriter


@dataclasses.dataclass(frozen=True)
class ProbeTrainConfig:
  """METHOD A5 defaults."""

  learning_rate: float = 5e-4
  warmup_frac: float = 0.05
  weight_decay: float = 0.1
  grad_clip: float = 1.0
  batch_size: int = 32
  epochs: int = 5
  patience: int = 3
  pos_weight: float = 3.0
  seed: int = 0


def weighted_bce(logits, labels, pos_weight: float):
  """Mean over known labels of -(w y log s(z) + (1 - y) log(1 - s(z))); NaN labels are masked out."""
  known = ~jnp.isnan(labels)
  y = jnp.where(known, labels, 0.0)
  per = -(pos_weight * y * jax.nn.log_sigmoid(logits) + (1 - y) * jax.nn.log_sigmoid(-logits))
  return jnp.sum(jnp.where(known, per, 0.0)) / jnp.maximum(jnp.sum(known), 1)


def new_probe(cfg: ProbeConfig, seed: int) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
  """(graphdef, params, rest) of a freshly initialised probe; `rest` holds the dropout RNG state."""
  probe = Probe(cfg, rngs=nnx.Rngs(params=seed, dropout=seed + 1))
  return nnx.split(probe, nnx.Param, ...)


def _make_fns(graphdef, tx, pos_weight):

  def loss_fn(params, rest, batch, key):
    probe = nnx.merge(graphdef, params, rest)
    logits = probe(batch["features"], batch["token_mask"], batch["spans"], deterministic=False,
                   rngs=nnx.Rngs(dropout=key))
    return weighted_bce(logits, batch["labels"], pos_weight)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def train_step(params, opt_state, rest, batch, key):
    loss, grads = jax.value_and_grad(loss_fn)(params, rest, batch, key)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return train_step, functools.partial(_predict_batch, StaticGraph(graphdef))


def _predict_batch(graph: StaticGraph, params, rest, batch):
  """P(incorrect) [B, S] of a collated batch through the module-level `score_steps` (compiled once per shape)."""
  return score_steps(graph, (params, rest), batch["features"], batch["token_mask"], batch["spans"])


def predict_examples(graphdef, params, rest, exs: Sequence[Example], batch_size: int, feature_dim: int,
                     predict=None) -> list[np.ndarray]:
  """P(incorrect) per step [S_i] for each example, through `score_steps` (`predict` is a stand-in for it)."""
  if predict is None:
    predict = functools.partial(_predict_batch, StaticGraph(graphdef))
  out = []
  for s in range(0, len(exs), batch_size):
    chunk = exs[s:s + batch_size]
    b = collate(chunk, batch_size, feature_dim)
    p = np.asarray(predict(params, rest, {k: jnp.asarray(v) for k, v in b.items()}))
    out += [p[i, :len(e.spans)] for i, e in enumerate(chunk)]
  return out


def evaluate_examples(scores: Sequence[np.ndarray], exs: Sequence[Example]) -> dict[str, float]:
  y = np.concatenate([e.labels for e in exs]) if exs else np.zeros(0)
  s = np.concatenate(list(scores)) if exs else np.zeros(0)
  return {"pr_auc": pr_auc(y, s), "roc_auc": roc_auc(y, s)}


def train_probe(cfg: ProbeConfig, train: Sequence[Example], val: Sequence[Example], tcfg: ProbeTrainConfig,
                workdir: str, *, on_epoch: Callable[[int, dict], None] | None = None):
  """Trains (or resumes) the probe. Returns (graphdef, best params, rest, history)."""
  if not train:
    raise ConfigError("probe training set is empty")
  if any(e.features.shape[1] != cfg.feature_dim for e in train[:1]):
    raise ConfigError(f"features have {train[0].features.shape[1]} dims, the probe expects {cfg.feature_dim}")
  graphdef, params, rest = new_probe(cfg, tcfg.seed)
  steps_per_epoch = -(-len(train) // tcfg.batch_size)
  total = steps_per_epoch * tcfg.epochs
  warmup = max(int(total * tcfg.warmup_frac), 1)
  schedule = optax.join_schedules([optax.linear_schedule(0.0, tcfg.learning_rate, warmup),
                                   optax.linear_schedule(tcfg.learning_rate, 0.0, max(total - warmup, 1))], [warmup])
  tx = optax.chain(optax.clip_by_global_norm(tcfg.grad_clip),
                   optax.adamw(schedule, weight_decay=tcfg.weight_decay))
  opt_state = tx.init(params)
  train_step, predict = _make_fns(graphdef, tx, tcfg.pos_weight)
  opts = ocp.CheckpointManagerOptions(max_to_keep=1, create=True)
  latest = ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "latest")), options=opts)
  best_mgr = ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "best")), options=opts)
  history: list[dict] = []
  start_epoch, best_score, bad_epochs = 0, -np.inf, 0
  if latest.latest_step() is not None:
    step = latest.latest_step()
    target = {"params": params, "opt_state": opt_state}
    restored = latest.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, target)),
        meta=ocp.args.JsonRestore()))
    params, opt_state = restored["state"]["params"], restored["state"]["opt_state"]
    meta = restored["meta"]
    history, best_score, bad_epochs, start_epoch = (meta["history"], meta["best_score"], meta["bad_epochs"],
                                                    meta["epoch"] + 1)
  feature_dim = cfg.feature_dim
  tb = ScalarWriter(os.path.join(workdir, "tb"))
  for epoch in range(start_epoch, tcfg.epochs):
    if bad_epochs >= tcfg.patience:
      break
    order = np.random.default_rng([tcfg.seed, epoch]).permutation(len(train))
    losses = []
    for k in range(steps_per_epoch):
      chunk = [train[i] for i in order[k * tcfg.batch_size:(k + 1) * tcfg.batch_size]]
      batch = {n: jnp.asarray(v) for n, v in collate(chunk, tcfg.batch_size, feature_dim).items()}
      key = jax.random.fold_in(jax.random.key(tcfg.seed), epoch * steps_per_epoch + k)
      params, opt_state, loss = train_step(params, opt_state, rest, batch, key)
      losses.append(float(loss))
      step = epoch * steps_per_epoch + k + 1
      if step % 10 == 0:
        tb.write(step, {"train/loss": np.mean(losses[-10:]), "train/learning_rate": schedule(step - 1)})
    val_metrics = evaluate_examples(predict_examples(graphdef, params, rest, val, tcfg.batch_size, feature_dim,
                                                     predict), val)
    score = val_metrics["pr_auc"] if np.isfinite(val_metrics["pr_auc"]) else -np.inf
    improved = score > best_score
    best_score = max(best_score, score)
    bad_epochs = 0 if improved else bad_epochs + 1
    entry = {"epoch": epoch, "train_loss": float(np.mean(losses)), **{f"val_{k}": v for k, v in val_metrics.items()},
             "improved": bool(improved)}
    history.append(entry)
    state = {"params": params, "opt_state": opt_state}
    meta = {"history": history, "best_score": float(best_score), "bad_epochs": bad_epochs, "epoch": epoch}
    if improved:
      best_mgr.save(epoch, args=ocp.args.Composite(state=ocp.args.StandardSave({"params": params}),
                                                   meta=ocp.args.JsonSave(meta)))
      best_mgr.wait_until_finished()
    latest.save(epoch, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
    latest.wait_until_finished()
    tb.write((epoch + 1) * steps_per_epoch, {"epoch/train_loss": entry["train_loss"],
                                             **{f"val/{k}": v for k, v in val_metrics.items()}})
    if on_epoch is not None:
      on_epoch(epoch, entry)
  best_params = params
  if best_mgr.latest_step() is not None:
    restored = best_mgr.restore(best_mgr.latest_step(), args=ocp.args.Composite(
        state=ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, {"params": params}))))
    best_params = restored["state"]["params"]
  latest.close()
  best_mgr.close()
  tb.close()
  with open(os.path.join(workdir, "history.json"), "w") as f:
    json.dump(history, f, indent=1)
  return graphdef, best_params, rest, history
