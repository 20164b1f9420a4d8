"""Seals: a content hash stored beside a file (`<file>.sha256`, in `sha256sum` format), so a stored artifact that
was changed, truncated or damaged after it was written is refused when it is read back instead of being trusted.

A job's own stage files are written sealed (`atomic_open(..., seal=True)`, `write_json(..., seal=True)`, all in
`reprobe_jax.io.atomic`) and read sealed (`read_json(..., sealed=True)`); a stage counts as done only when its files and their seals exist, so a job
killed between writing a file and its seal redoes the stage. Files read by other libraries (safetensors, numpy)
are checked with `check_seal` first.
"""

from __future__ import annotations

import hashlib
import os
import stat

from reprobe_jax.errors import DataFormatError, ReprobeError

SUFFIX = ".sha256"


def seal_path(path: str | os.PathLike) -> str:
  """Where the seal of `path` is stored."""
  return os.fspath(path) + SUFFIX


def regular_file(path: str | os.PathLike, what: str = "file", error: type[ReprobeError] = DataFormatError) -> str:
  """`path` if it names a regular file (after links); `error` naming it otherwise (missing, a folder, a named pipe
  or a device, any of which would make a reader fail late or block forever)."""
  path = os.fspath(path)
  try:
    mode = os.stat(path).st_mode
  except OSError as e:
    raise error(f"{path}: cannot read {what} ({e.strerror or e})") from None
  if not stat.S_ISREG(mode):
    kind = "a folder" if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode) else "not a regular file"
    raise error(f"{path}: {what} must be a regular file, but it is {kind}")
  return path


def digest(data: bytes) -> str:
  """The sha256 hex digest of `data`."""
  return hashlib.sha256(data).hexdigest()


def file_digest(path: str | os.PathLike, what: str = "file") -> str:
  """The sha256 hex digest of a regular file's bytes."""
  with open(regular_file(path, what), "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def is_sealed(path: str | os.PathLike) -> bool:
  """Whether `path` and its seal both exist (not whether they agree: `check_seal` reads them)."""
  return os.path.exists(path) and os.path.exists(seal_path(path))


def recorded_digest(path: str | os.PathLike, what: str = "file") -> str:
  """The digest stored in the seal of `path`; DataFormatError when the seal is missing or malformed."""
  path = os.fspath(path)
  where = seal_path(path)
  if not os.path.exists(where):
    raise DataFormatError(
      f"{path}: {what} has no seal ({os.path.basename(where)} is missing): it was not written completely by this "
      "library; delete it to recompute it"
    )
  try:
    with open(regular_file(where, "seal"), encoding="utf-8") as f:
      text = f.read(200)
  except (OSError, UnicodeDecodeError) as e:
    raise DataFormatError(f"{where}: cannot read the seal of {what} ({e})") from None
  hexdigest = text.split(" ", 1)[0].strip()
  if len(hexdigest) != 64 or any(c not in "0123456789abcdef" for c in hexdigest):
    raise DataFormatError(f"{where}: the seal of {what} holds no sha256 digest")
  return hexdigest


def check_data(path: str | os.PathLike, data: bytes, what: str = "file") -> None:
  """DataFormatError unless `data` (the bytes read from `path`) matches the seal of `path`."""
  path = os.fspath(path)
  want = recorded_digest(path, what)
  got = digest(data)
  if got != want:
    raise DataFormatError(
      f"{path}: {what} does not match its seal ({len(data)} bytes with sha256 {got[:16]}..., sealed "
      f"{want[:16]}...): it was changed or damaged after it was written; delete it to recompute it"
    )


def check_seal(path: str | os.PathLike, what: str = "file") -> None:
  """DataFormatError unless `path` is a regular file whose bytes match its seal."""
  path = regular_file(path, what)
  with open(path, "rb") as f:
    data = f.read()
  check_data(path, data, what)


def check_folder(directory: str | os.PathLike, what: str = "folder", *, required: bool = True) -> None:
  """`check_seal` for every regular file under `directory` (written by `reprobe_jax.io.atomic.seal_folder`);
  DataFormatError naming the first file that is damaged or, when `required`, has no seal. With `required=False`
  a folder written elsewhere (no seals at all) passes, but one whose files are sealed is checked."""
  directory = os.fspath(directory)
  files = []
  for root, _, names in os.walk(directory):
    files += [os.path.join(root, n) for n in sorted(names) if not n.endswith(SUFFIX) and not n.startswith(".")]
  if not required and not any(os.path.exists(seal_path(f)) for f in files):
    return
  for path in files:
    check_seal(path, f"{what} file {os.path.relpath(path, directory)}")
