"""GGUF (llama.cpp) checkpoints as our model: metadata -> `ModelConfig`, tensors -> Hugging Face names and layout.

`read_gguf` feeds the same streaming loader as safetensors (`checkpoint.load_tensors`): it yields (HF tensor name,
zero-arg loader, HF shape), and each loader dequantises one tensor (`gguf_file.dequantise`) only when it is called.
The file itself (parsing, typed metadata, dequantisation) is `gguf_file.py`'s.

Two llama.cpp conventions are undone here, following `transformers`' own GGUF loader
(`modeling_gguf_pytorch_utils.py`), which is the reference the tests hold us to:
- llama.cpp's converter permutes the rows of q and k (weights and biases) of `llama`-architecture models from the
  HF rotate-half layout to its interleaved-pairs layout; `reverse_llama_cpp_permute` restores the HF order.
- A file with no `output.weight` ties the LM head to the token embedding.
- llama.cpp stores Gemma's zero-centred RMSNorm weights w as 1 + w (its norms multiply by the weight as is);
  `_GEMMA_NORM_SHIFT` takes the 1 back off, as transformers' `Gemma2TensorProcessor` does.

Gemma 3 metadata carries neither the global/local layer pattern, nor the local RoPE base, nor the query scale:
llama.cpp (`llama_model::load_hparams`, LLM_ARCH_GEMMA3) fixes every 6th layer global, the local base at 10000
with no scaling, and the query scale at head_dim ** -0.5 (hidden / heads for the 62-layer 27B); so do we.
transformers' GGUF loader agrees except in two places, where we follow llama.cpp, whose runtime defines what a
GGUF file means: it drops `rope.scaling.*` (Gemma 3 4B and up scale the global RoPE by 8) and always uses 256 for
query_pre_attn_scalar. The two agree on every released Gemma 3 whose head_dim is 256 and which has no RoPE scaling
(the 270M and the 1B).
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Iterator

import numpy as np

from reprobe_jax.errors import CheckpointError, ConfigError, UnsupportedModelError
from reprobe_jax.models.config import ModelConfig
from reprobe_jax.models.gguf_file import GGUFFile, GGUFMeta, GGUFTensor, check_dequantisable, dequantise, open_gguf

TensorStream = Iterator[tuple[str, Callable[[], np.ndarray], tuple[int, ...]]]

# GGUF `general.architecture` -> HF `model_type`. llama.cpp files Mistral and SmolLM2 under `llama`.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3", "gemma3": "gemma3_text"}

# Global tensors, then per-block ones (blk.N.<name>.<weight|bias>), GGUF -> HF.
_GLOBAL = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}
_BLOCK = {
  "attn_norm": "input_layernorm",
  "ffn_norm": "post_attention_layernorm",
  "attn_q": "self_attn.q_proj",
  "attn_k": "self_attn.k_proj",
  "attn_v": "self_attn.v_proj",
  "attn_qkv": "self_attn.qkv_proj",  # Phi-3 keeps q, k and v fused
  "attn_output": "self_attn.o_proj",
  "attn_q_norm": "self_attn.q_norm",
  "attn_k_norm": "self_attn.k_norm",
  "ffn_gate": "mlp.gate_proj",
  "ffn_up": "mlp.up_proj",
  "ffn_down": "mlp.down_proj",
}
# Phi-3's fused gate+up projection is stored as ffn_up.
_PHI3_BLOCK = dict(_BLOCK, ffn_up="mlp.gate_up_proj")
# Gemma 3 normalises each sublayer's input and output; its ffn_norm is the MLP's input norm.
_GEMMA3_BLOCK = dict(
  _BLOCK,
  post_attention_norm="post_attention_layernorm",
  ffn_norm="pre_feedforward_layernorm",
  post_ffw_norm="post_feedforward_layernorm",
)
_BLOCK_TABLES = {"phi3": _PHI3_BLOCK, "gemma3": _GEMMA3_BLOCK}
_GEMMA_NORM_SHIFT = 1.0
_GEMMA3_GLOBAL_EVERY = 6  # llama.cpp: hparams.set_swa_pattern(6)
_GEMMA3_LOCAL_ROPE_BASE = 10000.0  # llama.cpp: rope_freq_base_train_swa
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
# Longrope factors (Phi-3) are config, not parameters: read into the config, never yielded.
_ROPE_FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")

# -------------------------------------------------------------------------------------- rotary permutation


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """HF -> llama.cpp row order of a q or k projection ([n_head * Dh, ...] weight or [n_head * Dh] bias).

  Within each head, llama.cpp wants the rotary pairs (i, i + Dh/2) adjacent; this is `LlamaModel.permute` of
  llama.cpp's `convert_hf_to_gguf.py` (with n_head already the KV head count for k).
  """
  half = w.shape[0] // n_head // 2
  return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def reverse_llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
  """llama.cpp -> HF row order; the exact inverse of `llama_cpp_permute` (transformers' `_reverse_permute_weights`)."""
  if w.shape[0] % (2 * n_head):
    raise CheckpointError(
      f"cannot un-permute {list(w.shape)} rows over {n_head} heads: rows are not a multiple of 2 * heads"
    )
  half = w.shape[0] // n_head // 2
  return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# -------------------------------------------------------------------------------------- metadata


def _config_dict(g: GGUFFile, arch: str) -> dict[str, Any]:
  """An HF `config.json`-style dict from GGUF metadata (the keys transformers' `GGUF_CONFIG_MAPPING` reads)."""
  m, path = GGUFMeta(g), g.path
  tensor_names = {t.name for t in g.tensors}
  num_heads = m.integer(f"{arch}.attention.head_count")
  hidden = m.integer(f"{arch}.embedding_length")
  rope_dims = m.integer(f"{arch}.rope.dimension_count", None)
  # transformers reads llama's rope.dimension_count as head_dim; other families rotate head_dim unless they say so.
  head_dim = m.integer(f"{arch}.attention.key_length", None)
  if head_dim is None:
    head_dim = rope_dims if (arch == "llama" and rope_dims) else hidden // num_heads

  vocab = m.integer(f"{arch}.vocab_size", None)
  if vocab is None:
    vocab = m.count("tokenizer.ggml.tokens")  # one entry per token string; no need to decode them
    if vocab is None:
      raise ConfigError(f"{path}: neither {arch}.vocab_size nor tokenizer.ggml.tokens is present")

  d: dict[str, Any] = {
    "model_type": ARCHITECTURES[arch],
    "vocab_size": vocab,
    "hidden_size": hidden,
    "intermediate_size": m.integer(f"{arch}.feed_forward_length"),
    "num_hidden_layers": m.integer(f"{arch}.block_count"),
    "num_attention_heads": num_heads,
    "num_key_value_heads": m.integer(f"{arch}.attention.head_count_kv", num_heads),
    "head_dim": head_dim,
    "rms_norm_eps": m.number(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
    "rope_theta": m.number(f"{arch}.rope.freq_base", 10000.0),
    "max_position_embeddings": m.integer(f"{arch}.context_length", 4096),
    # transformers' rule: no output.weight means the head is the embedding.
    "tie_word_embeddings": "output.weight" not in tensor_names,
    "attention_bias": any(n.endswith(".attn_q.bias") for n in tensor_names),
    "bos_token_id": m.integer("tokenizer.ggml.bos_token_id", None, low=0),
    "eos_token_id": m.integer("tokenizer.ggml.eos_token_id", None, low=0),
    "pad_token_id": m.integer("tokenizer.ggml.padding_token_id", None, low=0),
  }
  if rope_dims and arch not in ("llama", "gemma3") and rope_dims != head_dim:
    d["partial_rotary_factor"] = rope_dims / head_dim
  window = m.integer(f"{arch}.attention.sliding_window", None, low=0)
  if window:
    d["sliding_window"] = window
    if arch in ("qwen2", "qwen3"):
      d["use_sliding_window"] = True
  d["rope_scaling"] = _rope_scaling(g, m, arch)
  if arch == "gemma3":  # what llama.cpp fixes for the architecture (see the module docstring)
    d.update(
      sliding_window_pattern=_GEMMA3_GLOBAL_EVERY,
      rope_local_base_freq=_GEMMA3_LOCAL_ROPE_BASE,
      query_pre_attn_scalar=hidden // num_heads if d["num_hidden_layers"] == 62 else head_dim,
    )
    if not window:
      raise ConfigError(
        f"{path}: GGUF metadata key 'gemma3.attention.sliding_window' is missing (Gemma 3's local layers need it)"
      )
  return d


def _rope_scaling(g: GGUFFile, m: GGUFMeta, arch: str) -> dict[str, Any] | None:
  """HF `rope_scaling` from `{arch}.rope.scaling.*` metadata and, for longrope, the rope_factors_* tensors."""
  path = g.path
  by_name = {t.name: t for t in g.tensors}
  if "rope_freqs.weight" in by_name:
    # llama3-style scaling is stored only as precomputed per-frequency divisors, which RopeConfig cannot express.
    raise UnsupportedModelError(
      f"{path}: tensor 'rope_freqs.weight' (llama3-style rope scaling baked into "
      f"frequencies) is not supported; load the Hugging Face safetensors checkpoint"
    )
  key = lambda s: f"{arch}.rope.scaling.{s}"
  orig = m.integer(key("original_context_length"), None)
  if all(n in by_name for n in _ROPE_FACTORS):
    if orig is None:
      raise ConfigError(f"{path}: longrope factors present but {key('original_context_length')!r} is missing")
    factors = {}
    for n in _ROPE_FACTORS:
      t = by_name[n]
      if t.tensor_type.name != "F32" or len(t.shape) != 1:
        raise CheckpointError(
          f"{path}: tensor {n!r} must be a 1-D F32 tensor, got {t.tensor_type.name} {list(t.shape)}"
        )
      factors[n] = [float(x) for x in t.data.view(np.float32)]
    out = {
      "rope_type": "longrope",
      "long_factor": factors["rope_factors_long.weight"],
      "short_factor": factors["rope_factors_short.weight"],
      "original_max_position_embeddings": orig,
    }
    attn = m.number(key("attn_factor"), None)
    if attn is not None:
      out["attention_factor"] = attn
    return out
  kind = m.text(key("type"), None)
  if kind in (None, "none"):
    return None
  if kind == "linear":
    return {"rope_type": "linear", "factor": m.number(key("factor"))}
  if kind == "yarn":
    out = {"rope_type": "yarn", "factor": m.number(key("factor"), None), "original_max_position_embeddings": orig}
    for gguf_key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
      v = m.number(key(gguf_key), None)
      if v is not None:
        out[hf_key] = v
    return out
  raise UnsupportedModelError(f"{path}: {key('type')} = {kind!r} is not supported; supported: none, linear, yarn")


# -------------------------------------------------------------------------------------- tensors


def _hf_name(name: str, arch: str) -> str | None:
  if name in _GLOBAL:
    return _GLOBAL[name]
  m = _BLOCK_RE.match(name)
  table = _BLOCK_TABLES.get(arch, _BLOCK)
  if m and m.group(2) in table:
    return f"model.layers.{m.group(1)}.{table[m.group(2)]}.{m.group(3)}"
  return None


def _loader(
  t: GGUFTensor, hf_shape: tuple[int, ...], unpermute_heads: int | None, shift: float | None = None
) -> Callable[[], np.ndarray]:
  """A zero-arg loader of one tensor in HF layout: float types as stored (memory-mapped), quantised -> float32;
  `shift` is subtracted (in float32) where given."""

  def load() -> np.ndarray:
    x = dequantise(t).reshape(hf_shape)
    if unpermute_heads is not None:
      x = reverse_llama_cpp_permute(x, unpermute_heads)
    if shift is not None:
      x = x.astype(np.float32) - np.float32(shift)
    return x

  return load


def read_gguf(path: str | os.PathLike | GGUFFile) -> tuple[ModelConfig, TensorStream]:
  """Reads a GGUF file's config and returns it with a lazy (HF name, loader, HF shape) stream of its tensors.

  Every metadata field read is type- and range-checked; raises UnsupportedModelError naming the architecture,
  tensor or quant type that is not supported, before any weight is dequantised.
  """
  g = path if isinstance(path, GGUFFile) else open_gguf(path)
  path = g.path
  arch = GGUFMeta(g).text("general.architecture", None)
  if arch not in ARCHITECTURES:
    raise UnsupportedModelError(
      f"{path}: GGUF general.architecture {arch!r} is not supported; supported: {sorted(ARCHITECTURES)}"
    )
  cfg = ModelConfig.from_hf_dict(_config_dict(g, arch), source=path)

  plan = []
  for t in g.tensors:
    if t.name in _ROPE_FACTORS:
      continue
    hf = _hf_name(t.name, arch)
    if hf is None:
      raise UnsupportedModelError(
        f"{path}: GGUF tensor {t.name!r} of a {arch} model has no Hugging Face counterpart here"
      )
    if arch == "phi3" and re.search(r"\.attn_[qkv]\.", t.name):
      raise UnsupportedModelError(
        f"{path}: tensor {t.name!r}: Phi-3 with separate q/k/v projections is not supported (expected fused attn_qkv)"
      )
    heads = None
    if arch == "llama" and re.search(r"\.attn_q\.", t.name):
      heads = cfg.num_heads
    elif arch == "llama" and re.search(r"\.attn_k\.", t.name):
      heads = cfg.num_kv_heads  # k was permuted over its own (KV) heads
    # ggml lists dimensions fastest-first; HF (torch) lists them slowest-first.
    hf_shape = tuple(reversed(t.shape))
    if heads is not None and hf_shape[0] % (2 * heads):
      raise CheckpointError(f"{path}: tensor {t.name!r} has {hf_shape[0]} rows, not a multiple of 2 x {heads} heads")
    shift = _GEMMA_NORM_SHIFT if arch == "gemma3" and t.name.endswith("norm.weight") else None
    plan.append((hf, t, hf_shape, heads, shift))
  check_dequantisable(path, [p[1] for p in plan])

  def stream() -> TensorStream:
    for hf, t, hf_shape, heads, shift in plan:
      yield hf, _loader(t, hf_shape, heads, shift), hf_shape

  return cfg, stream()
