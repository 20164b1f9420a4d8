"""One NNX decoder for Llama, Mistral, Qwen2, Qwen3, Phi-3 and Gemma 3 (HF semantics), with `sow`-based capture.

Parameters are stored in the layout of our own modules (kernels [in, out]); `checkpoint.py` holds the per-family
tables that map Hugging Face tensors to these paths. Every parameter carries `logical_axes` metadata for sharding.

The forward pass works on "slots": a sequence (or KV cache) of S key slots. Queries sit at slots [write_index,
write_index + T) of every row (lockstep: a full forward, a prefill), or at per-row slots `write_slots [B, T]` (a
decode step or forced text, where each row appends at its own length, so rows that wait leave no holes). Without a
cache, S = T and write_index = 0. This one code path serves the full forward, prefill and decoding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from reprobe_jax import kernels
from reprobe_jax.kernels import attention as attention_kernels
from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.config import ModelConfig
from reprobe_jax.models.rope import apply_rope, rope_cos_sin
from reprobe_jax.models.sharding import ShardingCtx, constrain

_INIT = jax.nn.initializers.normal(0.02)


def _param(rngs, shape, axes, dtype, init=_INIT):
  return nnx.Param(init(rngs.params(), shape, dtype), logical_axes=axes)


class PackedWeight(nnx.Variable):
  """A copy of a weight packed for the CPU decode kernel (`reprobe_jax.kernels.pack`): not a parameter. Only the
  decode view made by `with_packed_weights` holds one; training, export and sharding never see it."""


def _rows(x) -> int:
  return int(np.prod(x.shape[:-1]))


def fused_matmul(x, linears, packed) -> list:
  """[x @ l.kernel (+ l.bias) for l in linears]: one packed-kernel call over the linears' weights side by side where
  `packed` (their concatenation, packed: `with_packed_weights`) exists and x has at most `kernels.MAX_ROWS` rows,
  else each Linear on its own. The kernel computes every output column from its own weight column alone, so the
  parts equal the separate products bit for bit; one call instead of three (q, k, v) or two (gate, up) saves the
  kernel's per-call start (thread hand-off, a fresh stream to prefetch), about 8% of a batch-1 SmolLM2 chain."""
  if packed is None or _rows(x) > kernels.MAX_ROWS:
    return [lin(x) for lin in linears]
  widths = [lin.kernel.shape[1] for lin in linears]
  y = kernels.packed_matmul(x, packed[...], sum(widths))
  out, at = [], 0
  for lin, n in zip(linears, widths):
    part = y[..., at:at + n]
    out.append(part + lin.bias[...] if lin.bias is not None else part)
    at += n
  return out


def matmul(x, w, packed, preferred_element_type=None):
  """x [..., K] @ w [K, N]: through the packed-weight kernel where a packed copy of w exists and x has at most
  `kernels.MAX_ROWS` rows (a decode step), else XLA's dot."""
  if packed is not None and _rows(x) <= kernels.MAX_ROWS:
    return kernels.packed_matmul(x, packed[...], w.shape[1])
  return jnp.einsum("...i,io->...o", x, w, preferred_element_type=preferred_element_type)


class Linear(nnx.Module):
  """y = x @ kernel (+ bias); kernel [in, out]."""

  def __init__(self, din: int, dout: int, axes: tuple[str, str], *, bias: bool, dtype, rngs: nnx.Rngs):
    self.kernel = _param(rngs, (din, dout), axes, dtype)
    self.bias = _param(rngs, (dout,), (axes[1],), dtype, jax.nn.initializers.zeros) if bias else None
    self.packed = None  # a PackedWeight in the decode view on CPU (with_packed_weights)

  def __call__(self, x):
    y = matmul(x, self.kernel[...], self.packed)
    return y + self.bias[...] if self.bias is not None else y


class RMSNorm(nnx.Module):
  """HF RMSNorm: normalise in float32, cast back, then scale."""

  def __init__(self, dim: int, eps: float, *, dtype, rngs: nnx.Rngs):
    del rngs
    self.scale = nnx.Param(jnp.ones((dim,), dtype), logical_axes=("norm",))
    self.eps = eps

  def __call__(self, x):
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    return self.scale[...] * xf.astype(x.dtype)


