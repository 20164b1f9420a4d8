"""GGUF (llama.cpp) checkpoints: metadata -> `ModelConfig`, tensors -> Hugging Face names, dequantised lazily.

`read_gguf` feeds the same streaming loader as safetensors (`checkpoint.load_tensors`): it yields
(HF tensor name, zero-arg loader, HF shape), and each loader dequantises one tensor only when it is called, so
a quantised 8B file never sits in memory as float32 all at once.

Two llama.cpp conventions are undone here, following `transformers`' own GGUF loader
(`modeling_gguf_pytorch_utils.py`), which is the reference the tests hold us to:
- llama.cpp's converter permutes the rows of q and k (weights and biases) of `llama`-architecture models from the
  HF rotate-half layout to its interleaved-pairs layout; `reverse_llama_cpp_permute` restores the HF order.
- A file with no `output.weight` ties the LM head to the token embedding.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Iterator

import ml_dtypes
import numpy as np

from reprobe_jax.errors import CheckpointError, ConfigError, UnsupportedModelError
from reprobe_jax.models.config import ModelConfig

TensorStream = Iterator[tuple[str, Callable[[], np.ndarray], tuple[int, ...]]]

# GGUF `general.architecture` -> HF `model_type`. llama.cpp files Mistral and SmolLM2 under `llama`.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3"}

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
    raise CheckpointError(f"cannot un-permute {list(w.shape)} rows over {n_head} heads: rows are not a multiple "
                          f"of 2 * heads")
  half = w.shape[0] // n_head // 2
  return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# -------------------------------------------------------------------------------------- metadata


def _field(reader, key: str, default: Any = None) -> Any:
  f = reader.fields.get(key)
  return default if f is None else f.contents()


def _config_dict(reader, path: str, arch: str, tensor_names: set[str]) -> dict[str, Any]:
  """An HF `config.json`-style dict from GGUF metadata (the keys transformers' `GGUF_CONFIG_MAPPING` reads)."""

  def need(suffix):
    v = _field(reader, f"{arch}.{suffix}")
    if v is None:
      raise ConfigError(f"{path}: GGUF metadata key {arch}.{suffix!r} is missing")
    return v

  num_heads = int(need("attention.head_count"))
  hidden = int(need("embedding_length"))
  rope_dims = _field(reader, f"{arch}.rope.dimension_count")
  # transformers reads llama's rope.dimension_count as head_dim; other families rotate head_dim unless they say so.
  head_dim = _field(reader, f"{arch}.attention.key_length")
  if head_dim is None:
    head_dim = rope_dims if (arch == "llama" and rope_dims) else hidden // num_heads
  head_dim = int(head_dim)

  vocab = _field(reader, f"{arch}.vocab_size")
  if vocab is None:
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
      raise ConfigError(f"{path}: neither {arch}.vocab_size nor tokenizer.ggml.tokens is present")
    vocab = len(tokens.data)  # one entry per token string; no need to decode them

  eos = _field(reader, "tokenizer.ggml.eos_token_id")
  d: dict[str, Any] = {
      "model_type": ARCHITECTURES[arch],
      "vocab_size": int(vocab),
      "hidden_size": hidden,
      "intermediate_size": int(need("feed_forward_length")),
      "num_hidden_layers": int(need("block_count")),
      "num_attention_heads": num_heads,
      "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", num_heads)),
      "head_dim": head_dim,
      "rms_norm_eps": float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
      "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
      "max_position_embeddings": int(_field(reader, f"{arch}.context_length", 4096)),
      # transformers' rule: no output.weight means the head is the embedding.
      "tie_word_embeddings": "output.weight" not in tensor_names,
      "attention_bias": any(n.endswith(".attn_q.bias") for n in tensor_names),
      "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
      "eos_token_id": int(eos) if eos is not None else None,
      "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
  }
  if rope_dims and arch != "llama" and int(rope_dims) != head_dim:
    d["partial_rotary_factor"] = int(rope_dims) / head_dim
  window = _field(reader, f"{arch}.attention.sliding_window")
  if window:
    d["sliding_window"] = int(window)
    if arch in ("qwen2", "qwen3"):
      d["use_sliding_window"] = True
  d["rope_scaling"] = _rope_scaling(reader, path, arch)
  return d


def _rope_scaling(reader, path: str, arch: str) -> dict[str, Any] | None:
  """HF `rope_scaling` from `{arch}.rope.scaling.*` metadata and, for longrope, the rope_factors_* tensors."""
  by_name = {t.name: t for t in reader.tensors}
  if "rope_freqs.weight" in by_name:
    # llama3-style scaling is stored only as precomputed per-frequency divisors, which RopeConfig cannot express.
    raise UnsupportedModelError(f"{path}: tensor 'rope_freqs.weight' (llama3-style rope scaling baked into "
                                f"frequencies) is not supported; load the Hugging Face safetensors checkpoint")
  key = lambda s: f"{arch}.rope.scaling.{s}"
  orig = _field(reader, key("original_context_length"))
  if all(n in by_name for n in _ROPE_FACTORS):
    if orig is None:
      raise ConfigError(f"{path}: longrope factors present but {key('original_context_length')!r} is missing")
    out = {
        "rope_type": "longrope",
        "long_factor": [float(x) for x in np.asarray(by_name["rope_factors_long.weight"].data, np.float32)],
        "short_factor": [float(x) for x in np.asarray(by_name["rope_factors_short.weight"].data, np.float32)],
        "original_max_position_embeddings": int(orig),
    }
    attn = _field(reader, key("attn_factor"))
    if attn is not None:
      out["attention_factor"] = float(attn)
    return out
  kind = _field(reader, key("type"))
  if kind in (None, "none"):
    return None
  factor = _field(reader, key("factor"))
  if kind == "linear":
    return {"rope_type": "linear", "factor": float(factor)}
  if kind == "yarn":
    out = {"rope_type": "yarn", "factor": float(factor),
           "original_max_position_embeddings": int(orig) if orig is not None else None}
    for gguf_key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
      v = _field(reader, key(gguf_key))
      if v is not None:
        out[hf_key] = float(v)
    return out
  raise UnsupportedModelError(f"{path}: {key('type')} = {kind!r} is not supported; supported: none, linear, yarn")


