"""The GGUF (llama.cpp) file format: a bounded parser, typed metadata reads, and tensors dequantised on demand.

`open_gguf` parses the file's structure, every length, count and offset bounded by the file size before anything
is allocated; tensors stay memory-mapped. `GGUFMeta` reads metadata values with their GGUF types checked, and
`dequantise` turns one tensor's bytes into values only when it is called (float types as stored, quantised types
to float32), so a quantised 8B file never sits in memory as float32 all at once. What the metadata and tensors mean
for our model (its config, Hugging Face tensor names, llama.cpp's layout conventions) is `gguf_io.py`'s.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
import struct
from typing import Any

import ml_dtypes
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, quants

from reprobe_jax.errors import CheckpointError, ConfigError, UnsupportedModelError
from reprobe_jax.io.seal import regular_file

_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_MAX_DIMS = 4  # GGML_MAX_DIMS
# GGUF value type id -> numpy dtype of its scalars; 8 is STRING, 9 is ARRAY.
_SCALAR_DTYPES = {
  0: "<u1",
  1: "<i1",
  2: "<u2",
  3: "<i2",
  4: "<u4",
  5: "<i4",
  6: "<f4",
  7: "<u1",
  10: "<u8",
  11: "<i8",
  12: "<f8",
}
_STRING, _ARRAY, _BOOL = 8, 9, 7
_INT_TYPES = (0, 1, 2, 3, 4, 5, 10, 11)
_FLOAT_TYPES = (6, 12)
_REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class GGUFField:
  """One metadata value: its GGUF type, and for an array the type of its items. Strings are str; arrays of
  strings are lists of raw bytes (only their count is read here); other arrays are numpy arrays."""

  type: int
  value: Any
  item_type: int | None = None


@dataclasses.dataclass(frozen=True)
class GGUFTensor:
  """One tensor's header: ggml type, shape in ggml order (fastest dimension first) and its bytes, memory-mapped."""

  name: str
  tensor_type: Any  # gguf.GGMLQuantizationType
  shape: tuple[int, ...]
  data: np.ndarray  # uint8, [..., bytes per row] in HF (slowest-first) order


@dataclasses.dataclass(frozen=True)
class GGUFFile:
  """A parsed GGUF file: metadata fields by key and tensor headers, every length, count and offset checked
  against the file size before anything is allocated or read."""

  path: str
  fields: dict[str, GGUFField]
  tensors: tuple[GGUFTensor, ...]


class _Cursor:
  """Bounded little-endian reads over the file's bytes; running past the end is a CheckpointError naming it."""

  def __init__(self, path: str, buf):
    self.path, self.buf, self.pos, self.size = path, buf, 0, len(buf)

  def take(self, n: int, what: str) -> int:
    """The offset of the next n bytes, which must lie in the file."""
    if n > self.size - self.pos:
      raise CheckpointError(
        f"{self.path}: truncated GGUF file: {what} at byte {self.pos} needs {n} bytes, the file has {self.size}"
      )
    at, self.pos = self.pos, self.pos + n
    return at

  def scalar(self, fmt: str, what: str):
    return struct.unpack_from("<" + fmt, self.buf, self.take(struct.calcsize(fmt), what))[0]

  def raw_string(self, what: str) -> bytes:
    n = self.scalar("Q", f"length of {what}")
    return bytes(self.buf[self.take(n, what) : self.pos])

  def string(self, what: str) -> str:
    raw = self.raw_string(what)
    try:
      return raw.decode("utf-8")
    except UnicodeDecodeError:
      raise CheckpointError(f"{self.path}: {what} at byte {self.pos - len(raw)} is not UTF-8 text") from None

  def count(self, n: int, item_bytes: int, what: str) -> int:
    """n, if n items of at least `item_bytes` each fit in the rest of the file (before anything is allocated)."""
    if n * item_bytes > self.size - self.pos:
      raise CheckpointError(
        f"{self.path}: corrupt GGUF file: {what} is {n}, but {n} x {item_bytes} bytes do not fit "
        f"the {self.size - self.pos} bytes left after byte {self.pos}"
      )
    return n


