"""Jitted prefill and `lax.while_loop` decoding over a fixed-size KV cache (flax gemma sampler shape).

`extend` appends tokens to a cache (prefill, forced text, one decode step); the decode loop itself and the state
it carries are in `decoding.py`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from reprobe_jax.fields import Int, Real, check_fields
from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.forward import run_decoder
from reprobe_jax.models.kv_cache import KVCache
from reprobe_jax.models.sharding import ShardingCtx
from reprobe_jax.models.xla_options import decode_jit


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to pick tokens. temperature 0 = greedy. top_k 0 = off (static), top_p 1 = off.

  A job config embeds one as its `sampling` field: an error names the field where the config is built
  (`config.trajectories.sampling.top_p: ...`), or `SamplingParams.top_p: ...` when built in code."""

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    check_fields(self, {"temperature": Real(0.0), "top_k": Int(0), "top_p": Real(0.0, 1.0, low_open=True)})

  @property
  def greedy(self) -> bool:
    return self.temperature == 0

  @property
  def filtered(self) -> bool:
    """Whether top-p filtering is on (a static choice: with top_k off and no top-p, no vocabulary sort is made)."""
    return self.top_p < 1


def bucket(n: int, minimum: int = 16) -> int:
  """The smallest power of two >= max(n, minimum): few shapes, so few compilations."""
  b = minimum
  while b < n:
    b *= 2
  return b


def argmax_first(logits):
  """jnp.argmax(logits, -1) (the first index of the maximum; of the first NaN if there is one) as two plain
  reductions, [B, V] -> [B] int32: XLA:CPU runs argmax's paired (value, index) reduction about 1.6x slower over
  SmolLM2's 49k vocabulary (4.2 vs 6.9 ms at batch 32)."""
  top = jnp.max(logits, axis=-1, keepdims=True)  # NaN if any entry is NaN
  hit = (logits == top) | jnp.isnan(logits)
  v = logits.shape[-1]
  return jnp.min(jnp.where(hit, jnp.arange(v, dtype=jnp.int32), v), axis=-1)


def sample_token(logits, rng, temperature, top_p, *, greedy: bool, top_k: int, filtered: bool = True):
  """logits [B, V] float32 -> token ids [B]. Filtering follows HF's TopK then TopP warpers.

  filtered (static) = whether top_p may be below 1; with top_k off and no top-p the categorical draw reads the raw
  scaled logits (no sort of the vocabulary)."""
  if greedy:
    return argmax_first(logits)
  scaled = logits / jnp.maximum(temperature, 1e-6)
  if not top_k and not filtered:
    return jax.random.categorical(rng, scaled, axis=-1).astype(jnp.int32)
  k = top_k if top_k else logits.shape[-1]
  vals, idx = jax.lax.top_k(scaled, k)  # [B, k], sorted descending
  probs = jax.nn.softmax(vals, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  keep = (mass_before < top_p) | (jnp.arange(k) == 0)
  vals = jnp.where(keep, vals, -jnp.inf)
  choice = jax.random.categorical(rng, vals, axis=-1)  # [B]
  return jnp.take_along_axis(idx, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)


def _extend_impl(
  graphdef,
  params,
  cache: KVCache,
  input_ids,
  attention_mask,
  *,
  capture: CaptureSpec = CaptureSpec(),
  shard: ShardingCtx | None = None,
  lockstep: bool = False,
  last_only: bool = False,
):
  """Appends [B, T] tokens (left-padded: mask 0 = padding) to each row of `cache` (donated).

  Each row writes its real tokens at its own next slots (`cache.index [B]`), so rows append different counts and
  a row with none is untouched (no holes). lockstep=True (a prefill of rows that all stand at the same slot) writes
  the whole block, padding included, as one slice at that slot instead. Returns (logits [B, T, V], captured dict,
  new cache); a row without room for its tokens must be excluded by the caller (its writes would be dropped).
  """
  t = input_ids.shape[1]
  mask = attention_mask.astype(bool)
  rank = jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1  # [B, T] index of each real token among its row's
  positions = cache.positions[:, None] + jnp.maximum(rank, 0)
  if lockstep:
    start = cache.index[0]
    valid = jax.lax.dynamic_update_slice_in_dim(cache.valid, mask, start, axis=1)
    slots, new_index = None, cache.index + t
  else:
    slots = jnp.where(mask, cache.index[:, None] + rank, cache.size)  # [B, T]; padding -> out of range (dropped)
    valid = jax.vmap(lambda v, sl: v.at[sl].set(True, mode="drop"))(cache.valid, slots)
    start, new_index = 0, cache.index + jnp.sum(mask, axis=1, dtype=jnp.int32)
  logits, kv, captured = run_decoder(
    graphdef,
    params,
    input_ids,
    positions,
    valid,
    kv_caches=cache.layers(),
    write_index=start,
    write_slots=slots,
    capture=capture,
    shard=shard,
    prefix=cache.prefix_view(),
    last_only=last_only,
  )
  new_cache = cache.replace(
    k=tuple(k for k, _ in kv),
    v=tuple(v for _, v in kv),
    valid=valid,
    positions=cache.positions + jnp.sum(mask, axis=1, dtype=jnp.int32),
    index=new_index,
  )
  return logits, captured, new_cache


extend, extend_in_jit = decode_jit(
  static_argnames=("graphdef", "capture", "shard", "lockstep", "last_only"), donate_argnames=("cache",)
)(_extend_impl)
