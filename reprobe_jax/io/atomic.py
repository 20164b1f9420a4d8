"""Atomic writes: a file or a folder appears complete or not at all (one mechanism for every artifact we write),
and the JSON and JSONL writers built on it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Iterable

from reprobe_jax.io.seal import SUFFIX, file_digest, seal_path


@contextlib.contextmanager
def atomic_open(path, mode: str = "w", *, seal: bool = False, **kwargs):
  """Yields a temporary file beside `path`; after the block it is flushed, synced and renamed over `path`
  (os.replace is atomic on one file system). On any error, Ctrl-C included, the temporary file is removed and
  `path` keeps its old content.

  With `seal`, the file's digest is then written beside it (`reprobe_jax.io.seal`); an old seal is removed before
  the file is replaced, so a crash in between leaves a file without a seal (refused, or redone by a job's stage),
  never one with a wrong seal."""
  path = os.fspath(path)
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
  try:
    with os.fdopen(fd, mode, **kwargs) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    hexdigest = file_digest(tmp) if seal else None
    if seal:
      with contextlib.suppress(FileNotFoundError):
        os.remove(seal_path(path))
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)
    raise
  if seal:
    write_seal(path, hexdigest)


def write_seal(path: str | os.PathLike, hexdigest: str | None = None) -> None:
  """Writes the seal of `path` (its sha256, computed when not given) atomically beside it, in `sha256sum` format."""
  path = os.fspath(path)
  hexdigest = hexdigest or file_digest(path)
  with atomic_open(seal_path(path), "w", encoding="utf-8") as f:
    f.write(f"{hexdigest}  {os.path.basename(path)}\n")


def seal_folder(directory: str | os.PathLike, *, last: str | None = None) -> None:
  """Seals every regular file under `directory` (a saved model or probe folder: each file gets its own seal, so a
  damaged one is named when the folder is checked with `reprobe_jax.io.seal.check_folder`). The file `last` (a
  path relative to the folder) is sealed after all others: a job that takes its seal as "the folder is complete"
  never sees a folder sealed halfway."""
  directory = os.fspath(directory)
  paths = []
  for root, _, files in os.walk(directory):
    paths += [os.path.join(root, n) for n in files if not n.endswith(SUFFIX) and not n.startswith(".")]
  end = os.path.join(directory, last) if last else None
  for path in sorted(paths, key=lambda p: (p == end, p)):
    write_seal(path)


def write_json(path, obj: Any, indent: int | None = 1, *, seal: bool = False) -> None:
  """Writes `obj` as JSON, atomically (`atomic_open`), sealed when asked."""
  with atomic_open(path, seal=seal) as f:
    json.dump(obj, f, indent=indent)


def write_jsonl(path: str | os.PathLike, records: Iterable[Any], *, seal: bool = False) -> None:
  """Writes one JSON object per line; records are dicts or objects with `to_json()` (Problem,
  Trace, Trajectory).

  The file appears complete or not at all: lines go to a temporary file in the same folder, which replaces `path`
  only after every record was written (os.replace is atomic on one file system).
  """
  with atomic_open(path, "w", encoding="utf-8", seal=seal) as f:
    for record in records:
      obj = record.to_json() if hasattr(record, "to_json") else record
      # allow_nan=False: NaN is not JSON, and other readers would reject the file later.
      f.write(json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n")


@contextlib.contextmanager
def atomic_folder(path):
  """Yields a temporary folder beside `path` to fill; after the block it takes the place of `path` (an old folder
  there is removed first). On any error, Ctrl-C included, the temporary folder is removed and `path` is as before."""
  path = os.path.abspath(os.fspath(path))
  parent = os.path.dirname(path)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp-save-")
  try:
    yield tmp
    if os.path.exists(path):
      shutil.rmtree(path)
    os.replace(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
