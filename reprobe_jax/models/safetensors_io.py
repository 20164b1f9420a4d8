"""Safetensors files: a checked, memory-mapped reader, an atomic writer, and the files of a Hugging Face folder.

The reader validates a file's header as the reference (Rust) reader does before any tensor is read, and serves one
tensor at a time in its stored dtype; `iter_hf_tensors` streams a model folder's tensors (sharded with
model.safetensors.index.json or not) into the loader of `checkpoint.py`.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from typing import Callable, Iterator

import ml_dtypes
import numpy as np

from reprobe_jax.errors import CheckpointError
from reprobe_jax.fields import Int
from reprobe_jax.io.atomic import atomic_open
from reprobe_jax.io.readers import read_json
from reprobe_jax.io.seal import regular_file

_ST_DTYPES = {
  "F64": np.float64,
  "F32": np.float32,
  "F16": np.float16,
  "BF16": ml_dtypes.bfloat16,
  "I64": np.int64,
  "I32": np.int32,
  "I16": np.int16,
  "I8": np.int8,
  "U64": np.uint64,
  "U32": np.uint32,
  "U16": np.uint16,
  "U8": np.uint8,
  "BOOL": np.bool_,
  "F8_E4M3": ml_dtypes.float8_e4m3fn,
  "F8_E5M2": ml_dtypes.float8_e5m2,
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
    self.path = path = regular_file(path, "safetensors file", CheckpointError)  # a named pipe would block the read
    try:
      size = os.path.getsize(path)
      with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
          raise CheckpointError(
            f"{path}: not a valid safetensors file (it has {size} bytes, fewer than the 8 of the header length)"
          )
        (n,) = struct.unpack("<Q", prefix)
        if n > min(size - 8, _ST_MAX_HEADER):
          raise CheckpointError(
            f"{path}: not a valid safetensors file (header length {n} exceeds the {size - 8} "
            f"bytes after it or the {_ST_MAX_HEADER}-byte limit)"
          )
        raw = f.read(n)
    except OSError as e:
      raise CheckpointError(f"{path}: cannot read safetensors file ({e.strerror or e})") from None
    try:
      header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as e:
      raise CheckpointError(
        f"{path}: not a valid safetensors file (header is not UTF-8: byte 0x{raw[e.start]:02x} at offset {8 + e.start})"
      ) from None
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
    raw = self._mm[self._offset + b : self._offset + e]
    return raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])


def _check_st_metadata(path: str, meta) -> dict[str, str]:
  if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
    raise CheckpointError(
      f"{path}: not a valid safetensors file (__metadata__ must map strings to strings, got {json.dumps(meta)[:80]})"
    )
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
    if not isinstance(shape, list) or not all(Int(0).ok(d) for d in shape):
      raise CheckpointError(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(Int().ok(o) for o in offsets)):
      raise CheckpointError(f"{where}: data_offsets must be two integers [begin, end], got {offsets!r}")
    itemsize = np.dtype(_ST_DTYPES[dtype]).itemsize
    if math.prod(d for d in shape if d) * itemsize >= 2**63:  # numpy refuses such a shape even with a 0 in it
      raise CheckpointError(f"{where}: shape {shape} is too large for an array")
    begin, end = offsets
    if not 0 <= begin <= end:
      raise CheckpointError(f"{where}: data_offsets {offsets} must satisfy 0 <= begin <= end")
    nbytes = math.prod(shape) * itemsize
    if end - begin != nbytes:
      raise CheckpointError(
        f"{where}: data_offsets {offsets} span {end - begin} bytes, but shape {shape} of {dtype} needs {nbytes}"
      )
    spans.append((begin, end, name))
  spans.sort()
  position, previous = 0, None
  for begin, end, name in spans:
    if begin < position:
      raise CheckpointError(f"{path}: tensor {name!r} (bytes {begin}..{end}) overlaps tensor {previous!r}")
    if begin > position:
      raise CheckpointError(
        f"{path}: tensor {name!r} starts at byte {begin} of the data, leaving bytes {position}..{begin} unassigned"
      )
    position, previous = end, name
  if position > data_size:
    raise CheckpointError(f"{path}: truncated: its tensors need {position} bytes of data, the file has {data_size}")
  if position < data_size:
    raise CheckpointError(
      f"{path}: {data_size - position} bytes after the last tensor (the data section must end with it)"
    )
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
    strays = [SafetensorsFile(os.path.join(directory, f)) for f in listed if os.path.normpath(f) not in assigned]
  else:
    if not listed:
      raise CheckpointError(f"{directory}: no *.safetensors files (and no {_INDEX})")
    files, strays = [SafetensorsFile(os.path.join(directory, f)) for f in listed], []
  owner: dict[str, str] = {}
  for st in files + strays:
    for key in st.keys():
      if key in owner:
        raise CheckpointError(
          f"{directory}: tensor {key!r} is in both {owner[key]} and {st.path}; a model folder "
          f"must hold each tensor once (two checkpoints mixed in one folder?)"
        )
      owner[key] = st.path
  return files


def iter_hf_tensors(directory: str) -> Iterator[tuple[str, Callable[[], np.ndarray], tuple[int, ...]]]:
  """(name, lazy loader, shape) for every tensor of a HF directory, sharded (with index) or not; every header is
  validated and duplicate names refused before the first tensor is yielded."""
  for st in hf_safetensors_files(directory):
    for key in st.keys():
      yield key, (lambda st=st, key=key: st.get(key)), st.shape(key)
