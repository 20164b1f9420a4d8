"""Typed errors that name what is wrong, so the CLI can print them in one line."""

import contextlib
from typing import Iterator


class ReprobeError(Exception):
  """Base class of every error reprobe-jax raises on bad input."""


class UnsupportedModelError(ReprobeError):
  """The checkpoint's architecture or one of its options is not implemented."""


class CheckpointError(ReprobeError):
  """A checkpoint is missing tensors, has extra ones, or a tensor has the wrong shape."""


class CacheFullError(ReprobeError):
  """A prompt plus the requested new tokens do not fit the KV cache or the model's context."""


class ConfigError(ReprobeError):
  """A configuration value is missing or out of range."""


class DataFormatError(ReprobeError):
  """A data file or record is malformed; the message names the file and line (or the record) and the field."""


class JudgeBackendError(ReprobeError):
  """A judge backend failed (server unreachable, HTTP error, malformed response); the message names the URL."""


class DistributedError(ReprobeError):
  """A multi-process job cannot start: its settings (coordinator address, process count, process id) are missing,
  out of range or disagree between processes, or the coordinator cannot be reached in time. The message names the
  setting and where it came from (a flag or an environment variable)."""


@contextlib.contextmanager
def shape_errors(where: str, error: type[ReprobeError] = ConfigError) -> Iterator[None]:
  """Turns a failed shape, rank or dtype assertion in the block (`chex.assert_*` raises AssertionError) into `error`
  naming `where`, so a caller handing in a misshapen array gets the typed error every other bad input gets."""
  try:
    yield
  except AssertionError as e:
    raise error(f"{where}: {e}") from None
