"""Checkpoint tables (HF tensor name <-> module path + transform), safetensors I/O, and the streaming loader.

One table per family (tunix style). Each rule maps one Hugging Face tensor to one or more of our parameters with a
transform, and runs backwards for export. The loader builds an abstract model with `nnx.eval_shape`, then reads
one tensor at a time (memory-mapped, in its stored dtype), transforms and casts it, and puts it straight onto its
final sharding.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import struct
from typing import Callable, Iterable, Iterator

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from reprobe_jax.io.atomic import atomic_open
from reprobe_jax.errors import CheckpointError
from reprobe_jax.models.config import ModelConfig, is_int
from reprobe_jax.models.sharding import ShardingCtx
from reprobe_jax.models.transformer import Decoder
from reprobe_jax.io.readers import read_json

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
  return tuple(np.ascontiguousarray(p.T) for p in (x[:q], x[q:q + kv], x[q + kv:]))


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
_SEPARATE_QKV = [Rule(M + f"self_attn.{p}_proj.weight", (L + f"self_attn.{p}_proj.kernel",), _t, _untranspose)
                 for p in "qkv"]
_QKV_BIAS = [Rule(M + f"self_attn.{p}_proj.bias", (L + f"self_attn.{p}_proj.bias",), _same, _unsame) for p in "qkv"]
_SEPARATE_MLP = [Rule(M + f"mlp.{p}_proj.weight", (L + f"mlp.{p}_proj.kernel",), _t, _untranspose)
                 for p in ("gate", "up")]
_QK_NORM = [Rule(M + f"self_attn.{p}_norm.weight", (L + f"self_attn.{p}_norm.scale",), _same, _unsame)
            for p in "qk"]
# Gemma 3 (weights zero-centred, as HF stores them: the module computes 1 + w).
_SANDWICH_NORMS = [Rule(M + f"{p}_feedforward_layernorm.weight", (L + f"{p}_feedforward_layernorm.scale",), _same,
                        _unsame) for p in ("pre", "post")]
_PHI3 = [
    Rule(M + "self_attn.qkv_proj.weight", tuple(L + f"self_attn.{p}_proj.kernel" for p in "qkv"), _split_qkv,
         _join_rows),
    Rule(M + "mlp.gate_up_proj.weight", (L + "mlp.gate_proj.kernel", L + "mlp.up_proj.kernel"), _split_gate_up,
         _join_rows),
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
_MULTIMODAL_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                        ("language_model.lm_head.", "lm_head."))
_MULTIMODAL_SKIP = re.compile(r"^(model\.)?(vision_tower|multi_modal_projector)\.")


def language_model_tensors(tensors: Iterable[tuple[str, Callable[[], np.ndarray], tuple[int, ...]]]):
  """The tensors of a multimodal Gemma 3 checkpoint that make its language model, under Gemma3ForCausalLM names."""
  for name, get, shape in tensors:
    if _MULTIMODAL_SKIP.match(name):
      continue
    for old, new in _MULTIMODAL_PREFIXES:
      if name.startswith(old):
        name = new + name[len(old):]
        break
    yield name, get, shape


def _compile(rules: list[Rule]):
  """[(regex over HF names, rule)], with {i} matching the layer number."""
  return [(re.compile("^" + re.escape(r.hf).replace(re.escape("{i}"), r"(\d+)") + "$"), r) for r in rules]


# Tensors that HF checkpoints may carry but that hold no parameters.
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$|\.masked_bias$|\.attn\.bias$")

# ------------------------------------------------------------------------------------------------ safetensors

_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "I64": np.int64,
    "I32": np.int32, "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16,
    "U8": np.uint8, "BOOL": np.bool_, "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
}
_ST_NAMES = {np.dtype(v): k for k, v in _ST_DTYPES.items()}
_ST_MAX_HEADER = 100_000_000  # the reference (Rust) reader's limit
_ST_FIELDS = {"dtype", "shape", "data_offsets"}


def _unique_keys(pairs):
  """json object_pairs_hook: a JSON object whose keys repeat is refused (json.loads would keep the last)."""
  out = {}
  for k, v in pairs:
    if k in out:
      raise ValueError(f"key {k!r} appears twice")
    out[k] = v
  return out


class SafetensorsFile:
  """A memory-mapped safetensors file: names, shapes and one tensor at a time, in its stored dtype.

  The header is validated as the reference reader does, before any tensor is read: its length fits the file, it is
  a UTF-8 JSON object with no repeated keys, `__metadata__` maps strings to strings, and every tensor has a known
  dtype, a shape of non-negative ints and data_offsets [begin, end] with end - begin = prod(shape) x itemsize; the
  tensors tile the data section exactly (from 0, no overlap, no gap, nothing after the last). Any violation is a
  CheckpointError naming the file and the tensor."""

  def __init__(self, path: str):
    self.path = path = os.fspath(path)
    try:
      size = os.path.getsize(path)
      with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
          raise CheckpointError(f"{path}: not a valid safetensors file (it has {size} bytes, fewer than the 8 of the "
                                f"header length)")
        (n,) = struct.unpack("<Q", prefix)
        if n > min(size - 8, _ST_MAX_HEADER):
          raise CheckpointError(f"{path}: not a valid safetensors file (header length {n} exceeds the {size - 8} "
                                f"bytes after it or the {_ST_MAX_HEADER}-byte limit)")
        raw = f.read(n)
    except OSError as e:
      raise CheckpointError(f"{path}: cannot read safetensors file ({e.strerror or e})") from None
    try:
      header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as e:
      raise CheckpointError(f"{path}: not a valid safetensors file (header is not UTF-8: byte 0x{raw[e.start]:02x} "
                            f"at offset {8 + e.start})") from None
    except ValueError as e:  # JSONDecodeError, a repeated key, an int past the digit limit
      raise CheckpointError(f"{path}: not a valid safetensors file (header is not valid JSON: {e})") from None
    if not isinstance(header, dict):
      raise CheckpointError(f"{path}: not a valid safetensors file (header is not a JSON object)")
    self.metadata = _check_st_metadata(path, header.pop("__metadata__", {}))
    self._offset = 8 + n
    self.header = _check_st_entries(path, header, size - self._offset)
    self._mm = None

  def keys(self) -> list[str]:
    return list(self.header)

  def shape(self, key: str) -> tuple[int, ...]:
    return tuple(self.header[key]["shape"])

  def get(self, key: str) -> np.ndarray:
    info = self.header[key]
    if self._mm is None:
      self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
    b, e = info["data_offsets"]
    raw = self._mm[self._offset + b:self._offset + e]
    return raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])


def _check_st_metadata(path: str, meta) -> dict[str, str]:
  if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
    raise CheckpointError(f"{path}: not a valid safetensors file (__metadata__ must map strings to strings, got "
                          f"{json.dumps(meta)[:80]})")
  return meta


def _check_st_entries(path: str, header: dict, data_size: int) -> dict:
  """The header's tensor entries, each checked; they must tile [0, data_size) in offset order."""
  spans = []
  for name, info in header.items():
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict) or set(info) != _ST_FIELDS:
      got = sorted(info) if isinstance(info, dict) else type(info).__name__
      raise CheckpointError(f"{where}: entry must have exactly the keys {sorted(_ST_FIELDS)}, got {got}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _ST_DTYPES:
      raise CheckpointError(f"{where}: unsupported dtype {dtype!r}; supported: {sorted(_ST_DTYPES)}")
    if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
      raise CheckpointError(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_int(o) for o in offsets)):
      raise CheckpointError(f"{where}: data_offsets must be two integers [begin, end], got {offsets!r}")
    itemsize = np.dtype(_ST_DTYPES[dtype]).itemsize
    if math.prod(d for d in shape if d) * itemsize >= 2**63:  # numpy refuses such a shape even with a 0 in it
      raise CheckpointError(f"{where}: shape {shape} is too large for an array")
    begin, end = offsets
    if not 0 <= begin <= end:
      raise CheckpointError(f"{where}: data_offsets {offsets} must satisfy 0 <= begin <= end")
    nbytes = math.prod(shape) * itemsize
    if end - begin != nbytes:
      raise CheckpointError(f"{where}: data_offsets {offsets} span {end - begin} bytes, but shape {shape} of "
                            f"{dtype} needs {nbytes}")
    spans.append((begin, end, name))
  spans.sort()
  position, previous = 0, None
  for begin, end, name in spans:
    if begin < position:
      raise CheckpointError(f"{path}: tensor {name!r} (bytes {begin}..{end}) overlaps tensor {previous!r}")
    if begin > position:
      raise CheckpointError(f"{path}: tensor {name!r} starts at byte {begin} of the data, leaving bytes "
                            f"{position}..{begin} unassigned")
    position, previous = end, name
  if position > data_size:
    raise CheckpointError(f"{path}: truncated: its tensors need {position} bytes of data, the file has {data_size}")
  if position < data_size:
    raise CheckpointError(f"{path}: {data_size - position} bytes after the last tensor (the data section must end "
                          f"with it)")
  return header


