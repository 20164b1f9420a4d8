"""Checkpoint tables (HF tensor name <-> module path + transform), the streaming loader, and export.

One table per family (tunix style). Each rule maps one Hugging Face tensor to one or more of our parameters with a
transform, and runs backwards for export. The loader builds an abstract model with `nnx.eval_shape`, then reads
one tensor at a time (memory-mapped, in its stored dtype: `safetensors_io.iter_hf_tensors`, `gguf_io.read_gguf`),
transforms and casts it, and puts it straight onto its final sharding.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from reprobe_jax.errors import CheckpointError
from reprobe_jax.models.config import ModelConfig
from reprobe_jax.models.sharding import ShardingCtx
from reprobe_jax.models.transformer import Decoder

# ------------------------------------------------------------------------------------------------ tables


@dataclasses.dataclass(frozen=True)
class Rule:
  """HF tensor `hf` (with {i} for the layer) <-> our parameter paths `ours`; `load` splits, `save` joins."""

  hf: str
  ours: tuple[str, ...]
  load: Callable[[np.ndarray, ModelConfig], tuple[np.ndarray, ...]]
  save: Callable[[tuple[np.ndarray, ...], ModelConfig], np.ndarray]


def _same(x, cfg):
  return (x,)


def _unsame(xs, cfg):
  return xs[0]


def _t(x, cfg):  # torch Linear [out, in] -> kernel [in, out]
  return (np.ascontiguousarray(x.T),)


def _untranspose(xs, cfg):
  return np.ascontiguousarray(xs[0].T)


def _split_qkv(x, cfg):  # Phi-3 qkv_proj [(H + 2 KV) * Dh, D]
  q = cfg.num_heads * cfg.head_dim
  kv = cfg.num_kv_heads * cfg.head_dim
  if x.shape[0] != q + 2 * kv:
    raise CheckpointError(f"qkv_proj has {x.shape[0]} rows, expected {q + 2 * kv}")
  return tuple(np.ascontiguousarray(p.T) for p in (x[:q], x[q : q + kv], x[q + kv :]))


def _join_rows(xs, cfg):
  return np.concatenate([np.ascontiguousarray(p.T) for p in xs], axis=0)


def _split_gate_up(x, cfg):  # Phi-3 gate_up_proj [2 F, D], gate first
  f = cfg.intermediate_size
  if x.shape[0] != 2 * f:
    raise CheckpointError(f"gate_up_proj has {x.shape[0]} rows, expected {2 * f}")
  return (np.ascontiguousarray(x[:f].T), np.ascontiguousarray(x[f:].T))


L = "layers.{i}."
M = "model.layers.{i}."
_COMMON = [
  Rule("model.embed_tokens.weight", ("embed_tokens",), _same, _unsame),
  Rule("model.norm.weight", ("norm.scale",), _same, _unsame),
  Rule("lm_head.weight", ("lm_head",), _t, _untranspose),
  Rule(M + "input_layernorm.weight", (L + "input_layernorm.scale",), _same, _unsame),
  Rule(M + "post_attention_layernorm.weight", (L + "post_attention_layernorm.scale",), _same, _unsame),
  Rule(M + "self_attn.o_proj.weight", (L + "self_attn.o_proj.kernel",), _t, _untranspose),
  Rule(M + "mlp.down_proj.weight", (L + "mlp.down_proj.kernel",), _t, _untranspose),
]
_SEPARATE_QKV = [
  Rule(M + f"self_attn.{p}_proj.weight", (L + f"self_attn.{p}_proj.kernel",), _t, _untranspose) for p in "qkv"
]
_QKV_BIAS = [Rule(M + f"self_attn.{p}_proj.bias", (L + f"self_attn.{p}_proj.bias",), _same, _unsame) for p in "qkv"]
_SEPARATE_MLP = [
  Rule(M + f"mlp.{p}_proj.weight", (L + f"mlp.{p}_proj.kernel",), _t, _untranspose) for p in ("gate", "up")
]
_QK_NORM = [Rule(M + f"self_attn.{p}_norm.weight", (L + f"self_attn.{p}_norm.scale",), _same, _unsame) for p in "qk"]
# Gemma 3 (weights zero-centred, as HF stores them: the module computes 1 + w).
_SANDWICH_NORMS = [
  Rule(M + f"{p}_feedforward_layernorm.weight", (L + f"{p}_feedforward_layernorm.scale",), _same, _unsame)
  for p in ("pre", "post")
]
_PHI3 = [
  Rule(M + "self_attn.qkv_proj.weight", tuple(L + f"self_attn.{p}_proj.kernel" for p in "qkv"), _split_qkv, _join_rows),
  Rule(
    M + "mlp.gate_up_proj.weight", (L + "mlp.gate_proj.kernel", L + "mlp.up_proj.kernel"), _split_gate_up, _join_rows
  ),
]


def family_rules(cfg: ModelConfig) -> list[Rule]:
  """The table for this config's family (and options such as biases and tied embeddings)."""
  rules = [r for r in _COMMON if not (cfg.tie_word_embeddings and r.hf == "lm_head.weight")]
  if cfg.family == "phi3":
    return rules + _PHI3
  rules += _SEPARATE_QKV + _SEPARATE_MLP
  if cfg.attention_bias:
    rules += _QKV_BIAS
  if cfg.qk_norm:
    rules += _QK_NORM
  if cfg.sandwich_norms:
    rules += _SANDWICH_NORMS
  return rules


