"""Feature extraction (docs/method.md §A3): every trajectory record's per-token features, into a resumable store.

`token_features` runs a teacher-forced forward of prompt + response and keeps the response tokens' features
(`FeatureSpec`); `extract` stores them for many records, shard by shard, in the files `store.py` describes, taking
the features the sampler captured while it generated a record where there are some. Shards and the manifest are
written atomically, so a killed extraction resumes from its last finished shard.

What is checked, and what happens on a mismatch:
- Records, before anything is written: each is a `Trajectory` whose fields extraction reads (`Trajectory.check`:
  ids, token lists of ints, a non-empty prompt), unique ids, token ids inside the model's vocabulary and sequences
  inside its context (DataFormatError / CacheFullError naming the record), captured features of the right shape.
- The manifest and the shards, as `store.py` says.
- On resume (`extract` into a folder with a manifest), every shard that holds one of the records asked for is read
  and checked as above. A damaged shard is recomputed (logged; features are a function of model, spec and tokens,
  and its records are at hand); a shard made for other tokens than a record now has (same id, another response),
  or for another store, is refused (FeatureMismatchError): that is a different job's data, not damage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from reprobe_jax.errors import CacheFullError, ConfigError, DataFormatError, DistributedError, ReprobeError
from reprobe_jax.features.spec import FeatureSpec, forward_values, padded_forward
from reprobe_jax.features.store import (
  DTYPES,
  FORMAT,
  FORMAT_VERSION,
  HEADER_KEYS,
  MANIFEST,
  FeatureMismatchError,
  FeatureStore,
  load_shard,
  read_manifest,
  record_hash,
  shard_blob,
  shard_entry,
)
from reprobe_jax.io.atomic import atomic_open
from reprobe_jax.models import LanguageModel
from reprobe_jax.models.sharding import barrier, failed_processes, spans_processes, to_host
from reprobe_jax.trajectories.record import Trajectory


def model_fingerprint(lm: LanguageModel) -> str:
  """sha256 over the config and, for every parameter, its path, shape, dtype and a strided sample of its values
  (reading every weight of an 8B model just to name it would cost minutes)."""
  h = hashlib.sha256(json.dumps(lm.config.to_hf_dict(), sort_keys=True).encode())
  leaves = sorted(jax.tree_util.tree_leaves_with_path(lm.params), key=lambda kv: str(kv[0]))
  samples = []
  for _, leaf in leaves:
    flat = jnp.ravel(leaf)
    samples.append(flat[:: max(flat.size // 256, 1)][:256])
  for (path, leaf), sample in zip(leaves, to_host(samples)):  # one gather when the parameters span processes
    h.update(f"{jax.tree_util.keystr(path)}{leaf.shape}{leaf.dtype}".encode())
    h.update(np.asarray(sample, np.float32).tobytes())
  return h.hexdigest()[:16]


def tokenizer_hash(tokenizer) -> str:
  backend = getattr(tokenizer, "backend_tokenizer", None)
  blob = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
  return hashlib.sha256(blob.encode()).hexdigest()[:16]


_READ_FIELDS = ("id", "prompt_ids", "response_ids")  # what extraction reads of a trajectory record


def check_records(lm: LanguageModel, records: Sequence[Trajectory]) -> None:
  """DataFormatError naming the record unless each is a `Trajectory` whose fields extraction reads hold what the
  record schema allows (`Trajectory.check`: an id, a non-empty prompt_ids, response_ids) and whose token ids are in
  the model's vocabulary; CacheFullError naming it when prompt + response exceed the model's context."""
  for index, t in enumerate(records):
    if not isinstance(t, Trajectory):
      raise DataFormatError(f"<record {index}>: expected a Trajectory record, found {type(t).__name__}")
    t.check(f"<record {index}>: ", fields=_READ_FIELDS)
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


def token_features(
  lm: LanguageModel, records: Sequence[Trajectory], spec: FeatureSpec, *, batch_size: int = 8
) -> list[np.ndarray]:
  """[n_response_tokens, F] per record, next-token aligned (token j from position prompt_len + j - 1); records are
  checked first (`check_records`)."""
  check_records(lm, records)
  capture = spec.capture()
  out: list[np.ndarray | None] = [None] * len(records)
  order = sorted(range(len(records)), key=lambda i: len(records[i].prompt_ids) + len(records[i].response_ids))
  for s in range(0, len(order), batch_size):
    idx = order[s : s + batch_size]
    seqs = [list(records[i].prompt_ids) + list(records[i].response_ids) for i in idx]
    res = padded_forward(lm, seqs, capture, batch_size)
    feats = to_host(spec.assemble(forward_values(res), lm.config.num_layers))  # rows may live on other processes
    for r, i in enumerate(idx):
      p, n = len(records[i].prompt_ids), len(records[i].response_ids)
      out[i] = feats[r, p - 1 : p - 1 + n]
  return out  # type: ignore[return-value]


def _check_shape(record: Trajectory, features, dim: int, spec: FeatureSpec) -> None:
  shape = np.shape(features)
  if shape != (len(record.response_ids), dim):
    raise FeatureMismatchError(
      f"trajectory {record.id!r}: captured features have shape {shape}, expected "
      f"({len(record.response_ids)}, {dim}) for spec {spec.name!r}"
    )


def _chunk_features(
  lm: LanguageModel, chunk: Sequence[Trajectory], spec: FeatureSpec, batch_size: int, captured: Mapping[str, np.ndarray]
) -> list[np.ndarray]:
  """Features per record of a chunk: the captured ones where there are, a teacher-forced forward for the rest."""
  dim = spec.dim(lm.config)
  missing = [r for r in chunk if r.id not in captured]
  forced = dict(zip([r.id for r in missing], token_features(lm, missing, spec, batch_size=batch_size)))
  out = []
  for r in chunk:
    f = captured[r.id] if r.id in captured else forced[r.id]
    _check_shape(r, f, dim, spec)
    out.append(np.asarray(f, np.float32))
  return out


def _header(lm: LanguageModel, spec: FeatureSpec, dtype: str) -> dict:
  """What a store's features depend on besides the records, as the manifest stores it (tuples become lists)."""
  header = {
    "model_fingerprint": model_fingerprint(lm),
    "tokenizer_hash": tokenizer_hash(lm.tokenizer),
    "spec": dataclasses.asdict(spec),
    "feature_dim": spec.dim(lm.config),
    "dtype": dtype,
  }
  return json.loads(json.dumps(header))


