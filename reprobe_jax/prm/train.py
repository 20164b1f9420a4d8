"""The PRM trained here (docs/method.md §A7): the Qwen2.5-Math-PRM shape initialised from the target's own weights
(`model.from_target`: the backbone a copy of the target without its LM head, the head random), fine-tuned on the
rule-labelled trajectories the probe learns from, with the shared `Trainer` (AdamW, warm-up then cosine decay,
orbax checkpoints, exact resume, early stopping on the validation step PR-AUC).

Loss: at each step's separator the head gives logits z [2] (index 1 = correct); the label y (1.0 = incorrect,
0.0 = correct, NaN = unknown) asks for class 1 - y. The two-class cross-entropy is the binary one of z0 - z1
(log softmax(z)[0] = log sigmoid(z0 - z1)), so the loss is the probe's `weighted_bce` of z0 - z1: the mean over
known labels of pos_weight * CE for an incorrect step and CE for a correct one; unknown labels, steps without tokens
and padding are masked out.

A training folder holds `train/` (the trainer's checkpoints and TensorBoard), `history.json` and `model/` (the
trained PRM in the upstream layout, `save_prm`; `load_prm(<folder>/model)` reads it; its config.json records under
`prm_training` the target's model fingerprint, the PRMTrainConfig and the data key). A finished folder is reused
(and refused when it was trained for another target, config or data); an interrupted one resumes.

Batches: every trajectory's prompt (left-padded), response tokens and step spans padded on the host, once, to one
shape for the whole training run (one compile); scoring groups trajectories by their bucketed lengths, so a split
compiles a few shapes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np
from absl import logging

from reprobe_jax.fields import SEED, Int, OneOf, Real, check_fields, field_name
from reprobe_jax.errors import CheckpointError, ConfigError
from reprobe_jax.features import model_fingerprint
from reprobe_jax.eval.metrics import pr_auc, roc_auc
from reprobe_jax.models import LanguageModel
from reprobe_jax.models.sampling import bucket
from reprobe_jax.prm.model import (
  PRM,
  QWEN_SEPARATOR,
  from_target,
  load_prm,
  rewards,
  save_prm,
  separator_token_id,
  step_logits,
  valid_spans,
)
from reprobe_jax.probe.train import weighted_bce
from reprobe_jax.io.readers import read_json
from reprobe_jax.io.seal import check_folder
from reprobe_jax.io.atomic import write_json
from reprobe_jax.train.optimizer import OptimizerConfig, make_optimizer
from reprobe_jax.train.trainer import Trainer, TrainerConfig
from reprobe_jax.trajectories import Trajectory

MODEL = "model"  # the trained PRM's folder inside a training folder (load_prm reads it)
HISTORY = "history.json"


@dataclasses.dataclass(frozen=True)
class PRMTrainConfig:
  """How the PRM is trained. separator: the token string appended after each step (the tokenizer must have it as
  one token); pos_weight: the loss weight of an incorrect step (a correct one weighs 1); train_backbone: fine-tune
  the whole backbone (the paper's PRMs are fully trained) or, False, the head only on the frozen target;
  optimizer: a cosine decay to 0 after a warmup of 10% of the steps."""

  separator: str = QWEN_SEPARATOR
  optimizer: OptimizerConfig = OptimizerConfig(
    learning_rate=1e-4, schedule="cosine", warmup_frac=0.1, weight_decay=0.01, grad_clip=1.0
  )
  batch_size: int = 16
  epochs: int = 3
  patience: int = 2
  pos_weight: float = 1.0
  seed: int = 0
  train_backbone: bool = True

  def __post_init__(self):
    if not isinstance(self.separator, str) or not self.separator:
      raise ConfigError(f"{field_name(self, 'separator')}: expected a non-empty token string, got {self.separator!r}")
    check_fields(
      self,
      {
        "batch_size": Int(1),
        "epochs": Int(1),
        "patience": Int(1),
        "pos_weight": Real(0.0, low_open=True),
        "seed": SEED,
        "train_backbone": OneOf((True, False)),
      },
    )


# ------------------------------------------------------------------------------------------------ batches


def _shape(trajs: Sequence[Trajectory], quantum: int = 0) -> tuple[int, int, int]:
  """(prompt, response, steps) lengths of the longest: power-of-two buckets, or with `quantum` the prompt and
  response rounded up to a multiple of it (for one shape that must fit a whole run, not few shapes)."""

  def up(n: int, minimum: int) -> int:
    return bucket(n, minimum) if not quantum else max(-(-n // quantum) * quantum, quantum)

  longest = [max([len(getattr(r, k)) for r in trajs] + [1]) for k in ("prompt_ids", "response_ids", "steps")]
  return up(longest[0], 16), up(longest[1], 16), bucket(longest[2], minimum=4)


def pad_batch(
  trajs: Sequence[Trajectory], rows: int, shape: tuple[int, int, int], *, labels: bool = True
) -> dict[str, np.ndarray]:
  """Host arrays of `rows` rows at `shape` (prompt Tp, response T, steps S): prompt_ids / prompt_mask [rows, Tp]
  (left-padded), tokens [rows, T], spans [rows, S, 2], labels [rows, S] (NaN = unknown, padding, a step without
  tokens; only with `labels`). Rows past the trajectories are all padding (no prompt, no steps)."""
  tp, t, s = shape
  out = {
    "prompt_ids": np.zeros((rows, tp), np.int32),
    "prompt_mask": np.zeros((rows, tp), bool),
    "tokens": np.zeros((rows, t), np.int32),
    "spans": np.zeros((rows, s, 2), np.int32),
  }
  if labels:
    out["labels"] = np.full((rows, s), np.nan, np.float32)
  for i, r in enumerate(trajs):
    n, m, k = len(r.prompt_ids), len(r.response_ids), len(r.steps)
    out["prompt_ids"][i, tp - n :], out["prompt_mask"][i, tp - n :] = r.prompt_ids, True
    out["tokens"][i, :m] = r.response_ids
    if k:
      out["spans"][i, :k] = r.spans
    if labels:
      lab = r.label_array()
      lab[out["spans"][i, :k, 1] <= out["spans"][i, :k, 0]] = np.nan  # a step without tokens has no label
      out["labels"][i, :k] = lab
  return out


def _groups(trajs: Sequence[Trajectory], batch_size: int) -> list[tuple[list[int], tuple[int, int, int]]]:
  """Batches of trajectory indices for scoring, each with its shape: trajectories grouped by their bucketed prompt
  and response lengths (steps bucketed over all), so a split compiles a few shapes, not one per batch."""
  s = _shape(trajs)[2]
  by: dict[tuple[int, int, int], list[int]] = {}
  for i, r in enumerate(trajs):
    tp, t, _ = _shape([r])
    by.setdefault((tp, t, s), []).append(i)
  return [(idx[a : a + batch_size], key) for key, idx in sorted(by.items()) for a in range(0, len(idx), batch_size)]


def prm_scores(prm: PRM, trajs: Sequence[Trajectory], batch_size: int) -> list[np.ndarray]:
  """Per trajectory, [num_steps] 1 - P(step correct) (higher = more likely incorrect, like every scorer; NaN for a
  step without tokens): batches of `batch_size` rows grouped by bucketed lengths, one jitted `rewards` call each."""
  out: list[np.ndarray] = [np.zeros(0, np.float32)] * len(trajs)
  for idx, shape in _groups(trajs, batch_size):
    b = pad_batch([trajs[i] for i in idx], batch_size, shape, labels=False)
    r = np.asarray(rewards(prm, *(jnp.asarray(b[k]) for k in ("prompt_ids", "prompt_mask", "tokens", "spans"))))
    for j, i in enumerate(idx):
      out[i] = (1.0 - r[j, : len(trajs[i].steps)]).astype(np.float32)
  return out


# ------------------------------------------------------------------------------------------------ loss


def step_loss(logits, labels, pos_weight: float):
  """The PRM's loss (module docstring): logits [..., 2] (index 1 = correct) at each step's separator, labels [...]
  (1.0 = incorrect, 0.0 = correct, NaN = masked); the mean over known labels of the class-weighted cross-entropy."""
  return weighted_bce(logits[..., 0] - logits[..., 1], labels, pos_weight)


def prm_loss(template: PRM, pos_weight: float, train_backbone: bool):
  """loss(trainable, batch, key, frozen) for the Trainer: trainable = {'head', 'backbone'} (or {'head'} with the
  backbone in `frozen`); batch = `pad_batch` arrays. Only the template's static parts are read."""

  def loss(trainable, batch, key, frozen):
    del key  # no dropout
    prm = PRM(
      params=trainable["backbone"] if train_backbone else frozen,
      head=trainable["head"],
      config=template.config,
      graph=template.graph,
      separator_id=template.separator_id,
    )
    logits = step_logits(prm, batch["prompt_ids"], batch["prompt_mask"], batch["tokens"], batch["spans"])
    labels = jnp.where(valid_spans(batch["spans"], batch["tokens"].shape[1]), batch["labels"], jnp.nan)
    return step_loss(logits, labels, pos_weight)

  return loss


# ------------------------------------------------------------------------------------------------ training


def data_key(train: Sequence[Trajectory], val: Sequence[Trajectory]) -> str:
  """16 hex digits of sha256 over what training reads of each trajectory (ids, tokens, spans, labels)."""
  h = hashlib.sha256()
  for split, trajs in (("train", train), ("val", val)):
    for r in trajs:
      lab = [None if np.isnan(v) else float(v) for v in r.label_array()]
      h.update(json.dumps([split, r.id, list(r.prompt_ids), list(r.response_ids), r.spans, lab]).encode())
  return h.hexdigest()[:16]


def split_metrics(scores: Sequence[np.ndarray], trajs: Sequence[Trajectory]) -> dict[str, float]:
  """{'pr_auc', 'roc_auc'} of step scores against the trajectories' labels (positive = incorrect)."""
  y = np.concatenate([r.label_array() for r in trajs] + [np.zeros(0, np.float32)])
  s = np.concatenate(list(scores) + [np.zeros(0, np.float32)])
  y = np.where(np.isnan(s), np.nan, y)  # a step without tokens has no score and no label
  return {"pr_auc": pr_auc(y, s), "roc_auc": roc_auc(y, s)}


def check_separator_for(lm: LanguageModel, cfg: PRMTrainConfig, where: str | None = None) -> int:
  """The id of `cfg.separator` in the target's tokenizer; ConfigError naming `where` (default
  'PRMTrainConfig.separator') when the target has no tokenizer or the tokenizer lacks the token."""
  where = where or field_name(cfg, "separator")
  if lm.tokenizer is None:
    raise ConfigError(f"{where}: the target has no tokenizer to find the separator {cfg.separator!r} in")
  return separator_token_id(lm.tokenizer, cfg.separator, where)


def train_prm(
  lm: LanguageModel,
  cfg: PRMTrainConfig,
  train_trajs: Sequence[Trajectory],
  val_trajs: Sequence[Trajectory],
  workdir: str,
  *,
  on_epoch: Callable[[int, dict], None] | None = None,
) -> PRM:
  """Trains (or resumes, or reuses) the PRM of `workdir` on labelled trajectories of `lm`, early-stopped on the
  validation PR-AUC of 1 - reward; returns the best epoch's PRM (the last epoch's when none had a finite PR-AUC).
  ConfigError for a separator the target's tokenizer lacks (before anything is trained or written);
  CheckpointError for a finished folder trained for another target, config or data."""
  sep = check_separator_for(lm, cfg)
  if not train_trajs:
    raise ConfigError("PRM training set is empty")
  depends = {
    "model_fingerprint": model_fingerprint(lm),
    "train_config": dataclasses.asdict(cfg),
    "data_key": data_key(train_trajs, val_trajs),
  }
  model_dir = os.path.join(workdir, MODEL)
  if os.path.exists(os.path.join(model_dir, "config.json")):
    check_folder(model_dir, "trained PRM")  # this job's own output: every file must match its seal
    stored = read_json(os.path.join(model_dir, "config.json"), "PRM config").get("prm_training")
    if stored != json.loads(json.dumps(depends)):
      raise CheckpointError(
        f"{model_dir}: this PRM was trained with {stored!r}, this run needs {depends!r}; use another workdir"
      )
    return load_prm(model_dir, separator_id=sep, dtype=lm.dtype)

  template = from_target(lm, separator_id=sep, seed=cfg.seed)
  if cfg.train_backbone:
    trainable, frozen = {"backbone": template.params, "head": template.head}, None
  else:
    trainable, frozen = {"head": template.head}, template.params
  n = len(train_trajs)
  steps_per_epoch = -(-n // cfg.batch_size)
  total = steps_per_epoch * cfg.epochs
  tx, schedule = make_optimizer(cfg.optimizer, total)

  # Every training trajectory at one shape, on the host once; a batch is a gather of rows (one compile).
  rows = pad_batch(train_trajs, n + 1, _shape(train_trajs, quantum=16))  # row n: all padding, fills the last batch

  def batch(i: int) -> dict:
    epoch, k = divmod(i, steps_per_epoch)
    order = np.random.default_rng([cfg.seed, epoch]).permutation(n)[k * cfg.batch_size : (k + 1) * cfg.batch_size]
    order = np.concatenate([order, np.full(cfg.batch_size - len(order), n)])
    return {name: jnp.asarray(a[order]) for name, a in rows.items()}

  def as_prm(p) -> PRM:
    return template.replace(params=p["backbone"] if cfg.train_backbone else frozen, head=p["head"])

  def evaluate(p) -> dict[str, float]:
    return split_metrics(prm_scores(as_prm(p), val_trajs, cfg.batch_size), val_trajs)

  def as_epoch(entry: dict) -> dict:
    return {"epoch": entry["step"] // steps_per_epoch - 1, **{k: v for k, v in entry.items() if k != "step"}}

  def report(step: int, entry: dict) -> None:
    if on_epoch is not None:
      on_epoch(as_epoch(entry)["epoch"], as_epoch(entry))

  loop = TrainerConfig(
    steps=total,
    seed=cfg.seed,
    log_every=min(10, steps_per_epoch),
    checkpoint_every=steps_per_epoch,
    eval_every=steps_per_epoch,
    best_metric="pr_auc",
    patience=cfg.patience,
  )
  trainer = Trainer(
    prm_loss(template, cfg.pos_weight, cfg.train_backbone),
    tx,
    loop,
    os.path.join(workdir, "train"),
    learning_rate=schedule,
    evaluate=evaluate,
    on_eval=report,
    signature={"prm_training": depends},
  )
  result = trainer.fit(trainable, batch, frozen=frozen)
  best = result.best_params
  if best is None:
    logging.warning("PRM in %s: no epoch had a finite validation PR-AUC; keeping the last epoch's parameters", workdir)
    best = result.params
  prm = as_prm(best)
  write_json(os.path.join(workdir, HISTORY), [as_epoch(e) for e in result.history], seal=True)
  save_prm(prm, model_dir, tokenizer=lm.tokenizer, separator=cfg.separator, extra={"prm_training": depends})
  return prm


def history(workdir: str) -> list[dict]:
  """The per-epoch history of a finished training folder (train_loss, val_pr_auc, val_roc_auc, improved)."""
  return read_json(os.path.join(workdir, HISTORY), "PRM training history", kind=list, sealed=True)
