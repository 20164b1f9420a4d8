"""Attention over a KV cache of slots, with an optional shared read-only prefix and a captured attention window.

Queries sit at slots [write_index, write_index + T) of every row (lockstep: a full forward, a prefill), or at
per-row slots `write_slots [B, T]` (a decode step or forced text, where each row appends at its own length, so rows
that wait leave no holes). Without a cache, S = T and write_index = 0. `AttentionEnv` holds what every layer reads
for one decoder call besides its own input and cache; `Attention.__call__` projects, writes the cache, scores and
mixes, one method each.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from reprobe_jax.kernels import attention as attention_kernels
from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.config import ModelConfig
from reprobe_jax.models.layers import Linear, fused_matmul, norm_for
from reprobe_jax.models.rope import apply_rope


def attention_window(probs, window_idx, window_ok):
  """Reads probabilities [B, H, T, K] at key indices window_idx [B, T, W] -> [B, T, H, W]; 0 where not window_ok.

  The window is by position, not by slot: entry w is the w-th most recent *valid* key at or before the query
  (itself for w = 0), so holes in a cache (padding slots of rows that waited while others decoded, a shared
  prefix cut at a step boundary) do not shift it. Only a [B, H, T, W] gather of the layer's map is kept.
  """
  b, h = probs.shape[:2]
  idx = jnp.broadcast_to(window_idx[:, None], (b, h) + window_idx.shape[1:])  # [B, H, T, W]
  win = jnp.take_along_axis(probs, idx, axis=-1)  # [B, H, T, W]
  win = jnp.where(window_ok[:, None], win, 0.0)
  return jnp.transpose(win, (0, 2, 1, 3))  # [B, T, H, W]


def key_layout(key_valid, q_slots, width: int):
  """Ranks of valid keys and the attention-window gather indices over the key axis (prefix slots first).

  key_valid [B, K] bool (K = prefix slots + own slots); q_slots [B, T] indices of each row's queries in that axis.
  Returns key_rank [B, K] (1-based count of valid keys up to each slot), q_rank [B, T], window_idx [B, T, W],
  window_ok [B, T, W]. Ranks are positions up to a constant, so they also give exact sliding-window distances.
  """
  key_rank = jnp.cumsum(key_valid.astype(jnp.int32), axis=1)  # [B, K]
  q_rank = jnp.take_along_axis(key_rank, jnp.clip(q_slots, 0, key_valid.shape[1] - 1), axis=1)  # [B, T]
  if not width:
    return key_rank, q_rank, None, None
  want = q_rank[:, :, None] - jnp.arange(width)[None, None, :]  # [B, T, W]: rank of the w-th most recent key
  idx = jax.vmap(lambda r, w: jnp.searchsorted(r, w.reshape(-1), side="left").reshape(w.shape))(key_rank, want)
  ok = want >= 1
  return key_rank, q_rank, jnp.clip(idx, 0, key_valid.shape[1] - 1).astype(jnp.int32), ok


@dataclasses.dataclass(frozen=True)
class AttentionEnv:
  """What one layer's attention reads besides its input and its cache, for one decoder call (`AttentionEnv.build`
  once per call, `for_layer` per layer): where the queries write, which keys they see, the window to capture, and
  an optional shared prefix.

  Queries sit at slots write_index + arange(T) of every row (lockstep), or at per-row `write_slots` [B, T]. Ranks
  count the valid keys up to each slot (prefix slots first), so sliding windows and the captured attention window
  go by position, not by slot. The shared prefix: per-layer (k, v) [P, KV, Sp, Dh] read by the R = B // P
  consecutive rows of each prefix row, with its mask [B, T, Sp]."""

  cos: jax.Array | None  # [B, T, Dh] this layer's RoPE (None until `for_layer`)
  sin: jax.Array | None
  mask: jax.Array  # [B, T, S] bool: causal and valid over the own slots
  write_index: Any  # int or [] int32: the lockstep queries' first slot
  write_slots: jax.Array | None  # [B, T] per-row query slots (a slot >= S is padding, written nowhere), or None
  capture: CaptureSpec
  key_rank: jax.Array  # [B, Sp + S] 1-based count of valid keys up to each slot
  q_rank: jax.Array  # [B, T]
  window_idx: jax.Array | None  # [B, T, W] the captured window's key indices (W = capture.attn_window)
  window_ok: jax.Array | None  # [B, T, W]
  prefix_slots: int = 0  # Sp (0: no shared prefix)
  prefix_mask: jax.Array | None = None  # [B, T, Sp]
  prefix_layers: tuple | None = None  # per-layer (k, v) [P, KV, Sp, Dh]
  prefix_kv: tuple | None = None  # this layer's (k, v) (`for_layer`)

  @classmethod
  def build(cls, key_valid, q_slots, prefix, *, write_index, write_slots, capture: CaptureSpec) -> "AttentionEnv":
    """key_valid [B, S] bool; q_slots [B, T] the queries' own slots; prefix: (per-layer (k, v), valid [B, Sp]) or
    None."""
    s, t = key_valid.shape[1], q_slots.shape[1]
    mask = (jnp.arange(s)[None, None, :] <= q_slots[:, :, None]) & key_valid[:, None, :]  # [B, T, S]
    common = dict(cos=None, sin=None, mask=mask, write_index=write_index, write_slots=write_slots, capture=capture)
    width = capture.attn_window
    if prefix is None:
      rank, q_rank, idx, ok = key_layout(key_valid, q_slots, width)
      return cls(key_rank=rank, q_rank=q_rank, window_idx=idx, window_ok=ok, **common)
    layers, prefix_valid = prefix  # prefix_valid [B, Sp]
    sp = prefix_valid.shape[1]
    rank, q_rank, idx, ok = key_layout(jnp.concatenate([prefix_valid, key_valid], axis=1), q_slots + sp, width)
    return cls(
      key_rank=rank,
      q_rank=q_rank,
      window_idx=idx,
      window_ok=ok,
      prefix_slots=sp,
      prefix_mask=jnp.broadcast_to(prefix_valid[:, None, :], (prefix_valid.shape[0], t, sp)),
      prefix_layers=layers,
      **common,
    )

  def for_layer(self, i: int, cos, sin) -> "AttentionEnv":
    """The environment of layer i, whose RoPE is (cos, sin)."""
    kv = None if self.prefix_layers is None else self.prefix_layers[i]
    return dataclasses.replace(self, cos=cos, sin=sin, prefix_kv=kv)


def write_cache(kv_cache, k, v, env: AttentionEnv):
  """The layer's cache (k, v) [B, KV, S, Dh] with the new keys and values [B, KV, T, Dh] written at the queries'
  slots: one slice for every row (lockstep), else each row at its own slots (out-of-range slots, padding, are
  dropped). Without a cache, the new keys and values themselves."""
  if kv_cache is None:
    return k, v
  if env.write_slots is None:  # lockstep: one slice for every row
    k = jax.lax.dynamic_update_slice_in_dim(kv_cache[0], k.astype(kv_cache[0].dtype), env.write_index, axis=2)
    v = jax.lax.dynamic_update_slice_in_dim(kv_cache[1], v.astype(kv_cache[1].dtype), env.write_index, axis=2)
    return k, v
  put = jax.vmap(lambda c, new, sl: c.at[:, sl, :].set(new.astype(c.dtype), mode="drop"))
  return put(kv_cache[0], k, env.write_slots), put(kv_cache[1], v, env.write_slots)


class Attention(nnx.Module):
  def __init__(self, cfg: ModelConfig, layer: int, *, dtype, rngs: nnx.Rngs):
    d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.q_proj = Linear(d, h * hd, ("embed", "heads"), bias=cfg.attention_bias, dtype=dtype, rngs=rngs)
    self.k_proj = Linear(d, kv * hd, ("embed", "kv_heads"), bias=cfg.attention_bias, dtype=dtype, rngs=rngs)
    self.v_proj = Linear(d, kv * hd, ("embed", "kv_heads"), bias=cfg.attention_bias, dtype=dtype, rngs=rngs)
    self.o_proj = Linear(h * hd, d, ("heads", "embed"), bias=False, dtype=dtype, rngs=rngs)
    if cfg.qk_norm:
      self.q_norm = norm_for(cfg)(hd, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
      self.k_norm = norm_for(cfg)(hd, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    else:
      self.q_norm = self.k_norm = None
    self.num_heads, self.num_kv_heads, self.head_dim = h, kv, hd
    self.window = cfg.sliding_windows[layer]
    # Gemma 3 scales by query_pre_attn_scalar ** -0.5, which need not be head_dim ** -0.5.
    self.score_scale = hd**-0.5 if cfg.query_pre_attn_scalar is None else cfg.query_pre_attn_scalar**-0.5
    self.decode_kernels = False  # True in the decode view on CPU (with_packed_weights): the products run in C++
    self.packed_qkv = None  # q, k and v weights side by side, packed, in the decode view on CPU (`fused_matmul`)

  def _kernels_for(self, queries: int, dtype) -> bool:
    return self.decode_kernels and queries <= attention_kernels.MAX_QUERIES and dtype == jnp.float32

  def _qk(self, q, k):
    """q [P, KV, Q, Dh] . k [P, KV, S, Dh] -> float32 scores [P, KV, Q, S]: the CPU kernel in the decode view for a
    few queries, else XLA's batched dot."""
    k = k.astype(q.dtype)
    if not self._kernels_for(q.shape[2], q.dtype):
      return jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32)
    # The cache goes in as it is kept, [B, KV, S, Dh]: reshaped to [B * KV, S, Dh], XLA fused a second copy of the
    # layer's cache write into the reshape and then copied the whole K and V cache of every layer on every batch-1
    # step (tests/test_decoding.py, test_batch_one_decode_copies_no_cache).
    return attention_kernels.decode_qk(q, k)

  def _pv(self, probs, v, dtype):
    """probs [P, KV, Q, S] . v [P, KV, S, Dh] -> [P, KV, Q, Dh] in `dtype`, as `_qk` chooses."""
    probs, v = probs.astype(dtype), v.astype(dtype)
    if not self._kernels_for(probs.shape[2], dtype):
      return jnp.einsum("bkqs,bksd->bkqd", probs, v)
    return attention_kernels.decode_pv(probs, v)

  def __call__(self, x, kv_cache, env: AttentionEnv):
    """x [B, T, D]; kv_cache (k, v) [B, KV, S, Dh] or None; env: this layer's `AttentionEnv`. Returns out [B, T, D]
    and the layer's (k, v) with the new keys written.

    Hydragen-style shared prefix: the queries of a prefix's rows are stacked, so its keys and values are read once
    for all of them, not copied per row. Prefix and own scores share one softmax, which is exact attention over the
    concatenated keys.

    Head-major layout: the query heads that share a KV head are laid out as one [G*T] block, so both attention
    products are plain batched matmuls over (B, KV) and no score-sized transpose is made, forward or backward
    (on CPU the [B, T, KV, G, S] layout spent more time in transposes than in the matmuls). The cache is kept in
    the layout the products read.
    """
    q, k, v = self._project(x, env)
    k, v = write_cache(kv_cache, k, v, env)
    probs = self._probs(q, k, env)  # [B, KV, G, T, Sp + S]
    if env.capture.attn_window:
      b, t = x.shape[:2]
      win = attention_window(probs.reshape(b, self.num_heads, t, -1), env.window_idx, env.window_ok)
      self.sow(nnx.Intermediate, "attn_window", win)
    out = self._mix(probs, v, env, x.dtype)  # [B, T, H * Dh]
    return self.o_proj(out), (k, v)

  def _project(self, x, env: AttentionEnv):
    """Queries [B, H, T, Dh], keys and values [B, KV, T, Dh] of x [B, T, D]: projected, normed (qk_norm) and
    rotated."""
    b, t, _ = x.shape
    h, kvh, hd = self.num_heads, self.num_kv_heads, self.head_dim
    q, k, v = fused_matmul(x, (self.q_proj, self.k_proj, self.v_proj), self.packed_qkv)
    q = q.reshape(b, t, h, hd)  # [B, T, H, Dh]
    k = k.reshape(b, t, kvh, hd)  # [B, T, KV, Dh]
    v = v.reshape(b, t, kvh, hd)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, env.cos, env.sin), apply_rope(k, env.cos, env.sin)
    return tuple(jnp.swapaxes(a, 1, 2) for a in (q, k, v))  # [B, H|KV, T, Dh]

  def _masks(self, env: AttentionEnv):
    """(own mask [B, T, S], prefix mask [B, T, Sp] or None) with this layer's sliding window applied, by position
    (key ranks), so cache holes do not widen it."""
    mask, prefix_mask, sp = env.mask, env.prefix_mask, env.prefix_slots
    if self.window is not None:
      near = (env.q_rank[:, :, None] - env.key_rank[:, None, :]) < self.window  # [B, T, Sp + S]
      mask = mask & near[:, :, sp:]
      if sp:
        prefix_mask = prefix_mask & near[:, :, :sp]
    return mask, prefix_mask

  def _probs(self, q, k, env: AttentionEnv):
    """Attention probabilities [B, KV, G, T, Sp + S] (float32) of queries [B, H, T, Dh] over the shared prefix's
    keys, then the own keys [B, KV, S, Dh], in one softmax."""
    b, _, t, hd = q.shape
    kvh, s, sp = self.num_kv_heads, k.shape[2], env.prefix_slots
    groups = self.num_heads // kvh
    mask, prefix_mask = self._masks(env)
    qg = q.reshape(b, kvh, groups * t, hd)  # heads h = kv * G + g share KV head kv (HF's repeat_kv order)
    scores = self._qk(qg, k)
    scores = (scores * self.score_scale).reshape(b, kvh, groups, t, s)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)  # [B, KV, G, T, S]
    if sp:
      kp = env.prefix_kv[0]  # [P, KV, Sp, Dh]
      p = kp.shape[0]
      r = b // p
      qp = jnp.swapaxes(q.reshape(p, r, kvh, groups * t, hd), 1, 2).reshape(p, kvh, r * groups * t, hd)
      sc_p = self._qk(qp, kp)
      sc_p = (sc_p * self.score_scale).reshape(p, kvh, r, groups, t, sp)
      sc_p = jnp.swapaxes(sc_p, 1, 2).reshape(b, kvh, groups, t, sp)
      sc_p = jnp.where(prefix_mask[:, None, None], sc_p, jnp.finfo(jnp.float32).min)
      scores = jnp.concatenate([sc_p, scores], axis=-1)  # [B, KV, G, T, Sp + S]
    return jax.nn.softmax(scores, axis=-1)

  def _mix(self, probs, v, env: AttentionEnv, dtype):
    """The probabilities [B, KV, G, T, Sp + S] times the prefix's and the own values [B, KV, S, Dh]: [B, T, H * Dh]
    in `dtype`."""
    b, kvh, groups, t, _ = probs.shape
    s, hd, sp = v.shape[2], self.head_dim, env.prefix_slots
    own = probs[..., sp:] if sp else probs
    out = self._pv(own.reshape(b, kvh, groups * t, s), v, dtype)
    if sp:
      vp = env.prefix_kv[1]  # [P, KV, Sp, Dh]
      p = vp.shape[0]
      r = b // p
      pp = jnp.swapaxes(probs[..., :sp].reshape(p, r, kvh, groups * t, sp), 1, 2).reshape(p, kvh, r * groups * t, sp)
      out_p = self._pv(pp, vp, dtype)  # [P, KV, R*G*T, Dh]
      out = out + jnp.swapaxes(out_p.reshape(p, kvh, r, groups * t, hd), 1, 2).reshape(b, kvh, groups * t, hd)
    return jnp.swapaxes(out.reshape(b, self.num_heads, t, hd), 1, 2).reshape(b, t, self.num_heads * hd)