def _check_job(
  lm: LanguageModel,
  records: Sequence[Trajectory],
  spec: FeatureSpec,
  shard_size,
  batch_size,
  dtype,
  captured: Mapping[str, np.ndarray],
) -> None:
  """ConfigError / DataFormatError / FeatureMismatchError for an extraction that cannot run, before any write."""
  for name, v in (("shard_size", shard_size), ("batch_size", batch_size)):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
      raise ConfigError(f"extract: {name} must be an integer >= 1, found {v!r}")
  if dtype not in DTYPES:
    raise ConfigError(f"extract: dtype must be one of {', '.join(DTYPES)}, found {dtype!r}")
  if "logit" in spec.parts and spec.top_k > lm.config.vocab_size:
    raise ConfigError(
      f"feature part 'logit': top_k={spec.top_k} is more than the model's vocabulary of {lm.config.vocab_size} tokens"
    )
  spec.capture().resolve_layers(lm.config.num_layers)  # ConfigError naming a layer outside the model
  check_records(lm, records)
  seen: dict[str, int] = {}
  for index, r in enumerate(records):
    if r.id in seen:
      raise DataFormatError(
        f"<record {index}>: trajectory {r.id!r} is also record {seen[r.id]}; a feature store is keyed by id"
      )
    seen[r.id] = index
    if r.id in captured:
      _check_shape(r, captured[r.id], spec.dim(lm.config), spec)