def write_safetensors(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
  """Writes tensors atomically (temp file, then rename)."""
  header, offset = {}, 0
  if metadata:
    header["__metadata__"] = metadata
  arrays = {}
  for k, v in tensors.items():
    v = np.ascontiguousarray(v)
    header[k] = {"dtype": _ST_NAMES[v.dtype], "shape": list(v.shape), "data_offsets": [offset, offset + v.nbytes]}
    arrays[k] = v
    offset += v.nbytes
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  with atomic_open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for v in arrays.values():
      f.write(v.tobytes())


_INDEX = "model.safetensors.index.json"


def _index_file_name(index: str, tensor: str, name) -> str:
  """A shard name from the index, which must name a file inside the model folder (no absolute path, no '..')."""
  if not isinstance(name, str) or not name:
    raise CheckpointError(f"{index}: weight_map[{tensor!r}] must be a file name, got {name!r}")
  parts = re.split(r"[\\/]", name)
  if os.path.isabs(name) or re.match(r"^[A-Za-z]:", name) or ".." in parts or "\x00" in name:
    raise CheckpointError(f"{index}: weight_map[{tensor!r}] = {name!r} points outside the model folder")
  return os.path.normpath(name)


def hf_safetensors_files(directory: str) -> list[SafetensorsFile]:
  """The safetensors files of a HF directory, headers validated, each tensor name in exactly one file.

  With model.safetensors.index.json, its weight_map must name files inside the folder that exist, and each file
  must hold exactly the tensors the index assigns to it; any other *.safetensors file in the folder must not hold
  a tensor of the same name. Without an index, every *.safetensors file is read and no name may repeat."""
  index = os.path.join(directory, _INDEX)
  listed = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
  if os.path.exists(index):
    weight_map = read_json(index, "safetensors index").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
      raise CheckpointError(f"{index}: weight_map must be a non-empty object of tensor name -> file name")
    assigned: dict[str, set[str]] = {}
    for tensor, name in weight_map.items():
      assigned.setdefault(_index_file_name(index, tensor, name), set()).add(tensor)
    files = []
    for name in sorted(assigned):
      path = os.path.join(directory, name)
      if not os.path.isfile(path):
        raise CheckpointError(f"{path}: listed in the index but missing")
      st = SafetensorsFile(path)
      absent = sorted(assigned[name] - set(st.keys()))
      if absent:
        raise CheckpointError(f"{index}: tensors {absent[:4]} are assigned to {name}, which does not hold them")
      extra = sorted(set(st.keys()) - assigned[name])
      if extra:
        where = {t: weight_map.get(t) for t in extra[:4]}
        raise CheckpointError(f"{path}: holds tensors that the index assigns elsewhere (or nowhere): {where}")
      files.append(st)
    strays = [SafetensorsFile(os.path.join(directory, f)) for f in listed
              if os.path.normpath(f) not in assigned]
  else:
    if not listed:
      raise CheckpointError(f"{directory}: no *.safetensors files (and no {_INDEX})")
    files, strays = [SafetensorsFile(os.path.join(directory, f)) for f in listed], []
  owner: dict[str, str] = {}
  for st in files + strays:
    for key in st.keys():
      if key in owner:
        raise CheckpointError(f"{directory}: tensor {key!r} is in both {owner[key]} and {st.path}; a model folder "
                              f"must hold each tensor once (two checkpoints mixed in one folder?)")
      owner[key] = st.path
  return files


def iter_hf_tensors(directory: str) -> Iterator[tuple[str, Callable[[], np.ndarray], tuple[int, ...]]]:
  """(name, lazy loader, shape) for every tensor of a HF directory, sharded (with index) or not; every header is
  validated and duplicate names refused before the first tensor is yielded."""
  for st in hf_safetensors_files(directory):
    for key in st.keys():
      yield key, (lambda st=st, key=key: st.get(key)), st.shape(key)


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


def load_tensors(cfg: ModelConfig, tensors: Iterable[tuple[str, Callable[[], np.ndarray], tuple[int, ...]]], *,
                 dtype=jnp.float32, shard: ShardingCtx | None = None, source: str = "checkpoint"):
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
      raise CheckpointError(f"{source}: unexpected tensor {name!r} {list(shape)} for a {cfg.family} model "
                            f"(mismatched checkpoint or config?)")
    if layer is not None and int(layer) >= cfg.num_layers:
      raise CheckpointError(f"{source}: tensor {name!r} belongs to layer {layer}, but the config has "
                            f"{cfg.num_layers} layers")
    parts = rule.load(np.asarray(get()), cfg)
    for template, arr in zip(rule.ours, parts):
      path = template.format(i=layer)
      var = abstract[path]
      want = tuple(var.get_value().shape)
      if tuple(arr.shape) != want:
        raise CheckpointError(f"{source}: tensor {name!r} has shape {list(shape)}, which maps to {list(arr.shape)} "
                              f"for {path}; the config expects {list(want)}")
      host = np.asarray(arr).astype(dtype) if np.dtype(arr.dtype) != np.dtype(dtype) else arr
      placement = _placement(var, shard, want)
      values[path] = jax.device_put(host, placement) if placement is not None else jnp.asarray(host)
  missing = sorted(set(abstract) - set(values))
  if missing:
    names = [_hf_name_for(cfg, p) for p in missing]
    raise CheckpointError(f"{source}: missing tensors {names[:8]}{' ...' if len(names) > 8 else ''} "
                          f"({len(names)} in all)")
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
  flat = {".".join(str(p) for p in path): np.asarray(jax.device_get(v.get_value() if hasattr(v, "get_value")
                                                                   else v))
          for path, v in nnx.to_flat_state(state)}
  out = {}
  for rule in family_rules(cfg):
    layers = range(cfg.num_layers) if "{i}" in rule.hf else [None]
    for i in layers:
      parts = tuple(flat[t.format(i=i)].astype(np.float32) for t in rule.ours)
      out[rule.hf.format(i=i)] = np.ascontiguousarray(rule.save(parts, cfg)).astype(dtype)
  return out
