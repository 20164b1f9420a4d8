"""Atomic file writes: a file appears complete or not at all (one mechanism for every artifact we write)."""

from __future__ import annotations

import contextlib
import os
import tempfile


@contextlib.contextmanager
def atomic_open(path, mode: str = "w", **kwargs):
  """Yields a temporary file beside `path`; after the block it is flushed, synced and renamed over `path`
  (os.replace is atomic on one file system). On any error, Ctrl-C included, the temporary file is removed and
  `path` keeps its old content."""
  path = os.fspath(path)
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
  try:
    with os.fdopen(fd, mode, **kwargs) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)
    raise
