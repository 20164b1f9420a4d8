"""Pure, jit-compiled functions of (graphdef, params, inputs): the functional core under `LanguageModel`.

The module is split once (`nnx.split`) by the caller; each function merges inside the trace, runs the decoder under
`nnx.capture` so that `sow`n values come back as outputs, and assembles them into arrays.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.sharding import ShardingCtx


class StaticGraph:
  """A graphdef as a jit static argument whose hash is computed once.

  jit hashes static arguments on every call; hashing a model's graphdef walks the whole module tree (about 3 ms
  for a 30-layer model, paid on each prefill or generate call). `LanguageModel` wraps its graphdef once; equal
  graphdefs still compare equal, so two loads of one model share compiled code.
  """

  __slots__ = ("value", "_hash")

  def __init__(self, value):
    self.value = value
    self._hash = hash(value)

  def __hash__(self):
    return self._hash

  def __eq__(self, other):
    return isinstance(other, StaticGraph) and (self.value is other.value or self.value == other.value)


def positions_from_mask(attention_mask):
  """HF generate's position ids: cumsum(mask) - 1, clipped at 0 for padding. [B, T] -> [B, T] int32."""
  pos = jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1
  return jnp.maximum(pos, 0)


def logit_stats(logits, next_ids, capture: CaptureSpec):
  """Top-K probabilities, log p of the next token, and entropy from float32 logits [B, T, V].

  next_ids [B, T]: the token that follows each position (ignored where `next_valid` is False).
  """
  out = {}
  if not (capture.top_k_probs or capture.token_stats):
    return out
  # One logsumexp and reductions over the raw logits: no [B, T, V] log-softmax is materialised (on CPU that
  # array's writes and re-reads cost more than the statistics themselves).
  z = logits.astype(jnp.float32)
  lse = jax.nn.logsumexp(z, axis=-1)  # [B, T]
  if capture.top_k_probs:
    top_z, top_ids = jax.lax.top_k(z, capture.top_k_probs)
    out["top_probs"] = jnp.exp(top_z - lse[..., None])  # [B, T, K]
    if capture.top_k_ids:
      out["top_ids"] = top_ids.astype(jnp.int32)  # [B, T, K]
  if capture.token_stats:
    out["token_logprobs"] = jnp.take_along_axis(z, next_ids[..., None], axis=-1)[..., 0] - lse  # [B, T]
    p = jnp.exp(z - lse[..., None])
    out["token_entropy"] = lse - jnp.sum(p * z, axis=-1)  # -sum p log p with log p = z - lse
    out["token_self_certainty"] = lse - jnp.log(z.shape[-1]) - jnp.mean(z, axis=-1)  # KL(U || p) = -log V - mean log p
  return out


def collect_intermediates(inter: nnx.State, num_layers: int, capture: CaptureSpec):
  """Sown values -> {'hidden_states': {i: [B, T, D]}, 'attn_window': [B, T, L, H, W]}."""
  flat = {tuple(str(p) for p in path): var.get_value() for path, var in nnx.to_flat_state(inter)}
  out = {"hidden_states": {i: flat[(f"hidden_{i}",)][-1] for i in capture.resolve_layers(num_layers)}}
  if capture.attn_window:
    wins = [flat[("layers", str(i), "self_attn", "attn_window")][-1] for i in range(num_layers)]
    out["attn_window"] = jnp.stack(wins, axis=2)  # [B, T, L, H, W]
  return out


def run_decoder(
  graphdef,
  params,
  input_ids,
  positions,
  key_valid,
  *,
  kv_caches=None,
  write_index=0,
  write_slots=None,
  capture: CaptureSpec,
  shard: ShardingCtx | None,
  prefix=None,
  last_only: bool = False,
):
  """Merges the module and runs it, capturing intermediates. Returns logits, new caches, captured dict.
  `prefix`: a shared read-only context (`KVCache.prefix_view()`), or None. last_only: logits [B, 1, V] of the last
  position only (`Decoder.__call__`)."""
  model = nnx.merge(graphdef.value if isinstance(graphdef, StaticGraph) else graphdef, params)

  def call(m, *args):
    return m(
      *args,
      kv_caches=kv_caches,
      write_index=write_index,
      write_slots=write_slots,
      capture=capture,
      shard=shard,
      prefix=prefix,
      last_only=last_only,
    )

  if capture.hidden_layers or capture.attn_window:
    (logits, caches), inter = nnx.capture(call, nnx.Intermediate)(model, input_ids, positions, key_valid)
    captured = collect_intermediates(inter, model.config.num_layers, capture)
  else:
    logits, caches = call(model, input_ids, positions, key_valid)
    captured = {"hidden_states": {}}
  return logits, caches, captured


@functools.partial(jax.jit, static_argnames=("graphdef", "capture", "shard"))
def forward(
  graphdef, params, input_ids, attention_mask, position_ids, *, capture: CaptureSpec, shard: ShardingCtx | None = None
):
  """Full forward over [B, T] tokens; returns a dict of ForwardOutput fields."""
  key_valid = attention_mask.astype(bool)
  logits, _, captured = run_decoder(graphdef, params, input_ids, position_ids, key_valid, capture=capture, shard=shard)
  next_ids = jnp.concatenate([input_ids[:, 1:], jnp.zeros_like(input_ids[:, :1])], axis=1)
  next_valid = jnp.concatenate([key_valid[:, 1:], jnp.zeros_like(key_valid[:, :1])], axis=1)
  stats = logit_stats(logits, next_ids, capture)
  if "token_logprobs" in stats:  # the last position (and any before padding) has no next token
    stats["token_logprobs"] = jnp.where(next_valid, stats["token_logprobs"], 0.0)
  return {"logits": logits, **captured, **stats}