class GemmaRMSNorm(nnx.Module):
  """Gemma's RMSNorm: y = x_hat * (1 + scale), all in float32, then cast. `scale` is zero-centred, as HF stores it."""

  def __init__(self, dim: int, eps: float, *, dtype, rngs: nnx.Rngs):
    del rngs
    self.scale = nnx.Param(jnp.zeros((dim,), dtype), logical_axes=("norm",))
    self.eps = eps

  def __call__(self, x):
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    return (xf * (1.0 + self.scale[...].astype(jnp.float32))).astype(x.dtype)


def _norm(cfg: ModelConfig):
  return GemmaRMSNorm if cfg.sandwich_norms else RMSNorm


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


class Attention(nnx.Module):

  def __init__(self, cfg: ModelConfig, layer: int, *, dtype, rngs: nnx.Rngs):
    d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.q_proj = Linear(d, h * hd, ("embed", "heads"), bias=cfg.attention_bias, dtype=dtype, rngs=rngs)
    self.k_proj = Linear(d, kv * hd, ("embed", "kv_heads"), bias=cfg.attention_bias, dtype=dtype, rngs=rngs)
    self.v_proj = Linear(d, kv * hd, ("embed", "kv_heads"), bias=cfg.attention_bias, dtype=dtype, rngs=rngs)
    self.o_proj = Linear(h * hd, d, ("heads", "embed"), bias=False, dtype=dtype, rngs=rngs)
    if cfg.qk_norm:
      self.q_norm = _norm(cfg)(hd, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
      self.k_norm = _norm(cfg)(hd, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
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

  def __call__(self, x, cos, sin, mask, kv_cache, write_index, write_slots, capture: CaptureSpec, layout):
    """x [B, T, D]; mask [B, T, S] bool; kv_cache (k, v) [B, KV, S, Dh] or None. Returns out, (k, v).

    `layout` (see `Decoder.__call__`) carries key ranks, the attention-window indices and an optional shared
    prefix: (k, v) [P, KV, Sp, Dh] read by the R = B // P consecutive rows of each prefix (Hydragen-style: the
    queries of a prefix's rows are stacked, so its keys and values are read once for all of them, not copied per
    row), with its mask [B, T, Sp]. Prefix and own scores share one softmax, which is exact attention over the
    concatenated keys.

    Head-major layout: the query heads that share a KV head are laid out as one [G*T] block, so both attention
    products are plain batched matmuls over (B, KV) and no score-sized transpose is made, forward or backward
    (on CPU the [B, T, KV, G, S] layout spent more time in transposes than in the matmuls). The cache is kept in
    the layout the products read.
    """
    b, t, _ = x.shape
    h, kvh, hd = self.num_heads, self.num_kv_heads, self.head_dim
    q, k, v = fused_matmul(x, (self.q_proj, self.k_proj, self.v_proj), self.packed_qkv)
    q = q.reshape(b, t, h, hd)  # [B, T, H, Dh]
    k = k.reshape(b, t, kvh, hd)  # [B, T, KV, Dh]
    v = v.reshape(b, t, kvh, hd)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    q, k, v = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))  # [B, H|KV, T, Dh]
    if kv_cache is not None and write_slots is None:  # lockstep: one slice for every row
      k = jax.lax.dynamic_update_slice_in_dim(kv_cache[0], k.astype(kv_cache[0].dtype), write_index, axis=2)
      v = jax.lax.dynamic_update_slice_in_dim(kv_cache[1], v.astype(kv_cache[1].dtype), write_index, axis=2)
    elif kv_cache is not None:  # each row at its own slots; out-of-range slots (padding) are dropped
      put = jax.vmap(lambda c, new, sl: c.at[:, sl, :].set(new.astype(c.dtype), mode="drop"))
      k, v = put(kv_cache[0], k, write_slots), put(kv_cache[1], v, write_slots)
    s = k.shape[2]
    sp = layout.prefix_slots
    prefix_mask = layout.prefix_mask
    if self.window is not None:  # sliding window by position (key ranks), so cache holes do not widen it
      near = (layout.q_rank[:, :, None] - layout.key_rank[:, None, :]) < self.window  # [B, T, Sp + S]
      mask = mask & near[:, :, sp:]
      if sp:
        prefix_mask = prefix_mask & near[:, :, :sp]
    groups = h // kvh
    qg = q.reshape(b, kvh, groups * t, hd)  # heads h = kv * G + g share KV head kv (HF's repeat_kv order)
    scores = self._qk(qg, k)
    scores = (scores * self.score_scale).reshape(b, kvh, groups, t, s)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)  # [B, KV, G, T, S]
    if sp:
      kp, vp = layout.prefix_kv[0], layout.prefix_kv[1]  # [P, KV, Sp, Dh]
      p = kp.shape[0]
      r = b // p
      qp = jnp.swapaxes(q.reshape(p, r, kvh, groups * t, hd), 1, 2).reshape(p, kvh, r * groups * t, hd)
      sc_p = self._qk(qp, kp)
      sc_p = (sc_p * self.score_scale).reshape(p, kvh, r, groups, t, sp)
      sc_p = jnp.swapaxes(sc_p, 1, 2).reshape(b, kvh, groups, t, sp)
      sc_p = jnp.where(prefix_mask[:, None, None], sc_p, jnp.finfo(jnp.float32).min)
      scores = jnp.concatenate([sc_p, scores], axis=-1)  # [B, KV, G, T, Sp + S]
    probs = jax.nn.softmax(scores, axis=-1)
    if capture.attn_window:
      win = attention_window(probs.reshape(b, h, t, sp + s), layout.window_idx, layout.window_ok)
      self.sow(nnx.Intermediate, "attn_window", win)
    own = probs[..., sp:] if sp else probs
    out = self._pv(own.reshape(b, kvh, groups * t, s), v, x.dtype)
    if sp:
      pp = jnp.swapaxes(probs[..., :sp].reshape(p, r, kvh, groups * t, sp), 1, 2).reshape(p, kvh, r * groups * t, sp)
      out_p = self._pv(pp, vp, x.dtype)  # [P, KV, R*G*T, Dh]
      out = out + jnp.swapaxes(out_p.reshape(p, kvh, r, groups * t, hd), 1, 2).reshape(b, kvh, groups * t, hd)
    out = jnp.swapaxes(out.reshape(b, h, t, hd), 1, 2).reshape(b, t, h * hd)
    return self.o_proj(out), (k, v)


