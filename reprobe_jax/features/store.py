"""The feature store's files: a manifest and array shards, written by `extraction.extract`, read by `FeatureStore`.

On disk, `<dir>/manifest.json` holds the format, the store's header (model fingerprint, tokenizer hash, spec,
feature dim, dtype) and the finished shards: per shard its file name, record ids, record hashes (`record_hash`: the
prompt and response tokens its features were made from), token count and `sha256` (of the shard file's bytes). Each
shard `shard_NNNNN.npz` holds `features` [tokens, F] (float32 or float16), `offsets` [n + 1], `ids` [n], `hashes`
[n] and `header` (the store's header as JSON), so a shard names what it was made from even outside its folder.

What is checked, and what happens on a mismatch:
- The manifest, on every read and resume: keys, types, shard names `shard_<digits>.npz` (no path leaves the folder),
  unique ids and files; a defect is a DataFormatError naming manifest.json. A folder made for another model,
  tokenizer, spec or dtype is refused (FeatureMismatchError).
- A shard, when `FeatureStore` first reads it: its bytes against `sha256`, then its arrays (shapes, dtype, offsets)
  and its embedded ids, record hashes and header against the manifest. Damage (missing, zero-byte, truncated,
  changed bytes) is a DataFormatError naming the shard; a shard made for other records or another store (copied in
  with its manifest entry) is a FeatureMismatchError. Nothing wrong is served.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import zipfile
import zlib
from typing import Any, Sequence

import numpy as np

from reprobe_jax.errors import ConfigError, DataFormatError, ReprobeError
from reprobe_jax.features.spec import FeatureSpec
from reprobe_jax.fields import Int
from reprobe_jax.io.readers import read_json, shown
from reprobe_jax.trajectories.record import Trajectory

MANIFEST = "manifest.json"
FORMAT = "reprobe-features"
FORMAT_VERSION = 2  # 2: shards carry record hashes, an embedded header and a content hash
HEADER_KEYS = ("model_fingerprint", "tokenizer_hash", "spec", "feature_dim", "dtype")
DTYPES = ("float32", "float16")
_SHARD_NAME = re.compile(r"shard_\d{5,}\.npz")


class FeatureMismatchError(ReprobeError):
  """Stored features were made by another model, tokenizer or feature spec than the one asked for."""


def record_hash(record: Trajectory) -> str:
  """What a record's features depend on: its prompt and response token ids."""
  blob = json.dumps([list(map(int, record.prompt_ids)), list(map(int, record.response_ids))])
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ manifest


def _str_list(v: Any) -> bool:
  return isinstance(v, list) and all(isinstance(x, str) and x for x in v)


_MANIFEST_FIELDS = (  # (key, check, what it must be)
  ("model_fingerprint", lambda v: isinstance(v, str), "a string"),
  ("tokenizer_hash", lambda v: isinstance(v, str), "a string"),
  ("spec", lambda v: isinstance(v, dict), "an object (a FeatureSpec)"),
  ("feature_dim", Int(1).ok, "an integer >= 1"),
  ("dtype", lambda v: v in DTYPES, f"one of {', '.join(DTYPES)}"),
  ("shards", lambda v: isinstance(v, list), "a list of shard entries"),
  ("complete", lambda v: isinstance(v, bool), "true or false"),
)
_SHARD_FIELDS = (
  (
    "file",
    lambda v: isinstance(v, str) and bool(_SHARD_NAME.fullmatch(v)),
    "a file name shard_<digits>.npz inside the folder",
  ),
  ("ids", _str_list, "a list of non-empty strings (trajectory ids)"),
  ("hashes", _str_list, "a list of record hashes"),
  ("tokens", Int(0).ok, "an integer >= 0"),
  ("sha256", lambda v: isinstance(v, str) and bool(re.fullmatch(r"[0-9a-f]{64}", v)), "a sha256 hex digest"),
)