# A multimodal Gemma 3 checkpoint (Gemma3ForConditionalGeneration) holds the language model under other prefixes:
# transformers >= 4.52 names it model.language_model.*, and writes (and older versions named) language_model.model.*
# and language_model.lm_head.*. The vision tower and projector are not part of the LM.
_MULTIMODAL_PREFIXES = (
  ("model.language_model.", "model."),
  ("language_model.model.", "model."),
  ("language_model.lm_head.", "lm_head."),
)
_MULTIMODAL_SKIP = re.compile(r"^(model\.)?(vision_tower|multi_modal_projector)\.")


def language_model_tensors(tensors: Iterable[tuple[str, Callable[[], np.ndarray], tuple[int, ...]]]):
  """The tensors of a multimodal Gemma 3 checkpoint that make its language model, under Gemma3ForCausalLM names."""
  for name, get, shape in tensors:
    if _MULTIMODAL_SKIP.match(name):
      continue
    for old, new in _MULTIMODAL_PREFIXES:
      if name.startswith(old):
        name = new + name[len(old) :]
        break
    yield name, get, shape


def _compile(rules: list[Rule]):
  """[(regex over HF names, rule)], with {i} matching the layer number."""
  return [(re.compile("^" + re.escape(r.hf).replace(re.escape("{i}"), r"(\d+)") + "$"), r) for r in rules]


# Tensors that HF checkpoints may carry but that hold no parameters.
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$|\.masked_bias$|\.attn\.bias$")

# ------------------------------------------------------------------------------------------------ loading


