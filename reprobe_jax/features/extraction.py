"""Feature extraction (METHOD A3) into resumable array shards with a manifest.

For every response token j the feature vector comes from position j-1 of the full sequence (prompt + response):
the state that predicted token j. Feature sets concatenate, in this order: hidden states at the chosen layers
(`hidden`), the attention window of every layer and head (`attn`: W x heads x layers), the top-K next-token
probabilities followed by the token's own log-probability and the entropy of the distribution it was drawn from
(`logit`: K + 2, so a probe sees what MaxProb and the entropy baselines read; docs/method.md). Only response tokens
are stored (see docs/method.md).

On disk, `<dir>/manifest.json` holds the format, the store's header (model fingerprint, tokenizer hash, spec,
feature dim, dtype) and the finished shards: per shard its file name, record ids, record hashes (`record_hash`: the
prompt and response tokens its features were made from), token count and `sha256` (of the shard file's bytes). Each
shard `shard_NNNNN.npz` holds `features` [tokens, F] (float32 or float16), `offsets` [n + 1], `ids` [n], `hashes`
[n] and `header` (the store's header as JSON), so a shard names what it was made from even outside its folder.
Shards and the manifest are written atomically, so a killed extraction resumes from its last finished shard.

What is checked, and what happens on a mismatch:
- Records, before anything is written: the trajectory schema (`Trajectory.from_json`: ids, token lists of ints,
  a non-empty prompt), unique ids, token ids inside the model's vocabulary and sequences inside its context
  (DataFormatError / CacheFullError naming the record), captured features of the right shape.
- The manifest, on every read and resume: keys, types, shard names `shard_<digits>.npz` (no path leaves the folder),
  unique ids and files; a defect is a DataFormatError naming manifest.json. A folder made for another model,
  tokenizer, spec or dtype is refused (FeatureMismatchError).
- A shard, when `FeatureStore` first reads it: its bytes against `sha256`, then its arrays (shapes, dtype, offsets)
  and its embedded ids, record hashes and header against the manifest. Damage (missing, zero-byte, truncated,
  changed bytes) is a DataFormatError naming the shard; a shard made for other records or another store (copied in
  with its manifest entry) is a FeatureMismatchError. Nothing wrong is served.
- On resume (`extract` into a folder with a manifest), every shard that holds one of the records asked for is read
  and checked as above. A damaged shard is recomputed (logged; features are a function of model, spec and tokens,
  and its records are at hand); a shard made for other tokens than a record now has (same id, another response),
  or for another store, is refused (FeatureMismatchError): that is a different job's data, not damage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import struct
import zipfile
import zlib
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from reprobe_jax.io.atomic import atomic_open
from reprobe_jax.errors import CacheFullError, ConfigError, DataFormatError, DistributedError, ReprobeError
from reprobe_jax.models import CaptureSpec, LanguageModel
from reprobe_jax.models.sampling import bucket
from reprobe_jax.models.sharding import barrier, failed_processes, spans_processes, to_host
from reprobe_jax.io.readers import read_json, shown

MANIFEST = "manifest.json"
FORMAT = "reprobe-features"
FORMAT_VERSION = 2  # 2: shards carry record hashes, an embedded header and a content hash
HEADER_KEYS = ("model_fingerprint", "tokenizer_hash", "spec", "feature_dim", "dtype")
DTYPES = ("float32", "float16")
_SHARD_NAME = re.compile(r"shard_\d{5,}\.npz")


class FeatureMismatchError(ReprobeError):
  """Stored features were made by another model, tokenizer or feature spec than the one asked for."""


PARTS = ("hidden", "attn", "logit")


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  """Which features, METHOD A3. `parts` in ('hidden', 'attn', 'logit'); e.g. 'hidden' or 'attn+logit'."""

  parts: tuple[str, ...] = ("hidden",)
  hidden_layers: tuple[int, ...] = (-1,)
  attn_window: int = 5
  top_k: int = 4

  def __post_init__(self):
    parts = self.parts
    if (isinstance(parts, str) or not isinstance(parts, (tuple, list)) or not parts
        or not all(isinstance(p, str) for p in parts) or set(parts) - set(PARTS) or len(set(parts)) != len(parts)):
      raise ConfigError(f"feature parts {parts!r} must be a non-empty subset of {', '.join(PARTS)} (each once)")
    object.__setattr__(self, "parts", tuple(parts))
    layers = self.hidden_layers
    if (isinstance(layers, (str, bytes)) or not isinstance(layers, (tuple, list))
        or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in layers)):
      raise ConfigError(f"feature part 'hidden': hidden_layers must be a sequence of layer indices (integers), "
                        f"found {layers!r}")
    if "hidden" in parts and not layers:
      raise ConfigError("feature part 'hidden': hidden_layers is empty; name at least one layer")
    object.__setattr__(self, "hidden_layers", tuple(int(i) for i in layers))
    for part, name in (("attn", "attn_window"), ("logit", "top_k")):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ConfigError(f"feature part {part!r}: {name} must be an integer >= 1, found {v!r}")
      object.__setattr__(self, name, int(v))

  @classmethod
  def from_name(cls, name: str, **kw) -> "FeatureSpec":
    """'hidden', 'attn+logit', 'hidden+attn+logit', ..."""
    if not isinstance(name, str):
      raise ConfigError(f"feature set name must be a string like 'hidden+logit', found {name!r}")
    return cls(parts=tuple(name.split("+")), **kw)

  @property
  def name(self) -> str:
    return "+".join(self.parts)

  def capture(self) -> CaptureSpec:
    return CaptureSpec(hidden_layers=self.hidden_layers if "hidden" in self.parts else (),
                       attn_window=self.attn_window if "attn" in self.parts else 0,
                       top_k_probs=self.top_k if "logit" in self.parts else 0, token_stats="logit" in self.parts)

  def assemble(self, values, num_layers: int):
    """The feature vectors [..., F] from captured per-token values, in the spec's part order (METHOD A3).

    values: {'hidden_<i>': [..., D] (HF layer index i), 'attn_window': [..., L, H, W'] (W' >= W, most recent key
    first), 'top_probs': [..., K'] (K' >= K, sorted descending), 'token_logprobs' and 'token_entropy': [...] (the
    token's own log-probability at temperature 1 and the entropy of the distribution it was drawn from)}, as the
    sampler captures them (`with_logprobs` adds the sampler's recorded log-probs to its `features`) and as
    `forward_values` turns a forward pass into. The one assembly used by sampling, teacher-forced extraction and
    bench/; runs on device.
    """
    parts = []
    if "hidden" in self.parts:
      parts += [values[f"hidden_{i}"] for i in self.capture().resolve_layers(num_layers)]
    if "attn" in self.parts:
      aw = values["attn_window"][..., :self.attn_window]  # [..., L, H, W]
      parts.append(aw.reshape(aw.shape[:-3] + (-1,)))
    if "logit" in self.parts:
      parts += [values["top_probs"][..., :self.top_k], values["token_logprobs"][..., None],
                values["token_entropy"][..., None]]
    return jnp.concatenate([jnp.asarray(p, jnp.float32) for p in parts], axis=-1)

  def dim(self, cfg) -> int:
    d = 0
    if "hidden" in self.parts:
      d += cfg.hidden_size * len(self.capture().resolve_layers(cfg.num_layers))
    if "attn" in self.parts:
      d += self.attn_window * cfg.num_heads * cfg.num_layers
    if "logit" in self.parts:
      d += self.top_k + 2
    return d


def union_capture(specs, *, token_stats: bool = True) -> CaptureSpec:
  """One capture that serves every spec (the widest window and top-K; the union of hidden layers), so a sampler
  records all feature sets in one pass; `FeatureSpec.assemble` slices what each needs."""
  specs = list(specs)
  layers = tuple(dict.fromkeys(i for s in specs for i in s.capture().hidden_layers))
  return CaptureSpec(hidden_layers=layers, attn_window=max([s.capture().attn_window for s in specs] + [0]),
                     top_k_probs=max([s.capture().top_k_probs for s in specs] + [0]), token_stats=token_stats)


def forward_values(out: dict) -> dict:
  """A forward pass's captured dict ({'hidden_states': {i: ...}, 'attn_window', 'top_probs'}) in the sampler's
  naming, for `FeatureSpec.assemble`."""
  values = {f"hidden_{i}": h for i, h in out["hidden_states"].items()}
  for k in ("attn_window", "top_probs", "token_logprobs", "token_entropy"):
    if out.get(k) is not None:
      values[k] = out[k]
  return values


def with_logprobs(features: Mapping[str, Any], logprobs) -> dict:
  """A sampler's captured `features` with its recorded per-token log-probs [..., N] added as 'token_logprobs' (the
  sampler keeps them apart from the captured statistics), ready for `FeatureSpec.assemble`."""
  return dict(features, token_logprobs=logprobs)


def model_fingerprint(lm: LanguageModel) -> str:
  """sha256 over the config and, for every parameter, its path, shape, dtype and a strided sample of its values
  (reading every weight of an 8B model just to name it would cost minutes)."""
  h = hashlib.sha256(json.dumps(lm.config.to_hf_dict(), sort_keys=True).encode())
  leaves = sorted(jax.tree_util.tree_leaves_with_path(lm.params), key=lambda kv: str(kv[0]))
  samples = []
  for _, leaf in leaves:
    flat = jnp.ravel(leaf)
    samples.append(flat[::max(flat.size // 256, 1)][:256])
  for (path, leaf), sample in zip(leaves, to_host(samples)):  # one gather when the parameters span processes
    h.update(f"{jax.tree_util.keystr(path)}{leaf.shape}{leaf.dtype}".encode())
    h.update(np.asarray(sample, np.float32).tobytes())
  return h.hexdigest()[:16]


def tokenizer_hash(tokenizer) -> str:
  backend = getattr(tokenizer, "backend_tokenizer", None)
  blob = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def record_hash(record) -> str:
  """What a record's features depend on: its prompt and response token ids."""
  blob = json.dumps([list(map(int, record["prompt_ids"])), list(map(int, record["response_ids"]))])
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


_RECORD_FIELDS = ("id", "prompt_ids", "response_ids")  # what extraction reads of a trajectory record


def check_records(lm: LanguageModel, records: Sequence[Mapping[str, Any]]) -> None:
  """DataFormatError naming the record unless each is a trajectory record (`Trajectory.from_json`: an id, a
  non-empty prompt_ids, response_ids) whose token ids are in the model's vocabulary; CacheFullError naming it when
  prompt + response exceed the model's context."""
  from reprobe_jax.trajectories import Trajectory  # trajectories builds on this module
  for index, r in enumerate(records):
    t = Trajectory.from_json(r, f"<record {index}>: ", required=_RECORD_FIELDS)
    for field in ("prompt_ids", "response_ids"):
      try:
        lm.check_ids(getattr(t, field), field)
      except ConfigError as e:
        raise DataFormatError(f"trajectory {t.id!r}: {e}") from None
    try:
      lm._check_length(len(t.prompt_ids) + len(t.response_ids))
    except CacheFullError as e:
      raise CacheFullError(f"trajectory {t.id!r}: {e}") from None


def _atomic_bytes(path: str, data: bytes) -> None:
  with atomic_open(path, "wb") as f:
    f.write(data)


def token_features(lm: LanguageModel, records: Sequence[dict], spec: FeatureSpec, *,
                   batch_size: int = 8) -> list[np.ndarray]:
  """[n_response_tokens, F] per record, next-token aligned (token j from position prompt_len + j - 1); records are
  checked first (`check_records`)."""
  from reprobe_jax.models.forward import forward, positions_from_mask
  check_records(lm, records)
  capture = spec.capture()
  out: list[np.ndarray | None] = [None] * len(records)
  order = sorted(range(len(records)), key=lambda i: len(records[i]["prompt_ids"]) + len(records[i]["response_ids"]))
  pad = lm.pad_id()
  for s in range(0, len(order), batch_size):
    idx = order[s:s + batch_size]
    seqs = [list(records[i]["prompt_ids"]) + list(records[i]["response_ids"]) for i in idx]
    t = bucket(max(map(len, seqs)))
    if t > lm.config.max_position_embeddings:
      t = max(map(len, seqs))
    lm._check_length(t)
    ids = np.full((batch_size, t), pad, np.int32)  # right-padded; rows past the chunk are padding
    mask = np.zeros((batch_size, t), np.int32)
    for r, seq in enumerate(seqs):
      ids[r, :len(seq)], mask[r, :len(seq)] = seq, 1
    m = jnp.asarray(mask)
    res = forward(lm.static_graph, lm.params, jnp.asarray(ids), m, positions_from_mask(m), capture=capture,
                  shard=lm.shard)
    feats = to_host(spec.assemble(forward_values(res), lm.config.num_layers))  # rows may live on other processes
    for r, i in enumerate(idx):
      p, n = len(records[i]["prompt_ids"]), len(records[i]["response_ids"])
      out[i] = feats[r, p - 1:p - 1 + n]
  return out  # type: ignore[return-value]


def _check_shape(record, features, dim: int, spec: FeatureSpec) -> None:
  shape = np.shape(features)
  if shape != (len(record["response_ids"]), dim):
    raise FeatureMismatchError(f"trajectory {record['id']!r}: captured features have shape {shape}, expected "
                               f"({len(record['response_ids'])}, {dim}) for spec {spec.name!r}")


def _chunk_features(lm, chunk, spec: FeatureSpec, batch_size: int, captured: Mapping[str, np.ndarray]):
  """Features per record of a chunk: the captured ones where there are, a teacher-forced forward for the rest."""
  dim = spec.dim(lm.config)
  missing = [r for r in chunk if r["id"] not in captured]
  forward = dict(zip([r["id"] for r in missing], token_features(lm, missing, spec, batch_size=batch_size)))
  out = []
  for r in chunk:
    f = captured[r["id"]] if r["id"] in captured else forward[r["id"]]
    _check_shape(r, f, dim, spec)
    out.append(np.asarray(f, np.float32))
  return out


# ------------------------------------------------------------------------------------------------ manifest, shards

def _is_int(v: Any, low: int) -> bool:
  return type(v) is int and v >= low


def _str_list(v: Any) -> bool:
  return isinstance(v, list) and all(isinstance(x, str) and x for x in v)


_MANIFEST_FIELDS = (  # (key, check, what it must be)
    ("model_fingerprint", lambda v: isinstance(v, str), "a string"),
    ("tokenizer_hash", lambda v: isinstance(v, str), "a string"),
    ("spec", lambda v: isinstance(v, dict), "an object (a FeatureSpec)"),
    ("feature_dim", lambda v: _is_int(v, 1), "an integer >= 1"),
    ("dtype", lambda v: v in DTYPES, f"one of {', '.join(DTYPES)}"),
    ("shards", lambda v: isinstance(v, list), "a list of shard entries"),
    ("complete", lambda v: isinstance(v, bool), "true or false"),
)
_SHARD_FIELDS = (
    ("file", lambda v: isinstance(v, str) and bool(_SHARD_NAME.fullmatch(v)),
     "a file name shard_<digits>.npz inside the folder"),
    ("ids", _str_list, "a list of non-empty strings (trajectory ids)"),
    ("hashes", _str_list, "a list of record hashes"),
    ("tokens", lambda v: _is_int(v, 0), "an integer >= 0"),
    ("sha256", lambda v: isinstance(v, str) and bool(re.fullmatch(r"[0-9a-f]{64}", v)), "a sha256 hex digest"),
)


def read_manifest(directory: str) -> dict:
  """The checked manifest of a feature folder; DataFormatError naming manifest.json and the field on any defect
  (see the module docstring)."""
  path = os.path.join(directory, MANIFEST)
  m = read_json(path, "feature manifest")
  if m.get("format") != FORMAT or m.get("format_version") != FORMAT_VERSION:
    raise DataFormatError(f"{path}: format {m.get('format')!r} version {m.get('format_version')!r}; this reader "
                          f"knows {FORMAT!r} version {FORMAT_VERSION} (stores from before shards carried hashes "
                          "are not read: extract into a new folder)")
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
_NPZ_ERRORS = (zipfile.BadZipFile, zlib.error, struct.error, KeyError, ValueError, OSError, EOFError, IndexError,
               NotImplementedError, OverflowError, MemoryError)


def _load_shard(directory: str, entry: dict, header: dict) -> tuple[np.ndarray, np.ndarray]:
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
    raise DataFormatError(f"{path}: {len(data)} bytes whose sha256 {digest[:16]}... is not the manifest's "
                          f"{entry['sha256'][:16]}... (the shard was changed, truncated or replaced)")
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
      raise FeatureMismatchError(f"{path}: the shard was made with {key}={made_for.get(key)!r}, but this store "
                                 f"holds {header[key]!r} (copied in from another store?)")
  for name, arr, want in (("ids", ids, entry["ids"]), ("hashes", hashes, entry["hashes"])):
    if arr.dtype.kind != "U" or arr.shape != (len(want),) or arr.tolist() != want:
      raise FeatureMismatchError(f"{path}: the shard's {name} are not the {len(want)} the manifest lists for it")
  n, n_tok = len(entry["ids"]), entry["tokens"]
  if feats.dtype != np.dtype(header["dtype"]) or feats.shape != (n_tok, header["feature_dim"]):
    raise DataFormatError(f"{path}: features are {feats.dtype} {list(feats.shape)}, the manifest says "
                          f"{header['dtype']} [{n_tok}, {header['feature_dim']}]")
  if (offsets.dtype.kind not in "iu" or offsets.shape != (n + 1,) or offsets[0] != 0 or offsets[-1] != n_tok
      or np.any(np.diff(offsets) < 0)):
    raise DataFormatError(f"{path}: offsets {shown(offsets.tolist())} are not {n + 1} ascending token "
                          f"offsets from 0 to {n_tok}")
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
      self._cache = {k: _load_shard(self.directory, self.manifest["shards"][k], self._header)}
    feats, offsets = self._cache[k]
    return feats[offsets[j]:offsets[j + 1]].astype(np.float32)


def _header(lm: LanguageModel, spec: FeatureSpec, dtype: str) -> dict:
  """What a store's features depend on besides the records, as the manifest stores it (tuples become lists)."""
  header = {"model_fingerprint": model_fingerprint(lm), "tokenizer_hash": tokenizer_hash(lm.tokenizer),
            "spec": dataclasses.asdict(spec), "feature_dim": spec.dim(lm.config), "dtype": dtype}
  return json.loads(json.dumps(header))


def _check_job(lm: LanguageModel, records: Sequence[dict], spec: FeatureSpec, shard_size, batch_size, dtype,
               captured: Mapping[str, np.ndarray]) -> None:
  """ConfigError / DataFormatError / FeatureMismatchError for an extraction that cannot run, before any write."""
  for name, v in (("shard_size", shard_size), ("batch_size", batch_size)):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
      raise ConfigError(f"extract: {name} must be an integer >= 1, found {v!r}")
  if dtype not in DTYPES:
    raise ConfigError(f"extract: dtype must be one of {', '.join(DTYPES)}, found {dtype!r}")
  if "logit" in spec.parts and spec.top_k > lm.config.vocab_size:
    raise ConfigError(f"feature part 'logit': top_k={spec.top_k} is more than the model's vocabulary of "
                      f"{lm.config.vocab_size} tokens")
  spec.capture().resolve_layers(lm.config.num_layers)  # ConfigError naming a layer outside the model
  check_records(lm, records)
  seen: dict[str, int] = {}
  for index, r in enumerate(records):
    if r["id"] in seen:
      raise DataFormatError(f"<record {index}>: trajectory {r['id']!r} is also record {seen[r['id']]}; a feature "
                            "store is keyed by id")
    seen[r["id"]] = index
    if r["id"] in captured:
      _check_shape(r, captured[r["id"]], spec.dim(lm.config), spec)


def _resumable(directory: str, header: dict, records: Sequence[dict]) -> list[dict]:
  """The shard entries of an existing folder to keep (module docstring: what is refused, what is recomputed)."""
  old = read_manifest(directory)
  for key in HEADER_KEYS:
    if old[key] != header[key]:
      raise FeatureMismatchError(f"{directory}: holds features with {key}={old[key]!r}, but this run has "
                                 f"{header[key]!r}; use another directory")
  wanted = {r["id"]: record_hash(r) for r in records}
  for entry in old["shards"]:  # a stored record must have been made from the same tokens
    for tid, h in zip(entry["ids"], entry["hashes"]):
      if tid in wanted and wanted[tid] != h:
        raise FeatureMismatchError(f"{directory}: the features stored for trajectory {tid!r} were made from other "
                                   "tokens than it now has; use another directory")
  kept = []
  for entry in old["shards"]:
    if any(tid in wanted for tid in entry["ids"]):
      try:
        _load_shard(directory, entry, header)
      except DataFormatError as e:
        logging.warning("%s; its %d records are extracted again", e, len(entry["ids"]))
        continue
    kept.append(entry)
  return kept


def extract(lm: LanguageModel, records: Sequence[dict], spec: FeatureSpec, directory: str, *,
            shard_size: int = 256, batch_size: int = 8, dtype: str = "float32",
            on_shard: Callable[[int, int], None] | None = None,
            captured: Mapping[str, np.ndarray] | None = None) -> FeatureStore:
  """Stores features of every record into `directory`, resuming finished shards; returns the store.

  captured: {record id: [n_response_tokens, F]} features the sampler recorded while it generated the record (so no
  second forward is run for them); records not in it are run through the model (teacher-forced, e.g. imported
  trajectories). Everything is checked before anything is written (module docstring).

  On a multi-process job every process calls this with the same records, and `directory` is on a file system they
  share: new shard k is written by process k % process_count (all of them compute it when the model's parameters
  span processes, since its forward is then one computation; otherwise only its writer does, so the processes
  split the work), and process 0 alone writes the manifest: its own shards as they finish, every process's once all
  are written. A killed run resumes from the shards the manifest lists."""
  captured = captured or {}
  _check_job(lm, records, spec, shard_size, batch_size, dtype, captured)
  if os.path.exists(directory) and not os.path.isdir(directory):
    raise ConfigError(f"{directory}: is a file, not a feature directory")
  header = _header(lm, spec, dtype)
  path = os.path.join(directory, MANIFEST)
  shards = _resumable(directory, header, records) if os.path.exists(path) else []
  barrier("features.extract: manifest read")  # no process writes before every one has read what is there
  procs, me = jax.process_count(), jax.process_index()
  os.makedirs(directory, exist_ok=True)
  manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **header,
              "alignment": "next-token: token j from position j-1; response tokens only", "shards": shards,
              "complete": False}
  kept = list(shards)  # manifest["shards"] grows with process 0's new shards
  done = {tid for s in kept for tid in s["ids"]}
  used = {s["file"] for s in kept}
  todo = [r for r in records if r["id"] not in done]
  total = -(-len(todo) // shard_size)
  names = [n for n in (f"shard_{i:05d}.npz" for i in range(len(used) + total)) if n not in used][:total]
  together = spans_processes(lm.params)
  embedded = np.asarray(json.dumps(header, sort_keys=True))
  failure = None
  try:
    for k in range(total):
      if k % procs != me and not together:
        continue
      chunk = todo[k * shard_size:(k + 1) * shard_size]
      blob = _shard_blob(chunk, _chunk_features(lm, chunk, spec, batch_size, captured), dtype, embedded)
      if k % procs == me:
        _atomic_bytes(os.path.join(directory, names[k]), blob)
        if me == 0:
          manifest["shards"].append(_shard_entry(names[k], chunk, blob))
          _atomic_bytes(path, json.dumps(manifest, indent=1).encode())
      if on_shard is not None:
        on_shard(k + 1, total)
  except Exception as e:  # on a multi-process job the others hear of it below, instead of waiting for this one
    if procs == 1:
      raise
    failure = e
  if procs > 1:
    _all_or_none(failure, f"{directory}: feature extraction failed on process(es) {{}} (see their logs)")
    if me == 0:
      try:
        manifest["shards"] = kept + [_written_entry(directory, names[k], todo[k * shard_size:(k + 1) * shard_size],
                                                      header, k % procs) for k in range(total)]
      except ReprobeError as e:
        failure = e
    _all_or_none(failure, f"{directory}: process(es) {{}} could not list every process's shards; is the folder "
                          "on a file system every process shares?")
  if me == 0:
    manifest["complete"] = True
    manifest["counts"] = {"trajectories": sum(len(s["ids"]) for s in manifest["shards"]),
                          "tokens": sum(s["tokens"] for s in manifest["shards"])}
    _atomic_bytes(path, json.dumps(manifest, indent=1).encode())
  barrier("features.extract: manifest written")
  return FeatureStore(directory)


def _shard_blob(chunk: Sequence[dict], feats: Sequence[np.ndarray], dtype: str, embedded: np.ndarray) -> bytes:
  """The .npz bytes of one shard; ConfigError / DataFormatError naming a record whose features are not finite."""
  offsets = np.cumsum([0] + [len(f) for f in feats])
  with np.errstate(over="ignore"):  # an overflow to inf is refused below, naming the record
    data = np.concatenate(feats, axis=0).astype(dtype)
  for r, f, lo, hi in zip(chunk, feats, offsets[:-1], offsets[1:]):
    if not np.isfinite(data[lo:hi]).all():
      if np.isfinite(f).all():
        raise ConfigError(f"trajectory {r['id']!r}: its features reach {np.abs(f).max():.4g}, past what {dtype} "
                          "holds; extract with dtype='float32'")
      raise DataFormatError(f"trajectory {r['id']!r}: the model's features for it are not finite (NaN or inf)")
  buf = io.BytesIO()
  np.savez(buf, features=data, offsets=offsets, ids=np.asarray([r["id"] for r in chunk], str),
           hashes=np.asarray([record_hash(r) for r in chunk], str), header=embedded)
  return buf.getvalue()


def _shard_entry(name: str, chunk: Sequence[dict], blob: bytes) -> dict:
  """A shard's manifest entry: its records, their hashes and token count, and the hash of its bytes."""
  return {"file": name, "ids": [r["id"] for r in chunk], "hashes": [record_hash(r) for r in chunk],
          "tokens": sum(len(r["response_ids"]) for r in chunk), "sha256": hashlib.sha256(blob).hexdigest()}


def _written_entry(directory: str, name: str, chunk: Sequence[dict], header: dict, writer: int) -> dict:
  """The manifest entry of a shard another process wrote (process 0 reads it back and checks it like any shard)."""
  try:
    with open(os.path.join(directory, name), "rb") as f:
      entry = _shard_entry(name, chunk, f.read())
  except OSError as e:
    raise DataFormatError(f"{os.path.join(directory, name)}: process {writer} wrote this shard, but process 0 "
                          f"cannot read it ({e.strerror or e}); is {directory} on a file system every process "
                          "shares?") from None
  _load_shard(directory, entry, header)
  return entry


def _all_or_none(failure: Exception | None, message: str) -> None:
  """Every process learns whether any failed here: the one that did raises its own error, the others a
  DistributedError (`message` with the failed ids)."""
  failed = failed_processes(failure is not None)
  if failure is not None:
    raise failure
  if failed:
    raise DistributedError(message.format(failed))