def _value(cur: _Cursor, vtype: int, key: str) -> Any:
  """One metadata value; an array is (items, item type), and its items may not be arrays."""
  if vtype in _SCALAR_DTYPES:
    dt = np.dtype(_SCALAR_DTYPES[vtype])
    v = np.frombuffer(cur.buf, dt, 1, cur.take(dt.itemsize, f"value of {key!r}"))[0].item()
    if vtype == _BOOL:
      if v not in (0, 1):
        raise CheckpointError(f"{cur.path}: GGUF metadata {key!r}: bool byte is {v}, not 0 or 1")
      return bool(v)
    return v
  if vtype == _STRING:
    return cur.string(f"value of {key!r}")
  if vtype == _ARRAY:
    item = cur.scalar("I", f"item type of {key!r}")
    n = cur.scalar("Q", f"length of {key!r}")
    if item in _SCALAR_DTYPES:
      dt = np.dtype(_SCALAR_DTYPES[item])
      n = cur.count(n, dt.itemsize, f"length of array {key!r}")
      return np.frombuffer(cur.buf, dt, n, cur.take(n * dt.itemsize, f"array {key!r}")), item
    if item == _STRING:
      n = cur.count(n, 8, f"length of array {key!r}")
      return [cur.raw_string(f"item {i} of {key!r}") for i in range(n)], item
    raise CheckpointError(f"{cur.path}: GGUF metadata {key!r}: arrays of type {item} are not supported")
  raise CheckpointError(f"{cur.path}: GGUF metadata {key!r} has unknown value type {vtype}")


