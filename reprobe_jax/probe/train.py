"""Probe training (docs/method.md §A5): weighted BCE, AdamW with warm-up and linear decay, early stopping on validation
PR-AUC, orbax checkpoints of the best and the latest epoch, exact resume (the loop is `reprobe_jax.train.trainer`'s).

Determinism: epoch e's batch order comes from (seed, e) and step k's dropout from (seed, k), so a run killed
between epochs and restarted ends with the same parameters and metrics as one that ran through.

Data parallel (`mesh=`, docs/scale.md): each packed batch is split by rows over the mesh's data axis, the parameters
and the optimiser state are replicated, and XLA all-reduces the gradient; the same parameters as on one device
within float tolerance (tests/test_sharded_dp.py).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from reprobe_jax.io.atomic import write_json
from reprobe_jax.fields import SEED, Int, Real, check_fields
from reprobe_jax.errors import ConfigError
from reprobe_jax.eval.metrics import pr_auc, roc_auc
from reprobe_jax.probe.data import Example, pack_shape, pack_steps
from reprobe_jax.models.forward import StaticGraph
from reprobe_jax.models.sharding import ShardingCtx, constrain_rows
from reprobe_jax.probe.model import Probe, ProbeConfig, score_packed
from reprobe_jax.train.optimizer import OptimizerConfig, make_optimizer
from reprobe_jax.train.trainer import Trainer, TrainerConfig


@dataclasses.dataclass(frozen=True)
class ProbeTrainConfig:
  """docs/method.md §A5 defaults; optimizer: a linear decay to 0 after a warmup of 5% of the steps."""

  optimizer: OptimizerConfig = OptimizerConfig(
    learning_rate=5e-4, schedule="linear", warmup_frac=0.05, weight_decay=0.1, grad_clip=1.0
  )
  batch_size: int = 32
  epochs: int = 5
  patience: int = 3
  pos_weight: float = 3.0
  seed: int = 0

  def __post_init__(self):
    check_fields(
      self,
      {
        "batch_size": Int(1),
        "epochs": Int(1),
        "patience": Int(1),
        "pos_weight": Real(0.0, low_open=True),
        "seed": SEED,
      },
    )


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


def sharding_ctx(mesh: Mesh | ShardingCtx | None) -> ShardingCtx | None:
  """The ShardingCtx of a `mesh=` argument: a Mesh (with the default rules), a ShardingCtx, or None (one device)."""
  if mesh is None or isinstance(mesh, ShardingCtx):
    return mesh
  if isinstance(mesh, Mesh):
    return ShardingCtx(mesh)
  raise ConfigError(f"mesh: expected a jax Mesh, a ShardingCtx or None, got {type(mesh).__name__}")


def probe_loss(graphdef, pos_weight: float, shard: ShardingCtx | None = None):
  """loss(params, batch, key, rest): weighted BCE of the probe with dropout drawn from `key` (docs/method.md §A5), over
  the labelled steps of a packed batch (`pack_steps`: features, pack, labels [P]); shard: its rows over the mesh's
  data axis."""

  def loss(params, batch, key, rest):
    probe = nnx.merge(graphdef, params, rest)
    batch = constrain_rows(batch, shard)
    logits = probe.packed(
      batch["features"], batch["pack"], deterministic=False, rngs=nnx.Rngs(dropout=key), shard=shard
    )
    return weighted_bce(logits, batch["labels"], pos_weight)

  return loss


def _predict_batch(graph: StaticGraph, params, rest, features, pack, shard: ShardingCtx | None = None):
  """P(incorrect) [P] of a packed batch through the module-level `score_packed` (compiled once per shape)."""
  return score_packed(graph, (params, rest), features, pack, shard)


def predict_examples(
  graphdef,
  params,
  rest,
  exs: Sequence[Example],
  batch_size: int,
  feature_dim: int,
  predict=None,
  *,
  mesh: Mesh | ShardingCtx | None = None,
) -> list[np.ndarray]:
  """P(incorrect) per step [S_i] for each example (NaN for steps with no tokens), in packed batches of one shape
  through `score_packed` (`predict(params, rest, features, pack)` is a stand-in for it). mesh: each batch's rows
  over its data axis, the parameters replicated."""
  shard = sharding_ctx(mesh)
  if predict is None:
    predict = functools.partial(_predict_batch, StaticGraph(graphdef), shard=shard)
  params, rest = _replicated((params, rest), shard)
  chunks = [exs[s : s + batch_size] for s in range(0, len(exs), batch_size)]
  shape = pack_shape(chunks, batch_size, labelled_only=False)
  out = []
  for chunk in chunks:
    feats, pack, _, chosen = pack_steps(chunk, shape, feature_dim, labelled_only=False)
    p = np.asarray(
      predict(params, rest, *constrain_rows((jnp.asarray(feats), jax.tree.map(jnp.asarray, pack)), shard, put=True))
    )
    scores = [np.full(len(e.spans), np.nan, np.float32) for e in chunk]
    for j, (i, k) in enumerate(chosen):
      scores[i][k] = p[j]
    out += scores
  return out


def _replicated(tree, shard: ShardingCtx | None):
  """The arrays of `tree` whole on every device of the mesh (a probe's parameters); `tree` itself without one."""
  return tree if shard is None else jax.device_put(tree, NamedSharding(shard.mesh, PartitionSpec()))


def evaluate_examples(scores: Sequence[np.ndarray], exs: Sequence[Example]) -> dict[str, float]:
  y = np.concatenate([e.labels for e in exs]) if exs else np.zeros(0)
  s = np.concatenate(list(scores)) if exs else np.zeros(0)
  return {"pr_auc": pr_auc(y, s), "roc_auc": roc_auc(y, s)}


def train_probe(
  cfg: ProbeConfig,
  train: Sequence[Example],
  val: Sequence[Example],
  tcfg: ProbeTrainConfig,
  workdir: str,
  *,
  on_epoch: Callable[[int, dict], None] | None = None,
  mesh: Mesh | ShardingCtx | None = None,
):
  """Trains (or resumes) the probe. Returns (graphdef, best params, rest, history).

  mesh: data parallel over its data axis (each batch's rows split, parameters and optimiser state replicated, the
  gradient all-reduced); the run folder and its checkpoints are the same with or without one.

  The best parameters are those of the epoch with the highest validation PR-AUC; when no epoch has a finite one,
  the last epoch's. A checkpoint folder whose best epoch's checkpoint is gone raises `CheckpointError`.
  """
  if not train:
    raise ConfigError("probe training set is empty")
  if any(e.features.shape[1] != cfg.feature_dim for e in train[:1]):
    raise ConfigError(f"features have {train[0].features.shape[1]} dims, the probe expects {cfg.feature_dim}")
  shard = sharding_ctx(mesh)
  graphdef, params, rest = new_probe(cfg, tcfg.seed)
  params, rest = _replicated((params, rest), shard)
  steps_per_epoch = -(-len(train) // tcfg.batch_size)
  total = steps_per_epoch * tcfg.epochs
  tx, schedule = make_optimizer(tcfg.optimizer, total)
  feature_dim = cfg.feature_dim
  predict = functools.partial(_predict_batch, StaticGraph(graphdef), shard=shard)

  @functools.lru_cache(maxsize=1)
  def epoch_order(epoch: int) -> np.ndarray:
    return np.random.default_rng([tcfg.seed, epoch]).permutation(len(train))

  def chunk(i: int) -> list[Example]:
    epoch, k = divmod(i, steps_per_epoch)
    return [train[j] for j in epoch_order(epoch)[k * tcfg.batch_size : (k + 1) * tcfg.batch_size]]

  # One packed shape for every batch of the run: the training step compiles once.
  shape = pack_shape([chunk(i) for i in range(total)], tcfg.batch_size, labelled_only=True)

  def batch(i: int) -> dict:
    feats, pack, labels, _ = pack_steps(chunk(i), shape, feature_dim, labelled_only=True)
    out = {"features": jnp.asarray(feats), "pack": jax.tree.map(jnp.asarray, pack), "labels": jnp.asarray(labels)}
    return constrain_rows(out, shard, put=True)

  def evaluate(p) -> dict[str, float]:
    return evaluate_examples(
      predict_examples(graphdef, p, rest, val, tcfg.batch_size, feature_dim, predict, mesh=shard), val
    )

  def as_epoch(entry: dict) -> dict:  # the trainer's evaluation entry, numbered by epoch
    return {"epoch": entry["step"] // steps_per_epoch - 1, **{k: v for k, v in entry.items() if k != "step"}}

  def report(step: int, entry: dict) -> None:
    if on_epoch is not None:
      on_epoch(as_epoch(entry)["epoch"], as_epoch(entry))

  loop = TrainerConfig(
    steps=total,
    seed=tcfg.seed,
    checkpoint_every=steps_per_epoch,
    eval_every=steps_per_epoch,
    best_metric="pr_auc",
    patience=tcfg.patience,
  )
  trainer = Trainer(
    probe_loss(graphdef, tcfg.pos_weight, shard),
    tx,
    loop,
    workdir,
    learning_rate=schedule,
    evaluate=evaluate,
    on_eval=report,
    signature={"probe": dataclasses.asdict(cfg), "train": dataclasses.asdict(tcfg)},
  )
  result = trainer.fit(params, batch, frozen=rest)
  history = [as_epoch(e) for e in result.history]
  best_params = result.best_params
  if best_params is None:
    logging.warning(
      "probe in %s: no epoch had a finite validation PR-AUC; returning the last epoch's parameters", workdir
    )
    best_params = result.params
  write_json(os.path.join(workdir, "history.json"), history, seal=True)
  return graphdef, best_params, rest, history