def _resumable(directory: str, header: dict, records: Sequence[Trajectory]) -> list[dict]:
  """The shard entries of an existing folder to keep (module docstring: what is refused, what is recomputed)."""
  old = read_manifest(directory)
  for key in HEADER_KEYS:
    if old[key] != header[key]:
      raise FeatureMismatchError(
        f"{directory}: holds features with {key}={old[key]!r}, but this run has {header[key]!r}; use another directory"
      )
  wanted = {r.id: record_hash(r) for r in records}
  for entry in old["shards"]:  # a stored record must have been made from the same tokens
    for tid, h in zip(entry["ids"], entry["hashes"]):
      if tid in wanted and wanted[tid] != h:
        raise FeatureMismatchError(
          f"{directory}: the features stored for trajectory {tid!r} were made from other "
          "tokens than it now has; use another directory"
        )
  kept = []
  for entry in old["shards"]:
    if any(tid in wanted for tid in entry["ids"]):
      try:
        load_shard(directory, entry, header)
      except DataFormatError as e:
        logging.warning("%s; its %d records are extracted again", e, len(entry["ids"]))
        continue
    kept.append(entry)
  return kept


def extract(
  lm: LanguageModel,
  records: Sequence[Trajectory],
  spec: FeatureSpec,
  directory: str,
  *,
  shard_size: int = 256,
  batch_size: int = 8,
  dtype: str = "float32",
  on_shard: Callable[[int, int], None] | None = None,
  captured: Mapping[str, np.ndarray] | None = None,
) -> FeatureStore:
  """Stores features of every record (a `Trajectory`) into `directory`, resuming finished shards; returns the store.

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
  manifest = {
    "format": FORMAT,
    "format_version": FORMAT_VERSION,
    **header,
    "alignment": "next-token: token j from position j-1; response tokens only",
    "shards": shards,
    "complete": False,
  }
  kept = list(shards)  # manifest["shards"] grows with process 0's new shards
  done = {tid for s in kept for tid in s["ids"]}
  used = {s["file"] for s in kept}
  todo = [r for r in records if r.id not in done]
  total = -(-len(todo) // shard_size)
  names = [n for n in (f"shard_{i:05d}.npz" for i in range(len(used) + total)) if n not in used][:total]
  together = spans_processes(lm.params)
  embedded = np.asarray(json.dumps(header, sort_keys=True))
  failure = None
  try:
    for k in range(total):
      if k % procs != me and not together:
        continue
      chunk = todo[k * shard_size : (k + 1) * shard_size]
      blob = shard_blob(chunk, _chunk_features(lm, chunk, spec, batch_size, captured), dtype, embedded)
      if k % procs == me:
        _atomic_bytes(os.path.join(directory, names[k]), blob)
        if me == 0:
          manifest["shards"].append(shard_entry(names[k], chunk, blob))
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
        manifest["shards"] = kept + [
          _written_entry(directory, names[k], todo[k * shard_size : (k + 1) * shard_size], header, k % procs)
          for k in range(total)
        ]
      except ReprobeError as e:
        failure = e
    _all_or_none(
      failure,
      f"{directory}: process(es) {{}} could not list every process's shards; is the folder "
      "on a file system every process shares?",
    )
  if me == 0:
    manifest["complete"] = True
    manifest["counts"] = {
      "trajectories": sum(len(s["ids"]) for s in manifest["shards"]),
      "tokens": sum(s["tokens"] for s in manifest["shards"]),
    }
    _atomic_bytes(path, json.dumps(manifest, indent=1).encode())
  barrier("features.extract: manifest written")
  return FeatureStore(directory)


def _written_entry(directory: str, name: str, chunk: Sequence[Trajectory], header: dict, writer: int) -> dict:
  """The manifest entry of a shard another process wrote (process 0 reads it back and checks it like any shard)."""
  try:
    with open(os.path.join(directory, name), "rb") as f:
      entry = shard_entry(name, chunk, f.read())
  except OSError as e:
    raise DataFormatError(
      f"{os.path.join(directory, name)}: process {writer} wrote this shard, but process 0 "
      f"cannot read it ({e.strerror or e}); is {directory} on a file system every process "
      "shares?"
    ) from None
  load_shard(directory, entry, header)
  return entry


def _all_or_none(failure: Exception | None, message: str) -> None:
  """Every process learns whether any failed here: the one that did raises its own error, the others a
  DistributedError (`message` with the failed ids)."""
  failed = failed_processes(failure is not None)
  if failure is not None:
    raise failure
  if failed:
    raise DistributedError(message.format(failed))