# -------------------------------------------------------------------------------------- tensors


def _hf_name(name: str, arch: str) -> str | None:
  if name in _GLOBAL:
    return _GLOBAL[name]
  m = _BLOCK_RE.match(name)
  table = _PHI3_BLOCK if arch == "phi3" else _BLOCK
  if m and m.group(2) in table:
    return f"model.layers.{m.group(1)}.{table[m.group(2)]}.{m.group(3)}"
  return None


def _check_dequantisable(path: str, tensors) -> None:
  """Fails before any weight is loaded if some quant type has no dequantiser in the installed `gguf`."""
  from gguf import GGMLQuantizationType, quants

  seen = {}
  for t in tensors:
    seen.setdefault(t.tensor_type, t)
  for qtype, t in seen.items():
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16):
      continue
    probe = t.data[:1] if t.data.ndim > 1 else t.data  # one row holds whole blocks; enough to test the type
    try:
      quants.dequantize(probe, qtype)
    except NotImplementedError as e:
      raise UnsupportedModelError(f"{path}: tensor {t.name!r} has quant type {qtype.name}, which the installed "
                                  f"gguf package cannot dequantise") from e


def _loader(t, hf_shape: tuple[int, ...], unpermute_heads: int | None) -> Callable[[], np.ndarray]:
  """A zero-arg loader of one tensor in HF layout: float types as stored (memory-mapped), quantised -> float32."""

  def load() -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    if t.tensor_type == GGMLQuantizationType.F32:
      x = t.data.view(np.float32)
    elif t.tensor_type == GGMLQuantizationType.F16:
      x = t.data.view(np.float16)
    elif t.tensor_type == GGMLQuantizationType.BF16:
      x = t.data.view(ml_dtypes.bfloat16)  # the reader hands BF16 over as raw bytes
    else:
      x = quants.dequantize(t.data, t.tensor_type)
    x = x.reshape(hf_shape)
    if unpermute_heads is not None:
      x = reverse_llama_cpp_permute(x, unpermute_heads)
    return x

  return load


def read_gguf(path: str | os.PathLike) -> tuple[ModelConfig, TensorStream]:
  """Reads a GGUF file's config and returns it with a lazy (HF name, loader, HF shape) stream of its tensors.

  Raises UnsupportedModelError naming the architecture, tensor or quant type that is not supported, before any
  weight is dequantised.
  """
  from gguf import GGUFReader

  path = str(path)
  try:
    reader = GGUFReader(path)
  except (ValueError, OSError) as e:
    raise CheckpointError(f"{path}: not a readable GGUF file ({e})") from e
  arch = _field(reader, "general.architecture")
  if arch not in ARCHITECTURES:
    raise UnsupportedModelError(f"{path}: GGUF general.architecture {arch!r} is not supported; supported: "
                                f"{sorted(ARCHITECTURES)}")
  names = {t.name for t in reader.tensors}
  cfg = ModelConfig.from_hf_dict(_config_dict(reader, path, arch, names), source=path)

  plan = []
  for t in reader.tensors:
    if t.name in _ROPE_FACTORS:
      continue
    hf = _hf_name(t.name, arch)
    if hf is None:
      raise UnsupportedModelError(f"{path}: GGUF tensor {t.name!r} of a {arch} model has no Hugging Face "
                                  f"counterpart here")
    if arch == "phi3" and re.search(r"\.attn_[qkv]\.", t.name):
      raise UnsupportedModelError(f"{path}: tensor {t.name!r}: Phi-3 with separate q/k/v projections is not "
                                  f"supported (expected fused attn_qkv)")
    heads = None
    if arch == "llama" and re.search(r"\.attn_q\.", t.name):
      heads = cfg.num_heads
    elif arch == "llama" and re.search(r"\.attn_k\.", t.name):
      heads = cfg.num_kv_heads  # k was permuted over its own (KV) heads
    # ggml lists dimensions fastest-first; HF (torch) lists them slowest-first.
    hf_shape = tuple(int(n) for n in reversed(t.shape.tolist()))
    plan.append((hf, t, hf_shape, heads))
  _check_dequantisable(path, [t for _, t, _, _ in plan])

  def stream() -> TensorStream:
    for hf, t, hf_shape, heads in plan:
      yield hf, _loader(t, hf_shape, heads), hf_shape

  return cfg, stream()
