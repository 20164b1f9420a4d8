"""The policy loss (docs/method.md §B2: DAPO's clipped objective, token-mean) and the jitted policy update.

`policy_loss` is a pure function of per-token log-probabilities; `make_update` builds one compiled step that splits
the batch into micro-batches, accumulates their gradients in a `lax.scan` and applies one optimiser update. Every
micro-batch's loss is divided by the whole batch's token (or row) count, so the micro-batch losses and gradients sum
to exactly the big batch's (verl #5625 divided each micro-batch by its own count). With a mesh the batch is split
along its rows over the mesh's 'data' axis and the parameters are replicated: data parallel, XLA adds the gradient
all-reduce. Nothing depends on parameter values or counts at trace time, so a steady-state loop compiles once.
`update_core` and `chunked_logprobs` are the pure parts that `rl/update.py` composes into one program per RL step.
"""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import Array, Float

from reprobe_jax.fields import Int, OneOf, Real, check_fields
from reprobe_jax.errors import ConfigError, shape_errors
from reprobe_jax.models.logprob import sequence_logprobs
from reprobe_jax.models.sharding import DEFAULT_RULES, ShardingCtx
from reprobe_jax.rl.types import PolicyBatch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean")
LOG_RATIO_CLAMP = 20.0  # |log r| is clamped here before exp (as verl does): exp(20) ~ 5e8 stays finite


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """DAPO's clip range (r in [1 - clip_low, 1 + clip_high]), how token losses are averaged, and the weight of a k3
  KL penalty to the reference policy (0 = none, docs/method.md §B2's setting).

  aggregation 'token-mean' (DAPO, docs/method.md §B2): summed token losses / response tokens of the whole batch;
  'seq-mean-token-mean' (GRPO): each row's mean over its tokens, summed / rows of the whole batch."""

  clip_low: float = 0.2
  clip_high: float = 0.28
  aggregation: str = "token-mean"
  kl_coef: float = 0.0

  def __post_init__(self):
    check_fields(
      self,
      {
        "clip_low": Real(0.0, 1.0, high_open=True),
        "clip_high": Real(0.0),
        "aggregation": OneOf(AGGREGATIONS),
        "kl_coef": Real(0.0),
      },
    )


@struct.dataclass
class LossSums:
  """Additive statistics of one (micro-)batch: summed over its tokens, so micro-batches add up to the batch's.

  pg_loss, kl_loss: the policy-gradient and KL terms' shares of the loss (already divided by the whole batch's
  count, so they add up to the batch loss). tokens: response tokens (sum of the mask). clipped: tokens whose clipped
  branch is the active one (no gradient flows through them); clipped_low / clipped_high: of those, r < 1 (A < 0)
  and r > 1 (A > 0). ratio: sum of r. kl: sum of k3 = exp(ref - logp) - (ref - logp) - 1 (0 without a reference).
  approx_kl_old: sum of old_logp - logp (k1 estimate of KL(old || new)). Divide by `tokens` for means."""

  pg_loss: jax.Array
  kl_loss: jax.Array
  tokens: jax.Array
  clipped: jax.Array
  clipped_low: jax.Array
  clipped_high: jax.Array
  ratio: jax.Array
  kl: jax.Array
  approx_kl_old: jax.Array

  @classmethod
  def zeros(cls) -> "LossSums":
    return cls(**{f.name: jnp.zeros((), jnp.float32) for f in dataclasses.fields(cls)})

  def __add__(self, other: "LossSums") -> "LossSums":
    return jax.tree.map(jnp.add, self, other)


def _aggregate(per_token, mask, cfg: LossConfig, n_tokens, n_seqs):
  """The batch-normalised sum of [B, T] token values under `mask` (LossConfig.aggregation), a scalar."""
  if cfg.aggregation == "token-mean":
    return jnp.sum(per_token * mask) / jnp.maximum(n_tokens, 1)
  row_tokens = jnp.sum(mask, axis=1)  # [B]
  row_mean = jnp.sum(per_token * mask, axis=1) / jnp.maximum(row_tokens, 1.0)
  return jnp.sum(row_mean) / jnp.maximum(n_seqs, 1)