def read_manifest(directory: str) -> dict:
  """The checked manifest of a feature folder; DataFormatError naming manifest.json and the field on any defect
  (see the module docstring)."""
  path = os.path.join(directory, MANIFEST)
  m = read_json(path, "feature manifest")
  if m.get("format") != FORMAT or m.get("format_version") != FORMAT_VERSION:
    raise DataFormatError(
      f"{path}: format {m.get('format')!r} version {m.get('format_version')!r}; this reader "
      f"knows {FORMAT!r} version {FORMAT_VERSION} (stores from before shards carried hashes "
      "are not read: extract into a new folder)"
    )
  for key, check, expected in _MANIFEST_FIELDS:
    if key not in m:
      raise DataFormatError(f"{path}: missing field {key!r}")
    if not check(m[key]):
      raise DataFormatError(f"{path}: field {key!r} must be {expected}, found {shown(m[key])}")
  try:
    FeatureSpec(**m["spec"])
  except (ConfigError, TypeError) as e:
    raise DataFormatError(f"{path}: field 'spec' is not a feature spec ({e})") from None
  files, ids = set(), {}
  for k, entry in enumerate(m["shards"]):
    where = f"{path}: shards[{k}]"
    if not isinstance(entry, dict):
      raise DataFormatError(f"{where} must be an object, found {shown(entry)}")
    for key, check, expected in _SHARD_FIELDS:
      if key not in entry:
        raise DataFormatError(f"{where}: missing field {key!r}")
      if not check(entry[key]):
        raise DataFormatError(f"{where}: field {key!r} must be {expected}, found {shown(entry[key])}")
    if len(entry["hashes"]) != len(entry["ids"]):
      raise DataFormatError(f"{where}: {len(entry['hashes'])} hashes for {len(entry['ids'])} ids")
    if entry["file"] in files:
      raise DataFormatError(f"{where}: file {entry['file']!r} is listed twice")
    files.add(entry["file"])
    for tid in entry["ids"]:
      if tid in ids:
        raise DataFormatError(f"{where}: trajectory {tid!r} is also in shards[{ids[tid]}]")
      ids[tid] = k
  return m


_SHARD_ARRAYS = ("features", "offsets", "ids", "hashes", "header")
# What numpy's npz reader raises on bytes that are not a well-formed archive of plain arrays.
_NPZ_ERRORS = (
  zipfile.BadZipFile,
  zlib.error,
  struct.error,
  KeyError,
  ValueError,
  OSError,
  EOFError,
  IndexError,
  NotImplementedError,
  OverflowError,
  MemoryError,
)


def load_shard(directory: str, entry: dict, header: dict) -> tuple[np.ndarray, np.ndarray]:
  """(features [tokens, F], offsets [n + 1]) of a shard, checked against its manifest entry and the store's header:
  DataFormatError when the file is damaged, FeatureMismatchError when it was made for other records or another
  store (module docstring)."""
  path = os.path.join(directory, entry["file"])
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise DataFormatError(f"{path}: cannot read feature shard ({e.strerror or e})") from None
  digest = hashlib.sha256(data).hexdigest()
  if digest != entry["sha256"]:
    raise DataFormatError(
      f"{path}: {len(data)} bytes whose sha256 {digest[:16]}... is not the manifest's "
      f"{entry['sha256'][:16]}... (the shard was changed, truncated or replaced)"
    )
  try:
    z = np.load(io.BytesIO(data), allow_pickle=False)
    if not isinstance(z, np.lib.npyio.NpzFile):
      raise ValueError("not an .npz archive")
    with z:
      arrays = {name: z[name] for name in _SHARD_ARRAYS}
  except _NPZ_ERRORS as e:
    raise DataFormatError(f"{path}: not a readable feature shard ({type(e).__name__}: {e})") from None
  feats, offsets, ids, hashes, embedded = (arrays[name] for name in _SHARD_ARRAYS)
  try:
    made_for = json.loads(str(embedded)) if embedded.shape == () and embedded.dtype.kind == "U" else None
  except ValueError:
    made_for = None
  if not isinstance(made_for, dict):
    raise DataFormatError(f"{path}: the shard's 'header' is not the JSON object extraction writes")
  for key in HEADER_KEYS:
    if made_for.get(key) != header[key]:
      raise FeatureMismatchError(
        f"{path}: the shard was made with {key}={made_for.get(key)!r}, but this store "
        f"holds {header[key]!r} (copied in from another store?)"
      )
  for name, arr, want in (("ids", ids, entry["ids"]), ("hashes", hashes, entry["hashes"])):
    if arr.dtype.kind != "U" or arr.shape != (len(want),) or arr.tolist() != want:
      raise FeatureMismatchError(f"{path}: the shard's {name} are not the {len(want)} the manifest lists for it")
  n, n_tok = len(entry["ids"]), entry["tokens"]
  if feats.dtype != np.dtype(header["dtype"]) or feats.shape != (n_tok, header["feature_dim"]):
    raise DataFormatError(
      f"{path}: features are {feats.dtype} {list(feats.shape)}, the manifest says "
      f"{header['dtype']} [{n_tok}, {header['feature_dim']}]"
    )
  if (
    offsets.dtype.kind not in "iu"
    or offsets.shape != (n + 1,)
    or offsets[0] != 0
    or offsets[-1] != n_tok
    or np.any(np.diff(offsets) < 0)
  ):
    raise DataFormatError(
      f"{path}: offsets {shown(offsets.tolist())} are not {n + 1} ascending token offsets from 0 to {n_tok}"
    )
  return feats, offsets


