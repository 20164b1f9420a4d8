"""TensorBoard scalars: a thin writer over tensorboardX's event files, and a reader for checks and notebooks.

    tensorboard --logdir <workdir>/tb

Writers flush on every call, so a killed run keeps what it logged; a resumed run appends a new event file in the
same folder, which TensorBoard merges (for a step logged twice it shows the later value).
"""

from __future__ import annotations

import glob
import os
import struct
from typing import Mapping

import numpy as np


class ScalarWriter:
  """`write(step, {"train/loss": 0.3, ...})` -> one TensorBoard scalar per name; non-finite values are skipped."""

  def __init__(self, logdir: str):
    self.logdir = logdir
    self._writer = None  # the event file is opened at the first write: a run with nothing to do leaves none

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if self._writer is None:
      # imported here: it pulls in protobuf, and only training jobs write events
      from tensorboardX import SummaryWriter

      os.makedirs(self.logdir, exist_ok=True)
      self._writer = SummaryWriter(self.logdir, flush_secs=1)
    for name, value in scalars.items():
      value = float(value)
      if np.isfinite(value):
        self._writer.add_scalar(name, value, int(step))
    self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()

  def __enter__(self) -> "ScalarWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """{name: [(step, value), ...]} from every event file in `logdir` (file order, then write order)."""
  from tensorboardX.proto import event_pb2  # imported here, as in ScalarWriter.write

  out: dict[str, list[tuple[int, float]]] = {}
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    with open(path, "rb") as f:
      data = f.read()
    off = 0
    while off + 12 <= len(data):  # TFRecord framing: u64 length, u32 crc, payload, u32 crc
      (n,) = struct.unpack("<Q", data[off : off + 8])
      event = event_pb2.Event.FromString(data[off + 12 : off + 12 + n])
      off += 12 + n + 4
      for v in event.summary.value:
        out.setdefault(v.tag, []).append((int(event.step), float(v.simple_value)))
  return out
