"""One NNX decoder for Llama, Mistral, Qwen2, Qwen3, Phi-3 and Gemma 3 (HF semantics), with `sow`-based capture.

Parameters are stored in the layout of our own modules (kernels [in, out]); `checkpoint.py` holds the per-family
tables that map Hugging Face tensors to these paths. Every parameter carries `logical_axes` metadata for sharding.

The forward pass works on "slots": a sequence (or KV cache) of S key slots. Queries sit at slots [write_index,
write_index + T) of every row (lockstep: a full forward, a prefill), or at per-row slots `write_slots [B, T]` (a
decode step or forced text, where each row appends at its own length, so rows that wait leave no holes). Without a
cache, S = T and write_index = 0. This one code path serves the full forward, prefill and decoding. The building
blocks are in `layers.py` (linear layers, norms) and `attention.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from reprobe_jax import kernels
from reprobe_jax.kernels import attention as attention_kernels
from reprobe_jax.models.attention import Attention, AttentionEnv
from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.config import ModelConfig
from reprobe_jax.models.layers import Linear, PackedWeight, fused_matmul, matmul, norm_for, param
from reprobe_jax.models.rope import rope_cos_sin
from reprobe_jax.models.sharding import ShardingCtx, constrain


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
    norm = norm_for(cfg)
    self.input_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    self.self_attn = Attention(cfg, layer, dtype=dtype, rngs=rngs)
    self.post_attention_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    self.mlp = MLP(cfg, dtype=dtype, rngs=rngs)
    if cfg.sandwich_norms:
      self.pre_feedforward_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
      self.post_feedforward_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    else:
      self.pre_feedforward_layernorm = self.post_feedforward_layernorm = None

  def __call__(self, x, kv_cache, env: AttentionEnv):
    """x [B, T, D] -> (x [B, T, D], the layer's (k, v)); see `Attention.__call__`."""
    attn, kv = self.self_attn(self.input_layernorm(x), kv_cache, env)
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
    self.embed_tokens = param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), dtype)
    self.layers = nnx.List([DecoderLayer(cfg, i, dtype=dtype, rngs=rngs) for i in range(cfg.num_layers)])
    self.norm = norm_for(cfg)(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, rngs=rngs)
    self.lm_head = (
      None if cfg.tie_word_embeddings else param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), dtype)
    )
    self.packed_head = None  # the vocabulary projection [D, V] packed, in the decode view on CPU

  def __call__(
    self,
    input_ids,
    positions,
    key_valid,
    *,
    kv_caches=None,
    write_index=0,
    write_slots=None,
    capture: CaptureSpec = CaptureSpec(),
    shard: ShardingCtx | None = None,
    prefix=None,
    last_only: bool = False,
  ):
    """input_ids, positions [B, T] int; key_valid [B, S] bool (S = T without a cache, else the cache size);
    kv_caches: per-layer (k, v) [B, KV, S, Dh] or None. Queries sit at slots write_index + arange(T), or at
    write_slots [B, T] (per row; a slot >= S marks a padding query, written nowhere).
    prefix: optional (per-layer (k, v) [P, KV, Sp, Dh], valid [B, Sp] bool): a context shared by the B // P
    consecutive rows of each of its P rows, read before the own slots (see `Attention`).
    last_only (static): logits (and the final-norm hidden state) of the last position only, [B, 1, V]: a prefill
    needs no more, and the vocabulary projection of every prompt position is a fifth of a SmolLM2 prefill's FLOPs."""
    cfg = self.config
    layers_wanted = set(capture.resolve_layers(cfg.num_layers))
    x = self._embed(input_ids, shard)  # [B, T, D]
    if 0 in layers_wanted:
      self.sow(nnx.Intermediate, "hidden_0", x)
    if write_slots is None:
      q_slots = jnp.broadcast_to(write_index + jnp.arange(input_ids.shape[1]), input_ids.shape)  # [B, T]
    else:
      q_slots = write_slots
    env = AttentionEnv.build(
      key_valid, q_slots, prefix, write_index=write_index, write_slots=write_slots, capture=capture
    )
    ropes = {}  # one cos/sin pair per distinct RoPE (Gemma 3: global and local layers differ)
    new_caches = []
    for i, layer in enumerate(self.layers):
      rope = cfg.layer_rope(i)
      if rope not in ropes:
        ropes[rope] = rope_cos_sin(cfg, positions, rope)
      kv = kv_caches[i] if kv_caches is not None else None
      x, kv = layer(x, kv, env.for_layer(i, *ropes[rope]))
      x = constrain(x, ("batch", "seq", "embed"), shard)
      new_caches.append(kv)
      if i + 1 < cfg.num_layers and (i + 1) in layers_wanted:
        self.sow(nnx.Intermediate, f"hidden_{i + 1}", x)
    if last_only:
      x = x[:, -1:]  # [B, 1, D]
    x = self.norm(x)
    if cfg.num_layers in layers_wanted:
      self.sow(nnx.Intermediate, f"hidden_{cfg.num_layers}", x)
    return self._logits(x, shard), tuple(new_caches)

  def _embed(self, input_ids, shard):
    """Token embeddings [B, T, D] of input_ids [B, T] (Gemma's scaled)."""
    x = jnp.take(self.embed_tokens[...], input_ids, axis=0)  # [B, T, D]
    if self.config.embed_scale is not None:  # Gemma: sqrt(hidden_size), rounded to the model dtype as HF rounds it
      x = x * jnp.asarray(np.float32(self.config.embed_scale)).astype(x.dtype)
    return constrain(x, ("batch", "seq", "embed"), shard)

  def _logits(self, x, shard):
    """float32 logits [B, T, V] of the final-norm hidden states x [B, T, D] (Gemma's soft-capped)."""
    head = self.embed_tokens[...].T if self.lm_head is None else self.lm_head[...]
    logits = matmul(x, head, self.packed_head, preferred_element_type=jnp.float32)
    if self.config.final_logit_softcapping is not None:
      cap = self.config.final_logit_softcapping
      logits = jnp.tanh(logits / cap) * cap
    return constrain(logits, ("batch", "seq", "vocab"), shard)


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