class FeatureStore:
  """Reads a finished feature directory: `store[id]` -> [n_tokens, F]; `store.ids`. The manifest is checked on
  opening and each shard when first read (module docstring)."""

  def __init__(self, directory: str, *, expect: dict | None = None):
    self.directory = directory
    if not os.path.exists(os.path.join(directory, MANIFEST)):
      raise ConfigError(f"{directory}: no {MANIFEST} (not a feature directory)")
    self.manifest = read_manifest(directory)
    if expect:
      for key, want in expect.items():
        have = self.manifest.get(key)
        if have != want:
          raise FeatureMismatchError(f"{directory}: features were made with {key}={have!r}, expected {want!r}")
    self._header = {key: self.manifest[key] for key in HEADER_KEYS}
    self._index: dict[str, tuple[int, int]] = {}
    self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for k, shard in enumerate(self.manifest["shards"]):
      for j, tid in enumerate(shard["ids"]):
        self._index[tid] = (k, j)

  @property
  def ids(self) -> list[str]:
    return list(self._index)

  @property
  def dim(self) -> int:
    return int(self.manifest["feature_dim"])

  def __contains__(self, tid: str) -> bool:
    return tid in self._index

  def __getitem__(self, tid: str) -> np.ndarray:
    k, j = self._index[tid]
    if k not in self._cache:
      self._cache = {k: load_shard(self.directory, self.manifest["shards"][k], self._header)}
    feats, offsets = self._cache[k]
    return feats[offsets[j] : offsets[j + 1]].astype(np.float32)


# ------------------------------------------------------------------------------------------------ writing shards


def shard_blob(chunk: Sequence[Trajectory], feats: Sequence[np.ndarray], dtype: str, embedded: np.ndarray) -> bytes:
  """The .npz bytes of one shard; ConfigError / DataFormatError naming a record whose features are not finite."""
  offsets = np.cumsum([0] + [len(f) for f in feats])
  with np.errstate(over="ignore"):  # an overflow to inf is refused below, naming the record
    data = np.concatenate(feats, axis=0).astype(dtype)
  for r, f, lo, hi in zip(chunk, feats, offsets[:-1], offsets[1:]):
    if not np.isfinite(data[lo:hi]).all():
      if np.isfinite(f).all():
        raise ConfigError(
          f"trajectory {r.id!r}: its features reach {np.abs(f).max():.4g}, past what {dtype} "
          "holds; extract with dtype='float32'"
        )
      raise DataFormatError(f"trajectory {r.id!r}: the model's features for it are not finite (NaN or inf)")
  buf = io.BytesIO()
  np.savez(
    buf,
    features=data,
    offsets=offsets,
    ids=np.asarray([r.id for r in chunk], str),
    hashes=np.asarray([record_hash(r) for r in chunk], str),
    header=embedded,
  )
  return buf.getvalue()


def shard_entry(name: str, chunk: Sequence[Trajectory], blob: bytes) -> dict:
  """A shard's manifest entry: its records, their hashes and token count, and the hash of its bytes."""
  return {
    "file": name,
    "ids": [r.id for r in chunk],
    "hashes": [record_hash(r) for r in chunk],
    "tokens": sum(len(r.response_ids) for r in chunk),
    "sha256": hashlib.sha256(blob).hexdigest(),
  }