def abstract_model(cfg: ModelConfig, dtype) -> tuple[nnx.GraphDef, dict]:
  """GraphDef and {path: abstract Param} without allocating any weights."""
  model = nnx.eval_shape(lambda: Decoder(cfg, dtype=dtype, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  flat = {".".join(str(p) for p in path): var for path, var in nnx.to_flat_state(state)}
  return graphdef, flat


def _placement(var, ctx: ShardingCtx | None, shape):
  if ctx is None:
    return None
  return ctx.sharding(var.get_metadata().get("logical_axes", (None,) * len(shape)), shape)


def load_tensors(
  cfg: ModelConfig,
  tensors: Iterable[tuple[str, Callable[[], np.ndarray], tuple[int, ...]]],
  *,
  dtype=jnp.float32,
  shard: ShardingCtx | None = None,
  source: str = "checkpoint",
):
  """Streams HF-named tensors into a Decoder. Returns (graphdef, state). Errors name the offending tensor."""
  graphdef, abstract = abstract_model(cfg, dtype)
  compiled = _compile(family_rules(cfg))
  values: dict[str, jax.Array] = {}
  tied_head = None
  seen: set[str] = set()
  for name, get, shape in tensors:
    if name in seen:
      raise CheckpointError(f"{source}: tensor {name!r} appears twice")
    seen.add(name)
    rule, layer = None, None
    for rx, r in compiled:
      m = rx.match(name)
      if m:
        rule, layer = r, (m.group(1) if m.groups() else None)
        break
    if rule is None:
      if _IGNORED.search(name):
        continue
      if cfg.tie_word_embeddings and name == "lm_head.weight":
        tied_head = get  # some tied checkpoints store the head anyway; it must equal the embedding
        continue
      raise CheckpointError(
        f"{source}: unexpected tensor {name!r} {list(shape)} for a {cfg.family} model "
        f"(mismatched checkpoint or config?)"
      )
    if layer is not None and int(layer) >= cfg.num_layers:
      raise CheckpointError(
        f"{source}: tensor {name!r} belongs to layer {layer}, but the config has {cfg.num_layers} layers"
      )
    parts = rule.load(np.asarray(get()), cfg)
    for template, arr in zip(rule.ours, parts):
      path = template.format(i=layer)
      var = abstract[path]
      want = tuple(var.get_value().shape)
      if tuple(arr.shape) != want:
        raise CheckpointError(
          f"{source}: tensor {name!r} has shape {list(shape)}, which maps to {list(arr.shape)} "
          f"for {path}; the config expects {list(want)}"
        )
      host = np.asarray(arr).astype(dtype) if np.dtype(arr.dtype) != np.dtype(dtype) else arr
      placement = _placement(var, shard, want)
      values[path] = jax.device_put(host, placement) if placement is not None else jnp.asarray(host)
  missing = sorted(set(abstract) - set(values))
  if missing:
    names = [_hf_name_for(cfg, p) for p in missing]
    raise CheckpointError(
      f"{source}: missing tensors {names[:8]}{' ...' if len(names) > 8 else ''} ({len(names)} in all)"
    )
  if tied_head is not None:
    head = np.asarray(tied_head()).astype(np.float32)
    if not np.allclose(head, np.asarray(values["embed_tokens"], np.float32)):
      raise CheckpointError(f"{source}: tie_word_embeddings=True but lm_head.weight differs from the embedding")
  return graphdef, _fill(graphdef, abstract, values)


def _path_key(p: str):
  return int(p) if p.isdigit() else p


def _fill(graphdef, abstract, values):
  flat = []
  for path, var in abstract.items():
    flat.append((tuple(_path_key(p) for p in path.split(".")), var.replace(values[path])))
  return nnx.from_flat_state(flat)


def _hf_name_for(cfg: ModelConfig, path: str) -> str:
  m = re.match(r"layers\.(\d+)\.(.*)", path)
  layer, rest = (m.group(1), "layers.{i}." + m.group(2)) if m else (None, path)
  for r in family_rules(cfg):
    if rest in r.ours:
      return r.hf.format(i=layer)
  return path


def export_tensors(cfg: ModelConfig, state, dtype=np.float32) -> dict[str, np.ndarray]:
  """Our state -> {HF name: array}, the tables run backwards."""
  flat = {
    ".".join(str(p) for p in path): np.asarray(jax.device_get(v.get_value() if hasattr(v, "get_value") else v))
    for path, v in nnx.to_flat_state(state)
  }
  out = {}
  for rule in family_rules(cfg):
    layers = range(cfg.num_layers) if "{i}" in rule.hf else [None]
    for i in layers:
      parts = tuple(flat[t.format(i=i)].astype(np.float32) for t in rule.ours)
      out[rule.hf.format(i=i)] = np.ascontiguousarray(rule.save(parts, cfg)).astype(dtype)
  return out