class _Layout:
  """What every layer's attention reads besides its own keys: key ranks, window indices, the shared prefix."""

  def __init__(self, key_rank, q_rank, window_idx, window_ok, prefix_slots, prefix_mask, prefix_layers):
    self.key_rank, self.q_rank, self.window_idx, self.window_ok = key_rank, q_rank, window_idx, window_ok
    self.prefix_slots, self.prefix_mask, self.prefix_layers = prefix_slots, prefix_mask, prefix_layers
    self.prefix_kv = None

  @classmethod
  def build(cls, key_valid, q_slots, prefix, width: int, t: int):
    if prefix is None:
      rank, q_rank, idx, ok = key_layout(key_valid, q_slots, width)
      return cls(rank, q_rank, idx, ok, 0, None, None)
    layers, prefix_valid = prefix  # prefix_valid [B, Sp]
    sp = prefix_valid.shape[1]
    rank, q_rank, idx, ok = key_layout(jnp.concatenate([prefix_valid, key_valid], axis=1), q_slots + sp, width)
    return cls(rank, q_rank, idx, ok, sp, jnp.broadcast_to(prefix_valid[:, None, :], (prefix_valid.shape[0], t, sp)),
               layers)

  def for_layer(self, i: int) -> "_Layout":
    if self.prefix_layers is None:
      return self
    out = _Layout(self.key_rank, self.q_rank, self.window_idx, self.window_ok, self.prefix_slots, self.prefix_mask,
                  None)
    out.prefix_kv = self.prefix_layers[i]
    return out


