"""Feature extraction (METHOD A3) into resumable array shards with a manifest.

For every response token j the feature vector comes from position j-1 of the full sequence (prompt + response):
the state that predicted token j. Feature sets concatenate, in this order: hidden states at the chosen layers
(`hidden`), the attention window of every layer and head (`attn`: W x heads x layers), the top-K next-token
probabilities (`logit`). Only response tokens are stored (see docs/method.md).

On disk, `<dir>/manifest.json` names the model fingerprint, the tokenizer hash, the spec and the finished shards;
each shard `shard_NNNNN.npz` holds `features` [tokens, F] (float32 or float16), `offsets` [n + 1] and `ids` [n].
Shards and the manifest are written atomically, so a killed extraction resumes from its last finished shard; a
directory made for another model, tokenizer or spec is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from reprobe_jax.atomic import atomic_open
from reprobe_jax.errors import ConfigError, ReprobeError
from reprobe_jax.models import CaptureSpec, LanguageModel
from reprobe_jax.models.sampling import bucket

MANIFEST = "manifest.json"


class FeatureMismatchError(ReprobeError):
  """Stored features were made by another model, tokenizer or feature spec than the one asked for."""


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  """Which features, METHOD A3. `parts` in ('hidden', 'attn', 'logit'); e.g. 'hidden' or 'attn+logit'."""

  parts: tuple[str, ...] = ("hidden",)
  hidden_layers: tuple[int, ...] = (-1,)
  attn_window: int = 5
  top_k: int = 4

  def __post_init__(self):
    unknown = set(self.parts) - {"hidden", "attn", "logit"}
    if unknown or not self.parts:
      raise ConfigError(f"feature parts {self.parts} must be a non-empty subset of hidden, attn, logit")
    object.__setattr__(self, "hidden_layers", tuple(int(i) for i in self.hidden_layers))

  @classmethod
  def from_name(cls, name: str, **kw) -> "FeatureSpec":
    """'hidden', 'attn+logit', 'hidden+attn+logit', ..."""
    return cls(parts=tuple(name.split("+")), **kw)

  @property
  def name(self) -> str:
    return "+".join(self.parts)

  def capture(self) -> CaptureSpec:
    return CaptureSpec(hidden_layers=self.hidden_layers if "hidden" in self.parts else (),
                       attn_window=self.attn_window if "attn" in self.parts else 0,
                       top_k_probs=self.top_k if "logit" in self.parts else 0)

  def assemble(self, values, num_layers: int):
    """The feature vectors [..., F] from captured per-token values, in the spec's part order (METHOD A3).

    values: {'hidden_<i>': [..., D] (HF layer index i), 'attn_window': [..., L, H, W'] (W' >= W, most recent key
    first), 'top_probs': [..., K'] (K' >= K, sorted descending)}, as the sampler captures them (`DecodeState.
    features`, `Generation.features`) and as `forward_values` turns a forward pass into. The one assembly used by
    sampling, teacher-forced extraction and bench/; runs on device.
    """
    parts = []
    if "hidden" in self.parts:
      parts += [values[f"hidden_{i}"] for i in self.capture().resolve_layers(num_layers)]
    if "attn" in self.parts:
      aw = values["attn_window"][..., :self.attn_window]  # [..., L, H, W]
      parts.append(aw.reshape(aw.shape[:-3] + (-1,)))
    if "logit" in self.parts:
      parts.append(values["top_probs"][..., :self.top_k])
    return jnp.concatenate([jnp.asarray(p, jnp.float32) for p in parts], axis=-1)

  def dim(self, cfg) -> int:
    d = 0
    if "hidden" in self.parts:
      d += cfg.hidden_size * len(self.capture().resolve_layers(cfg.num_layers))
    if "attn" in self.parts:
      d += self.attn_window * cfg.num_heads * cfg.num_layers
    if "logit" in self.parts:
      d += self.top_k
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
  for k in ("attn_window", "top_probs"):
    if out.get(k) is not None:
      values[k] = out[k]
  return values


def model_fingerprint(lm: LanguageModel) -> str:
  """sha256 over the config and, for every parameter, its path, shape, dtype and a strided sample of its values
  (reading every weight of an 8B model just to name it would cost minutes)."""
  h = hashlib.sha256(json.dumps(lm.config.to_hf_dict(), sort_keys=True).encode())
  for path, leaf in sorted(jax.tree_util.tree_leaves_with_path(lm.params), key=lambda kv: str(kv[0])):
    flat = jnp.ravel(leaf)
    step = max(flat.size // 256, 1)
    h.update(f"{jax.tree_util.keystr(path)}{leaf.shape}{leaf.dtype}".encode())
    h.update(np.asarray(flat[::step][:256], np.float32).tobytes())
  return h.hexdigest()[:16]


def tokenizer_hash(tokenizer) -> str:
  backend = getattr(tokenizer, "backend_tokenizer", None)
  blob = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def record_hash(record) -> str:
  """What a record's features depend on: its prompt and response token ids."""
  blob = json.dumps([list(map(int, record["prompt_ids"])), list(map(int, record["response_ids"]))])
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _atomic_bytes(path: str, data: bytes) -> None:
  with atomic_open(path, "wb") as f:
    f.write(data)


def token_features(lm: LanguageModel, records: Sequence[dict], spec: FeatureSpec, *,
                   batch_size: int = 8) -> list[np.ndarray]:
  """[n_response_tokens, F] per record, next-token aligned (token j from position prompt_len + j - 1)."""
  from reprobe_jax.models.forward import forward, positions_from_mask
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
    feats = np.asarray(spec.assemble(forward_values(res), lm.config.num_layers))
    for r, i in enumerate(idx):
      p, n = len(records[i]["prompt_ids"]), len(records[i]["response_ids"])
      out[i] = feats[r, p - 1:p - 1 + n]
  return out  # type: ignore[return-value]


