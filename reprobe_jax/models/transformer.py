"""One NNX decoder for Llama, Mistral, Qwen2, Qwen3 and Phi-3 (HF semantics), with `sow`-based capture.

Parameters are stored in the layout of our own modules (kernels [in, out]); `checkpoint.py` holds the per-family
tables that map Hugging Face tensors to these paths. Every parameter carries `logical_axes` metadata for sharding.

The forward pass works on "slots": a sequence (or KV cache) of S key slots, queries at slots
[write_index, write_index + T). Without a cache, S = T and write_index = 0. This one code path serves the full
forward, prefill and single-token decode.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.config import ModelConfig
from reprobe_jax.models.rope import apply_rope, rope_cos_sin
from reprobe_jax.models.sharding import ShardingCtx, constrain

_INIT = jax.nn.initializers.normal(0.02)


def _param(rngs, shape, axes, dtype, init=_INIT):
  return nnx.Param(init(rngs.params(), shape, dtype), logical_axes=axes)


class Linear(nnx.Module):
  """y = x @ kernel (+ bias); kernel [in, out]."""

  def __init__(self, din: int, dout: int, axes: tuple[str, str], *, bias: bool, dtype, rngs: nnx.Rngs):
    self.kernel = _param(rngs, (din, dout), axes, dtype)
    self.bias = _param(rngs, (dout,), (axes[1],), dtype, jax.nn.initializers.zeros) if bias else None

  def __call__(self, x):
    y = jnp.einsum("...i,io->...o", x, self.kernel[...])
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


def attention_window(probs, q_slots, width: int):
  """Reads probabilities [B, H, T, S] at keys q_slot - w for w < width -> [B, T, H, W]; zero before slot 0.

  Only a [B, H, T, W] gather of the layer's map is kept, never the full map past this layer.
  """
  offsets = jnp.arange(width)  # [W]
  key_slots = q_slots[:, None] - offsets[None, :]  # [T, W]
  valid = key_slots >= 0
  idx = jnp.broadcast_to(jnp.clip(key_slots, 0)[None, None], probs.shape[:2] + key_slots.shape)
  win = jnp.take_along_axis(probs, idx, axis=-1)  # [B, H, T, W]
  win = jnp.where(valid[None, None], win, 0.0)
  return jnp.transpose(win, (0, 2, 1, 3))  # [B, T, H, W]


class Attention(nnx.Module):

  def __init__(self, cfg: ModelConfig, layer: int, *, dtype, rngs: nnx.Rngs):
    d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.q_proj = Linear(d, h * hd, ("embed", "heads"), bias=cfg.attention_bias, dtype=dtype, rngs=rngs)
    self.k_proj = Linear(d, kv * hd, ("embed", "kv_heads"), bias=cfg.attention_bias, dtype=dtype, rngs=rngs)
    self.v_proj = Linear(d, kv * hd, ("embed", "kv_heads"), bias=cfg.attention_bias, dtype=dtype, rngs=rngs)
    self.o_proj = Linear(h * hd, d, ("heads", "embed"), bias=False, dtype=dtype, rngs=rngs)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
      self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    else:
      self.q_norm = self.k_norm = None
    self.num_heads, self.num_kv_heads, self.head_dim = h, kv, hd
    self.window = cfg.sliding_windows[layer]

  def __call__(self, x, cos, sin, mask, q_slots, kv_cache, write_index, capture: CaptureSpec):
    """x [B, T, D]; mask [B, T, S] bool; kv_cache (k, v) [B, KV, S, Dh] or None. Returns out, (k, v).

    Head-major layout: the query heads that share a KV head are laid out as one [G*T] block, so both attention
    products are plain batched matmuls over (B, KV) and no score-sized transpose is made, forward or backward
    (on CPU the [B, T, KV, G, S] layout spent more time in transposes than in the matmuls). The cache is kept in
    the layout the products read.
    """
    b, t, _ = x.shape
    h, kvh, hd = self.num_heads, self.num_kv_heads, self.head_dim
    q = self.q_proj(x).reshape(b, t, h, hd)  # [B, T, H, Dh]
    k = self.k_proj(x).reshape(b, t, kvh, hd)  # [B, T, KV, Dh]
    v = self.v_proj(x).reshape(b, t, kvh, hd)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    q, k, v = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))  # [B, H|KV, T, Dh]
    if kv_cache is not None:
      k = jax.lax.dynamic_update_slice_in_dim(kv_cache[0], k.astype(kv_cache[0].dtype), write_index, axis=2)
      v = jax.lax.dynamic_update_slice_in_dim(kv_cache[1], v.astype(kv_cache[1].dtype), write_index, axis=2)
    s = k.shape[2]
    if self.window is not None:
      key_slots = jnp.arange(s)
      mask = mask & ((q_slots[:, None] - key_slots[None, :]) < self.window)[None]
    groups = h // kvh
    qg = q.reshape(b, kvh, groups * t, hd)  # heads h = kv * G + g share KV head kv (HF's repeat_kv order)
    scores = jnp.einsum("bkqd,bksd->bkqs", qg, k.astype(q.dtype), preferred_element_type=jnp.float32)
    scores = (scores * (hd**-0.5)).reshape(b, kvh, groups, t, s)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)  # [B, KV, G, T, S]
    probs = jax.nn.softmax(scores, axis=-1)
    if capture.attn_window:
      win = attention_window(probs.reshape(b, h, t, s), q_slots, capture.attn_window)
      self.sow(nnx.Intermediate, "attn_window", win)
    out = jnp.einsum("bkqs,bksd->bkqd", probs.reshape(b, kvh, groups * t, s).astype(x.dtype), v.astype(x.dtype))
    out = jnp.swapaxes(out.reshape(b, h, t, hd), 1, 2).reshape(b, t, h * hd)
    return self.o_proj(out), (k, v)


class MLP(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, dtype, rngs: nnx.Rngs):
    d, f = cfg.hidden_size, cfg.intermediate_size
    self.gate_proj = Linear(d, f, ("embed", "mlp"), bias=False, dtype=dtype, rngs=rngs)
    self.up_proj = Linear(d, f, ("embed", "mlp"), bias=False, dtype=dtype, rngs=rngs)
    self.down_proj = Linear(f, d, ("mlp", "embed"), bias=False, dtype=dtype, rngs=rngs)

  def __call__(self, x):
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):

  def __init__(self, cfg: ModelConfig, layer: int, *, dtype, rngs: nnx.Rngs):
    self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    self.self_attn = Attention(cfg, layer, dtype=dtype, rngs=rngs)
    self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    self.mlp = MLP(cfg, dtype=dtype, rngs=rngs)

  def __call__(self, x, cos, sin, mask, q_slots, kv_cache, write_index, capture):
    attn, kv = self.self_attn(self.input_layernorm(x), cos, sin, mask, q_slots, kv_cache, write_index, capture)
    x = x + attn
    x = x + self.mlp(self.post_attention_layernorm(x))
    return x, kv


class Decoder(nnx.Module):
  """Causal LM. `__call__` returns logits [B, T, V] (float32) and the updated per-layer (k, v)."""

  def __init__(self, cfg: ModelConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
    self.config = cfg
    self.embed_tokens = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), dtype)
    self.layers = nnx.List([DecoderLayer(cfg, i, dtype=dtype, rngs=rngs) for i in range(cfg.num_layers)])
    self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    self.lm_head = (None if cfg.tie_word_embeddings else
                    _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), dtype))

  def __call__(self, input_ids, positions, key_valid, *, kv_caches=None, write_index=0,
               capture: CaptureSpec = CaptureSpec(), shard: ShardingCtx | None = None):
    """input_ids, positions [B, T] int; key_valid [B, S] bool (S = T without a cache, else the cache size);
    kv_caches: per-layer (k, v) [B, KV, S, Dh] or None. Queries sit at slots write_index + arange(T)."""
    cfg = self.config
    t = input_ids.shape[1]
    layers_wanted = set(capture.resolve_layers(cfg.num_layers))
    x = jnp.take(self.embed_tokens[...], input_ids, axis=0)  # [B, T, D]
    x = constrain(x, ("batch", "seq", "embed"), shard)
    if 0 in layers_wanted:
      self.sow(nnx.Intermediate, "hidden_0", x)
    s = key_valid.shape[1]
    q_slots = write_index + jnp.arange(t)  # [T]
    key_slots = jnp.arange(s)
    mask = (key_slots[None, :] <= q_slots[:, None])[None] & key_valid[:, None, :]  # [B, T, S]
    cos, sin = rope_cos_sin(cfg, positions)
    new_caches = []
    for i, layer in enumerate(self.layers):
      kv = kv_caches[i] if kv_caches is not None else None
      x, kv = layer(x, cos, sin, mask, q_slots, kv, write_index, capture)
      x = constrain(x, ("batch", "seq", "embed"), shard)
      new_caches.append(kv)
      if i + 1 < cfg.num_layers and (i + 1) in layers_wanted:
        self.sow(nnx.Intermediate, f"hidden_{i + 1}", x)
    x = self.norm(x)
    if cfg.num_layers in layers_wanted:
      self.sow(nnx.Intermediate, f"hidden_{cfg.num_layers}", x)
    head = self.embed_tokens[...].T if self.lm_head is None else self.lm_head[...]
    logits = jnp.einsum("btd,dv->btv", x, head, preferred_element_type=jnp.float32)
    logits = constrain(logits, ("batch", "seq", "vocab"), shard)
    return logits, tuple(new_caches)