def policy_loss(logp, old_logp, adv, mask, cfg: LossConfig, n_tokens, n_seqs, ref_logp=None):
  """DAPO's clipped surrogate (docs/method.md §B2): per token -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A),
  r = exp(logp - old_logp), plus kl_coef * k3(ref || policy) when kl_coef > 0; aggregated by cfg.aggregation.

  logp, old_logp, adv, mask, ref_logp: [B, T] (mask float, 1 on trained response tokens). n_tokens / n_seqs: the
  WHOLE batch's response tokens / real rows (traced scalars), which divide a micro-batch's sums so that micro-batch
  losses add up to the batch loss. Returns (loss scalar, LossSums).
  """
  if cfg.kl_coef > 0 and ref_logp is None:
    raise ConfigError(f"LossConfig.kl_coef={cfg.kl_coef} needs ref_logp (the reference policy's log-probabilities)")
  with shape_errors("policy_loss: logp, old_logp, adv, mask (and ref_logp) must be one [B, T]"):
    chex.assert_rank(logp, 2)
    chex.assert_equal_shape([logp, old_logp, adv, mask] + ([] if ref_logp is None else [ref_logp]))
  mask = mask.astype(jnp.float32)
  on = mask > 0
  log_ratio = jnp.where(on, jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), 0.0)  # [B, T]
  ratio = jnp.exp(log_ratio)
  pg1 = -adv * ratio
  pg2 = -adv * jnp.clip(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
  per_token = jnp.maximum(pg1, pg2)  # [B, T]
  clipped = on & (pg2 > pg1)
  pg_loss = _aggregate(per_token, mask, cfg, n_tokens, n_seqs)
  if ref_logp is None:
    kl = jnp.zeros_like(per_token)
  else:
    d = jnp.where(on, jnp.clip(ref_logp - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), 0.0)
    kl = jnp.exp(d) - d - 1.0  # k3: unbiased for KL(policy || ref) under policy samples, never negative
  kl_loss = cfg.kl_coef * _aggregate(kl, mask, cfg, n_tokens, n_seqs) if cfg.kl_coef > 0 else jnp.zeros(())
  f32 = lambda x: jnp.sum(x * mask).astype(jnp.float32)  # noqa: E731
  sums = LossSums(
    pg_loss=pg_loss.astype(jnp.float32),
    kl_loss=jnp.asarray(kl_loss, jnp.float32),
    tokens=jnp.sum(mask),
    clipped=f32(clipped),
    clipped_low=f32(clipped & (ratio < 1.0)),
    clipped_high=f32(clipped & (ratio > 1.0)),
    ratio=f32(ratio),
    kl=f32(kl),
    approx_kl_old=f32(-log_ratio),
  )
  return pg_loss + kl_loss, sums


# ------------------------------------------------------------------------------------------------ log-probabilities


def _response_logprobs(graphdef, params, tokens, attention_mask, response_mask, shard):
  """[B, P + T] sequences -> [B, T] log p of each response token (column P + t), 0 off response_mask."""
  t = response_mask.shape[1]
  lp = sequence_logprobs(graphdef, params, tokens, attention_mask, shard=shard)  # [B, P + T]
  return jnp.where(response_mask > 0, lp[:, -t:], 0.0)  # [B, T]


def response_logprobs(graphdef, params, batch: PolicyBatch, shard: ShardingCtx | None = None) -> Float[Array, "b t"]:
  """log p(response token t | prompt, response[<t]) under `params`, [B, T] float32, 0 off batch.response_mask;
  pure and differentiable (the prompt's own tokens are read but not scored)."""
  return _response_logprobs(graphdef, params, batch.tokens, batch.attention_mask, batch.response_mask, shard)


@jax.jit
def batch_counts(batch: PolicyBatch):
  """(n_tokens, n_seqs) of a whole batch as float32 device scalars: its response tokens, and its rows that hold
  at least one (batch-padding rows have none). What `update` divides by."""
  m = batch.response_mask.astype(jnp.float32)
  return jnp.sum(m), jnp.sum(jnp.any(m > 0, axis=1).astype(jnp.float32))


# ------------------------------------------------------------------------------------------------ compiled steps


def _data_parallel(mesh: Mesh | None, where: str):
  """(ShardingCtx that puts the batch axis on 'data' and replicates everything else, row sharding, replicated)."""
  if mesh is None:
    return None, None, None
  if "data" not in mesh.shape:
    raise ConfigError(f"{where}.mesh: expected a mesh with a 'data' axis, got axes {tuple(mesh.shape)}")
  rules = tuple((name, "data" if name == "batch" else None) for name, _ in DEFAULT_RULES)
  return ShardingCtx(mesh, rules), NamedSharding(mesh, P("data")), NamedSharding(mesh, P())


def _check_micro(where: str, m) -> None:
  if not Int(1).ok(m):
    raise ConfigError(f"{where}.micro_batches: expected {Int(1)}, got {m!r}")


def _micro_split(tree, m: int, mesh: Mesh | None, axes: tuple[str, ...] = ("data",)):
  """Leaves [B, ...] -> [m, B / m, ...]; micro-batch i holds rows i, i + m, i + 2m, ... so that rows sharded in
  contiguous blocks over the mesh's batch `axes` stay on their device (a strided split is a local reshape)."""

  def split(x):
    b = x.shape[0]
    if b % m:
      raise ConfigError(f"micro_batches={m} must divide the batch of {b} rows")
    y = jnp.swapaxes(x.reshape(b // m, m, *x.shape[1:]), 0, 1)
    if mesh is not None:
      n = int(np.prod([mesh.shape[a] for a in axes]))
      if (b // m) % n:
        raise ConfigError(
          f"micro-batches of {b // m} rows do not split over the mesh's {'x'.join(axes)} axes of "
          f"{n} devices (batch {b}, micro_batches={m})"
        )
      y = jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P(None, axes if len(axes) > 1 else axes[0])))
    return y

  return jax.tree.map(split, tree)


def _micro_merge(x):
  """[m, B / m, ...] -> [B, ...], inverting `_micro_split`."""
  return jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:])