def _chunk_features(lm, chunk, spec: FeatureSpec, batch_size: int, captured: Mapping[str, np.ndarray]):
  """Features per record of a chunk: the captured ones where there are, a teacher-forced forward for the rest."""
  dim = spec.dim(lm.config)
  missing = [r for r in chunk if r["id"] not in captured]
  forward = dict(zip([r["id"] for r in missing], token_features(lm, missing, spec, batch_size=batch_size)))
  out = []
  for r in chunk:
    f = captured[r["id"]] if r["id"] in captured else forward[r["id"]]
    if f.shape != (len(r["response_ids"]), dim):
      raise FeatureMismatchError(f"trajectory {r['id']!r}: captured features have shape {f.shape}, expected "
                                 f"({len(r['response_ids'])}, {dim}) for spec {spec.name!r}")
    out.append(np.asarray(f, np.float32))
  return out


class FeatureStore:
  """Reads a finished feature directory: `store[id]` -> [n_tokens, F]; `store.ids`."""

  def __init__(self, directory: str, *, expect: dict | None = None):
    self.directory = directory
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
      raise ConfigError(f"{directory}: no {MANIFEST} (not a feature directory)")
    with open(path) as f:
      self.manifest = json.load(f)
    if expect:
      for key, want in expect.items():
        have = self.manifest.get(key)
        if have != want:
          raise FeatureMismatchError(f"{directory}: features were made with {key}={have!r}, expected {want!r}")
    self._index: dict[str, tuple[int, int]] = {}
    self._cache: dict[int, dict] = {}
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
      with np.load(os.path.join(self.directory, self.manifest["shards"][k]["file"])) as z:
        self._cache = {k: {"features": z["features"], "offsets": z["offsets"]}}
    sh = self._cache[k]
    return sh["features"][sh["offsets"][j]:sh["offsets"][j + 1]].astype(np.float32)


def extract(lm: LanguageModel, records: Sequence[dict], spec: FeatureSpec, directory: str, *,
            shard_size: int = 256, batch_size: int = 8, dtype: str = "float32",
            on_shard: Callable[[int, int], None] | None = None,
            captured: Mapping[str, np.ndarray] | None = None) -> FeatureStore:
  """Stores features of every record into `directory`, resuming finished shards; returns the store.

  captured: {record id: [n_response_tokens, F]} features the sampler recorded while it generated the record (so no
  second forward is run for them); records not in it are run through the model (teacher-forced, e.g. imported
  trajectories)."""
  os.makedirs(directory, exist_ok=True)
  header = {"model_fingerprint": model_fingerprint(lm), "tokenizer_hash": tokenizer_hash(lm.tokenizer),
            "spec": dataclasses.asdict(spec), "feature_dim": spec.dim(lm.config), "dtype": dtype,
            "alignment": "next-token: token j from position j-1; response tokens only"}
  header = json.loads(json.dumps(header))  # compare as stored (tuples become lists)
  path = os.path.join(directory, MANIFEST)
  manifest = {**header, "shards": [], "complete": False}
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    for key in ("model_fingerprint", "tokenizer_hash", "spec", "feature_dim", "dtype"):
      if old.get(key) != header[key]:
        raise FeatureMismatchError(f"{directory}: holds features with {key}={old.get(key)!r}, but this run has "
                                   f"{header[key]!r}; use another directory")
    manifest["shards"] = [s for s in old["shards"] if os.path.exists(os.path.join(directory, s["file"]))]
  done = {tid: h for s in manifest["shards"] for tid, h in zip(s["ids"], s.get("hashes", [None] * len(s["ids"])))}
  for r in records:  # a stored record must have been made from the same tokens (shards before hashes: unchecked)
    if done.get(r["id"]) is not None and done[r["id"]] != record_hash(r):
      raise FeatureMismatchError(f"{directory}: the features stored for trajectory {r['id']!r} were made from other "
                                 "tokens than it now has; use another directory")
  todo = [r for r in records if r["id"] not in done]
  total = -(-len(todo) // shard_size)
  for k in range(total):
    chunk = todo[k * shard_size:(k + 1) * shard_size]
    feats = _chunk_features(lm, chunk, spec, batch_size, captured or {})
    offsets = np.cumsum([0] + [len(f) for f in feats])
    data = np.concatenate(feats, axis=0) if feats else np.zeros((0, header["feature_dim"]), np.float32)
    name = f"shard_{len(manifest['shards']):05d}.npz"
    buf = io.BytesIO()
    np.savez(buf, features=data.astype(dtype), offsets=offsets, ids=np.asarray([r["id"] for r in chunk]))
    _atomic_bytes(os.path.join(directory, name), buf.getvalue())
    manifest["shards"].append({"file": name, "ids": [r["id"] for r in chunk], "hashes": [record_hash(r) for r in chunk],
                               "tokens": int(offsets[-1])})
    _atomic_bytes(path, json.dumps(manifest, indent=1).encode())
    if on_shard is not None:
      on_shard(k + 1, total)
  manifest["complete"] = True
  manifest["counts"] = {"trajectories": sum(len(s["ids"]) for s in manifest["shards"]),
                        "tokens": sum(s["tokens"] for s in manifest["shards"])}
  _atomic_bytes(path, json.dumps(manifest, indent=1).encode())
  return FeatureStore(directory)

