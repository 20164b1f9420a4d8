"""Run folders and their on-disk stages, shared by every job (the target build, ReProbe, TTS, SPAE, RL).

A run folder is `<root>/<key>`, the key a hash of the job's config and of fingerprints of what else decides its
results (the target model, the problems and prompts, the task code), so a changed input starts afresh in a new
folder while a rerun of the same one reuses its artifacts. A stage is skipped when its artifacts exist; the wall
time of each stage that did work is added to the folder's timings.json (cached reruns add nothing). Progress goes
to one callback type, `Progress`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from typing import Any, Callable, Iterator, Sequence

from reprobe_jax.errors import DataFormatError
from reprobe_jax.io.atomic import write_json
from reprobe_jax.io.readers import read_json
from reprobe_jax.io.seal import is_sealed

Progress = Callable[[str, int, int], None]  # (stage label, done, total); the label's first word names the stage


def no_progress(stage: str, done: int, total: int) -> None:
  """The Progress of a caller that wants none."""


def run_key(config: Any, *fingerprints: str) -> str:
  """12 hex digits of sha256(config as sorted-key JSON, then each fingerprint): a run folder's name."""
  blob = json.dumps(config, sort_keys=True, default=str) + "".join(fingerprints)
  return hashlib.sha256(blob.encode()).hexdigest()[:12]


class Run:
  """A run folder: where its artifacts go, which stages are done, and how long the done ones took."""

  TIMINGS = "timings.json"

  def __init__(self, directory: str):
    self.directory = directory
    os.makedirs(directory, exist_ok=True)

  def path(self, *parts: str) -> str:
    """The path of an artifact inside the folder."""
    return os.path.join(self.directory, *parts)

  def exists(self, *artifacts: str) -> bool:
    """Whether every named artifact exists."""
    return all(os.path.exists(self.path(a)) for a in artifacts)

  def sealed(self, *artifacts: str) -> bool:
    """Whether every named artifact exists with its seal (`reprobe_jax.io.seal`): a stage's files are done only
    then; whether they still match their seals is checked where they are read (`read_json(..., sealed=True)`)."""
    return all(is_sealed(self.path(a)) for a in artifacts)

  def stage(self, name: str, artifacts: Sequence[str], make: Callable[[], Any]) -> bool:
    """Runs `make` (which writes `artifacts`, each atomically and sealed) unless they are all there with their
    seals, and records its wall time as `name`. Returns whether it ran. A stage interrupted before its last seal
    was written reruns."""
    if self.sealed(*artifacts):
      return False
    with self.timed(name):
      make()
    missing = [a for a in artifacts if not self.sealed(a)]
    if missing:  # a bug in the stage: a rerun would redo it forever
      raise RuntimeError(f"stage {name!r} in {self.directory} did not write {missing} with their seals")
    return True

  @contextlib.contextmanager
  def timed(self, name: str, record: bool = True) -> Iterator[None]:
    """Adds the block's wall time to timings.json as `name` (when `record`; not when the block raised)."""
    t0 = time.perf_counter()
    yield
    if record:
      self.add_time(name, time.perf_counter() - t0)

  def add_time(self, name: str, seconds: float) -> None:
    """Adds `seconds` to the stage's entry in timings.json (an atomic rewrite)."""
    times = self.timings()
    times[name] = round(times.get(name, 0.0) + seconds, 2)
    write_json(self.path(self.TIMINGS), times)

  def timings(self) -> dict[str, float]:
    """{stage: seconds} of the stages that did work in this folder (empty when none did)."""
    path = self.path(self.TIMINGS)
    if not os.path.exists(path):
      return {}
    times = read_json(path, "stage timings")
    bad = [k for k, v in times.items() if isinstance(v, bool) or not isinstance(v, (int, float))]
    if bad:
      raise DataFormatError(f"{path}: stage timings must be numbers of seconds, found {bad[0]!r}: {times[bad[0]]!r}")
    return times