def update_core(
  graphdef, tx, cfg: LossConfig, *, micro_batches: int, shard=None, mesh=None, axes=("data",), unroll: bool = False
):
  """The pure `update(params, opt_state, batch, n_tokens, n_seqs, fresh=None) -> (params, opt_state, metrics)` that
  `make_update` jits and `update.make_step_update` scans over mini-batches. `fresh` (a traced bool, or None): where
  True the batch's old log-probabilities are the current parameters' own, read from this forward (stop_gradient)
  instead of `batch.old_logprobs` (the first mini-batch of a step, whose parameters are still the rollout's).
  unroll: the micro-batch loop unrolled (the same values; XLA's cost analysis counts a loop's body once, so
  `update.update_flops` counts an unrolled twin)."""

  def micro_loss(params, mb: PolicyBatch, n_tokens, n_seqs, fresh):
    lp = response_logprobs(graphdef, params, mb, shard)
    old = mb.old_logprobs if fresh is None else jnp.where(fresh, jax.lax.stop_gradient(lp), mb.old_logprobs)
    ref = mb.ref_logprobs if cfg.kl_coef > 0 else None
    return policy_loss(lp, old, mb.advantages, mb.response_mask, cfg, n_tokens, n_seqs, ref)

  grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

  def update(params, opt_state, batch: PolicyBatch, n_tokens, n_seqs, fresh=None):
    batch.check()  # at trace time: shapes are static
    micro = _micro_split(batch, micro_batches, mesh, axes)

    def body(carry, mb):
      grads, loss, sums = carry
      (mb_loss, mb_sums), g = grad_fn(params, mb, n_tokens, n_seqs, fresh)
      grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g)
      return (grads, loss + mb_loss.astype(jnp.float32), sums + mb_sums), None

    zero = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    init = (zero, jnp.zeros((), jnp.float32), LossSums.zeros())
    (grads, loss, sums), _ = jax.lax.scan(body, init, micro, unroll=micro_batches if unroll else 1)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    grad_norm = optax.global_norm(grads)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    tok = jnp.maximum(sums.tokens, 1.0)
    metrics = {
      "loss": loss,
      "pg_loss": sums.pg_loss,
      "kl_loss": sums.kl_loss,
      "clip_frac": sums.clipped / tok,
      "clip_frac_low": sums.clipped_low / tok,
      "clip_frac_high": sums.clipped_high / tok,
      "ratio_mean": sums.ratio / tok,
      "kl_mean": sums.kl / tok,
      "approx_kl_old": sums.approx_kl_old / tok,
      "grad_norm": grad_norm.astype(jnp.float32),
      "tokens": sums.tokens,
    }
    return params, opt_state, metrics

  return update