def open_gguf(path: str | os.PathLike) -> GGUFFile:
  """Parses a GGUF (v2/v3, little-endian) file's header, metadata and tensor table; CheckpointError naming the
  file for anything truncated, out of range, repeated or overlapping, before any tensor data is touched."""
  path = regular_file(path, "GGUF file", CheckpointError)  # a named pipe would block the read
  try:
    with open(path, "rb") as f:
      buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else b""
  except OSError as e:
    raise CheckpointError(f"{path}: cannot read GGUF file ({e.strerror or e})") from None
  cur = _Cursor(path, buf)
  if len(buf) < 4 or bytes(buf[:4]) != _MAGIC:
    raise CheckpointError(f"{path}: not a readable GGUF file (no 'GGUF' magic at the start)")
  cur.pos = 4
  version = cur.scalar("I", "version")
  if version not in _VERSIONS:
    raise UnsupportedModelError(f"{path}: GGUF version {version} is not supported (little-endian v2 / v3 only)")
  n_tensors = cur.scalar("Q", "tensor count")
  n_fields = cur.scalar("Q", "metadata count")
  cur.count(n_fields, 8 + 4 + 1, "metadata count")  # key length, type, at least one byte of value
  fields: dict[str, GGUFField] = {}
  for _ in range(n_fields):
    key = cur.string("metadata key")
    if key in fields:
      raise CheckpointError(f"{path}: GGUF metadata key {key!r} appears twice")
    vtype = cur.scalar("I", f"type of {key!r}")
    v = _value(cur, vtype, key)
    fields[key] = GGUFField(vtype, *v) if vtype == _ARRAY else GGUFField(vtype, v)

  alignment = 32
  if "general.alignment" in fields:
    a = fields["general.alignment"]
    if a.type != 4 or not a.value or a.value & (a.value - 1):
      raise CheckpointError(f"{path}: general.alignment must be a uint32 power of two, got {a.value!r}")
    alignment = a.value

  cur.count(n_tensors, 8 + 4 + 8 + 4 + 8, "tensor count")  # name length, dims count, one dim, type, offset
  infos = []
  for i in range(n_tensors):
    name = cur.string(f"name of tensor {i}")
    n_dims = cur.scalar("I", f"dimension count of {name!r}")
    if not 1 <= n_dims <= _MAX_DIMS:
      raise CheckpointError(f"{path}: tensor {name!r} has {n_dims} dimensions (1 to {_MAX_DIMS} allowed)")
    dims = tuple(cur.scalar("Q", f"dimensions of {name!r}") for _ in range(n_dims))
    raw_type = cur.scalar("I", f"type of {name!r}")
    offset = cur.scalar("Q", f"offset of {name!r}")
    try:
      qtype = GGMLQuantizationType(raw_type)
      block, type_size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
      raise CheckpointError(f"{path}: tensor {name!r} has unknown ggml type {raw_type}") from None
    if not all(d >= 1 for d in dims) or dims[0] % block:
      raise CheckpointError(
        f"{path}: tensor {name!r} has shape {list(dims)}; dimensions must be >= 1 and the first "
        f"a multiple of {qtype.name}'s block of {block}"
      )
    if offset % alignment:
      raise CheckpointError(f"{path}: tensor {name!r} offset {offset} is not a multiple of the alignment {alignment}")
    infos.append((name, qtype, dims, offset, math.prod(dims) // block * type_size, dims[0] // block * type_size))
  data_start = -(-cur.pos // alignment) * alignment

  tensors, seen, end, previous = [], set(), 0, None
  for name, qtype, dims, offset, nbytes, row_bytes in sorted(infos, key=lambda t: t[3]):
    if name in seen:
      raise CheckpointError(f"{path}: tensor {name!r} appears twice")
    seen.add(name)
    if offset < end:
      raise CheckpointError(
        f"{path}: tensor {name!r} (bytes {offset}..{offset + nbytes} of the data) overlaps tensor {previous!r}"
      )
    if data_start + offset + nbytes > len(buf):
      raise CheckpointError(
        f"{path}: truncated GGUF file: tensor {name!r} needs bytes {data_start + offset}.."
        f"{data_start + offset + nbytes}, the file has {len(buf)}"
      )
    end, previous = offset + nbytes, name
    byte_shape = (*reversed(dims[1:]), row_bytes)  # HF order, the last axis in bytes
    data = np.frombuffer(buf, np.uint8, nbytes, data_start + offset).reshape(byte_shape)
    tensors.append(GGUFTensor(name, qtype, dims, data))
  order = {name: i for i, (name, *_) in enumerate(infos)}
  return GGUFFile(path, fields, tuple(sorted(tensors, key=lambda t: order[t.name])))


def has_tokenizer(g: GGUFFile) -> bool:
  """Whether the file carries a llama.cpp tokenizer (`tokenizer.ggml.model`)."""
  return "tokenizer.ggml.model" in g.fields


# -------------------------------------------------------------------------------------- metadata


class GGUFMeta:
  """Typed reads of GGUF metadata: a value of the wrong GGUF type or out of range is a ConfigError naming the key."""

  def __init__(self, g: GGUFFile):
    self.g = g

  def _get(self, key, types, want):
    """The value, or None if the key is absent; ConfigError if it has another GGUF type."""
    f = self.g.fields.get(key)
    if f is not None and f.type not in types:
      raise ConfigError(
        f"{self.g.path}: GGUF metadata {key!r} must be {want}, got a {GGUFValueType(f.type).name.lower()}"
      )
    return None if f is None else f.value

  def _default(self, key, default):
    if default is _REQUIRED:
      raise ConfigError(f"{self.g.path}: GGUF metadata key {key!r} is missing")
    return default

  def integer(self, key, default=_REQUIRED, low: int = 1):
    v = self._get(key, _INT_TYPES, "an integer")
    if v is None:
      return self._default(key, default)
    if v < low:
      raise ConfigError(f"{self.g.path}: GGUF metadata {key!r} must be >= {low}, got {v}")
    return v

  def number(self, key, default=_REQUIRED):
    v = self._get(key, _FLOAT_TYPES + _INT_TYPES, "a number")
    if v is None:
      return self._default(key, default)
    if not (math.isfinite(v) and v > 0):
      raise ConfigError(f"{self.g.path}: GGUF metadata {key!r} must be a finite number > 0, got {v}")
    return float(v)

  def text(self, key, default=_REQUIRED):
    v = self._get(key, (_STRING,), "a string")
    return self._default(key, default) if v is None else v

  def count(self, key) -> int | None:
    f = self.g.fields.get(key)
    if f is not None and (f.type != _ARRAY or f.item_type != _STRING):
      raise ConfigError(f"{self.g.path}: GGUF metadata {key!r} must be an array of strings")
    return None if f is None else len(f.value)


# -------------------------------------------------------------------------------------- tensor values

# Float types read as views of their bytes (memory-mapped, in the stored dtype); the rest are dequantised.
_VIEWS = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}


def dequantise(t: GGUFTensor) -> np.ndarray:
  """One tensor's values, flat per row as ggml stores them: float types as stored (a view of the memory-mapped
  bytes), quantised types dequantised to float32."""
  view = _VIEWS.get(t.tensor_type.name)
  return t.data.view(view) if view is not None else quants.dequantize(t.data, t.tensor_type)


def check_dequantisable(path: str, tensors) -> None:
  """Fails before any weight is loaded if some quant type has no dequantiser in the installed `gguf`."""
  seen = {}
  for t in tensors:
    seen.setdefault(t.tensor_type, t)
  for qtype, t in seen.items():
    if qtype.name in _VIEWS:
      continue
    probe = t.data[:1] if t.data.ndim > 1 else t.data  # one row holds whole blocks; enough to test the type
    try:
      quants.dequantize(probe, qtype)
    except NotImplementedError as e:
      raise UnsupportedModelError(
        f"{path}: tensor {t.name!r} has quant type {qtype.name}, which the installed gguf package cannot dequantise"
      ) from e