class MLP(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, dtype, rngs: nnx.Rngs):
    d, f = cfg.hidden_size, cfg.intermediate_size
    self.gate_proj = Linear(d, f, ("embed", "mlp"), bias=False, dtype=dtype, rngs=rngs)
    self.up_proj = Linear(d, f, ("embed", "mlp"), bias=False, dtype=dtype, rngs=rngs)
    self.down_proj = Linear(f, d, ("mlp", "embed"), bias=False, dtype=dtype, rngs=rngs)
    self.gelu = cfg.hidden_act == "gelu_pytorch_tanh"  # GeGLU (Gemma), else SwiGLU
    self.packed_gate_up = None  # gate and up weights side by side, packed, in the decode view on CPU

  def __call__(self, x):
    gate, up = fused_matmul(x, (self.gate_proj, self.up_proj), self.packed_gate_up)
    gate = jax.nn.gelu(gate, approximate=True) if self.gelu else jax.nn.silu(gate)
    return self.down_proj(gate * up)


class DecoderLayer(nnx.Module):

  """Pre-norm block. With `sandwich_norms` (Gemma 3), `post_attention_layernorm` normalises the attention output
  (not the MLP input, as in Llama), and pre-/post-feedforward norms wrap the MLP."""

  def __init__(self, cfg: ModelConfig, layer: int, *, dtype, rngs: nnx.Rngs):
    norm = _norm(cfg)
    self.input_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    self.self_attn = Attention(cfg, layer, dtype=dtype, rngs=rngs)
    self.post_attention_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    self.mlp = MLP(cfg, dtype=dtype, rngs=rngs)
    if cfg.sandwich_norms:
      self.pre_feedforward_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
      self.post_feedforward_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    else:
      self.pre_feedforward_layernorm = self.post_feedforward_layernorm = None

  def __call__(self, x, cos, sin, mask, kv_cache, write_index, write_slots, capture, layout):
    attn, kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, kv_cache, write_index, write_slots, capture,
                              layout)
    if self.pre_feedforward_layernorm is not None:
      x = x + self.post_attention_layernorm(attn)
      x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
      return x, kv
    x = x + attn
    x = x + self.mlp(self.post_attention_layernorm(x))
    return x, kv


class Decoder(nnx.Module):
  """Causal LM. `__call__` returns logits [B, T, V] (float32) and the updated per-layer (k, v)."""

  def __init__(self, cfg: ModelConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
    self.config = cfg
    self.embed_tokens = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), dtype)
    self.layers = nnx.List([DecoderLayer(cfg, i, dtype=dtype, rngs=rngs) for i in range(cfg.num_layers)])
    self.norm = _norm(cfg)(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    self.lm_head = (None if cfg.tie_word_embeddings else
                    _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), dtype))
    self.packed_head = None  # the vocabulary projection [D, V] packed, in the decode view on CPU

  def __call__(self, input_ids, positions, key_valid, *, kv_caches=None, write_index=0, write_slots=None,
               capture: CaptureSpec = CaptureSpec(), shard: ShardingCtx | None = None, prefix=None,
               last_only: bool = False):
    """input_ids, positions [B, T] int; key_valid [B, S] bool (S = T without a cache, else the cache size);
    kv_caches: per-layer (k, v) [B, KV, S, Dh] or None. Queries sit at slots write_index + arange(T), or at
    write_slots [B, T] (per row; a slot >= S marks a padding query, written nowhere).
    prefix: optional (per-layer (k, v) [P, KV, Sp, Dh], valid [B, Sp] bool): a context shared by the B // P
    consecutive rows of each of its P rows, read before the own slots (see `Attention`).
    last_only (static): logits (and the final-norm hidden state) of the last position only, [B, 1, V]: a prefill
    needs no more, and the vocabulary projection of every prompt position is a fifth of a SmolLM2 prefill's FLOPs."""
    cfg = self.config
    t = input_ids.shape[1]
    layers_wanted = set(capture.resolve_layers(cfg.num_layers))
    x = jnp.take(self.embed_tokens[...], input_ids, axis=0)  # [B, T, D]
    if cfg.embed_scale is not None:  # Gemma: sqrt(hidden_size), rounded to the model dtype as HF rounds it
      x = x * jnp.asarray(np.float32(cfg.embed_scale)).astype(x.dtype)
    x = constrain(x, ("batch", "seq", "embed"), shard)
    if 0 in layers_wanted:
      self.sow(nnx.Intermediate, "hidden_0", x)
    s = key_valid.shape[1]
    if write_slots is None:
      q_slots = jnp.broadcast_to(write_index + jnp.arange(t), input_ids.shape)  # [B, T]
    else:
      q_slots = write_slots
    key_slots = jnp.arange(s)
    mask = (key_slots[None, None, :] <= q_slots[:, :, None]) & key_valid[:, None, :]  # [B, T, S]
    layout = _Layout.build(key_valid, q_slots, prefix, capture.attn_window, t)
    ropes = {}  # one cos/sin pair per distinct RoPE (Gemma 3: global and local layers differ)
    new_caches = []
    for i, layer in enumerate(self.layers):
      rope = cfg.layer_rope(i)
      if rope not in ropes:
        ropes[rope] = rope_cos_sin(cfg, positions, rope)
      cos, sin = ropes[rope]
      kv = kv_caches[i] if kv_caches is not None else None
      x, kv = layer(x, cos, sin, mask, kv, write_index, write_slots, capture, layout.for_layer(i))
      x = constrain(x, ("batch", "seq", "embed"), shard)
      new_caches.append(kv)
      if i + 1 < cfg.num_layers and (i + 1) in layers_wanted:
        self.sow(nnx.Intermediate, f"hidden_{i + 1}", x)
    if last_only:
      x = x[:, -1:]  # [B, 1, D]
    x = self.norm(x)
    if cfg.num_layers in layers_wanted:
      self.sow(nnx.Intermediate, f"hidden_{cfg.num_layers}", x)
    head = self.embed_tokens[...].T if self.lm_head is None else self.lm_head[...]
    logits = matmul(x, head, self.packed_head, preferred_element_type=jnp.float32)
    if cfg.final_logit_softcapping is not None:
      cap = cfg.final_logit_softcapping
      logits = jnp.tanh(logits / cap) * cap
    logits = constrain(logits, ("batch", "seq", "vocab"), shard)
    return logits, tuple(new_caches)