def make_update(
  graphdef, tx: optax.GradientTransformation, cfg: LossConfig, *, micro_batches: int, mesh: Mesh | None = None
):
  """A jitted `update(params, opt_state, batch: PolicyBatch, n_tokens, n_seqs) -> (params, opt_state, metrics)`.

  The batch's B rows are split into `micro_batches` equal micro-batches (B divisible by it); a `lax.scan` sums their
  gradients (in float32) and one `tx.update` applies them. n_tokens / n_seqs: the whole batch's counts as device
  scalars (`batch_counts`); pass the same kind of value every call (a Python int and an array compile apart).
  params and opt_state are donated (pass a copy of params that are still needed, e.g. `jax.tree.map(jnp.copy,
  lm.params)`). metrics (float32 device scalars): loss, pg_loss, kl_loss, clip_frac, clip_frac_low,
  clip_frac_high, ratio_mean, kl_mean, approx_kl_old (means over the batch's tokens), grad_norm (of the summed
  gradient, before anything `tx` does), tokens. `graphdef`: the module's graphdef or `LanguageModel.static_graph`,
  closed over. With `mesh` (axes from `reprobe_jax.models.make_mesh`, so Auto): rows sharded over 'data', params and
  opt_state replicated, every B / micro_batches divisible by the data axis.
  """
  _check_micro("make_update", micro_batches)
  shard, rows, repl = _data_parallel(mesh, "make_update")
  update = update_core(graphdef, tx, cfg, micro_batches=micro_batches, shard=shard, mesh=mesh)

  def fn(params, opt_state, batch: PolicyBatch, n_tokens, n_seqs):
    return update(params, opt_state, batch, n_tokens, n_seqs)

  if mesh is None:
    return jax.jit(fn, donate_argnums=(0, 1))
  shardings = (repl, repl, rows, repl, repl)
  return _placing(
    jax.jit(fn, donate_argnums=(0, 1), in_shardings=shardings, out_shardings=(repl, repl, repl)), shardings
  )


def chunked_logprobs(
  graphdef,
  params,
  tokens,
  attention_mask,
  response_mask,
  *,
  chunks: int,
  shard=None,
  mesh=None,
  axes=("data",),
  unroll: bool = False,
):
  """`response_logprobs` of [B, ...] rows, `chunks` strided row-slices at a time (`_micro_split`) through a
  `lax.scan` so that only one slice's logits are live; no gradient. Returns [B, T]."""
  micro = _micro_split((tokens, attention_mask, response_mask), chunks, mesh, axes)
  step = lambda _, x: (None, _response_logprobs(graphdef, params, *x, shard))  # noqa: E731
  _, lp = jax.lax.scan(step, None, micro, unroll=chunks if unroll else 1)  # [chunks, B / chunks, T]
  return jax.lax.stop_gradient(_micro_merge(lp))


def make_logprobs(graphdef, *, micro_batches: int, mesh: Mesh | None = None):
  """A jitted `logprobs(params, tokens, attention_mask, response_mask) -> [B, T]`: `response_logprobs` of a whole
  batch (old or reference log-probabilities; no gradient is taken), `micro_batches` rows-slices at a time
  (`chunked_logprobs`) so that only one micro-batch's logits are live. Shapes as in PolicyBatch; with `mesh` the
  rows are sharded over 'data' (in and out) and params replicated, as in `make_update`."""
  _check_micro("make_logprobs", micro_batches)
  shard, rows, repl = _data_parallel(mesh, "make_logprobs")

  def logprobs(params, tokens, attention_mask, response_mask):
    return chunked_logprobs(
      graphdef, params, tokens, attention_mask, response_mask, chunks=micro_batches, shard=shard, mesh=mesh
    )

  if mesh is None:
    return jax.jit(logprobs)
  shardings = (repl, rows, rows, rows)
  return _placing(jax.jit(logprobs, in_shardings=shardings, out_shardings=rows), shardings)


def _placing(jitted, shardings):
  """`jitted` with each argument first put on its sharding (a no-op for arrays already there).

  jit traces an argument's mesh into its type: a single-device array and the mesh-replicated one the first call
  returns are different types, so without this the second call (fed the first one's outputs) would compile the
  whole step again. `_cache_size` and `lower` are the jitted function's."""

  @functools.wraps(jitted)
  def call(*args):
    return jitted(*(jax.device_put(a, s) for a, s in zip(args, shardings)))

  call._cache_size = jitted._cache_size
  call.lower = lambda *args: jitted.lower(*(jax.device_put(a, s) for a, s in zip(args, shardings)))
  return call