def matmul_weight_bytes(params) -> int:
  """Bytes of a decoder's matmul weights (every [K, N] kernel and the vocabulary projection)."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params) if getattr(x, "ndim", 0) == 2)


def packing_applies(params, *, min_bytes: int = kernels.MIN_MODEL_BYTES) -> str:
  """'' when the CPU decode kernel should run on these params, else why not: float32 weights on one CPU device,
  at least `min_bytes` of matmul weights (smaller models stay in cache, where XLA's dots are fine), and the kernel
  built on this machine."""
  leaves = jax.tree.leaves(params)
  if any(getattr(x, "dtype", jnp.float32) != jnp.float32 for x in leaves if getattr(x, "ndim", 0) >= 2):
    return "weights are not float32"
  devices = set()
  for x in leaves:
    devices |= set(getattr(x, "devices", lambda: set())())
  if len(devices) != 1 or next(iter(devices)).platform != "cpu":
    return "weights are not on one CPU device"
  if matmul_weight_bytes(params) < min_bytes:
    return f"matmul weights under {min_bytes >> 20} MiB"
  if not kernels.available():
    return kernels.unavailable_reason()
  return ""


def with_packed_weights(model: Decoder) -> Decoder:
  """Gives every matmul weight of `model` and its vocabulary projection a packed copy (in place; returns `model`),
  so decode steps of at most `kernels.MAX_ROWS` rows run the CPU kernel: q, k and v packed side by side as one
  weight (`Attention.packed_qkv`), gate and up likewise (`MLP.packed_gate_up`), o, down and the head each on its
  own. The parameters themselves are untouched: split the result for a decode view beside the model's own
  (graphdef, params)."""
  def packed(*linears):
    return nnx.data(PackedWeight(kernels.pack(jnp.concatenate([lin.kernel[...] for lin in linears], axis=1))))

  for _, node in list(nnx.iter_graph(model)):
    if isinstance(node, Attention):  # q, k, v and gate, up as one packed weight each (`fused_matmul`)
      node.packed_qkv = packed(node.q_proj, node.k_proj, node.v_proj)
      node.o_proj.packed = packed(node.o_proj)
      node.decode_kernels = attention_kernels.available()
    elif isinstance(node, MLP):
      node.packed_gate_up = packed(node.gate_proj, node.up_proj)
      node.down_proj.packed = packed(node.down_proj)
  head = model.embed_tokens[...].T if model.lm_head is None else model.lm_head[...]
  model.packed_head = nnx.data(PackedWeight(kernels.pack(head)))
  return model
