"""Step labels (docs/method.md §A2): 1.0 = incorrect, 0.0 = correct, NaN = unknown in memory; JSON has no NaN, so files
write an unknown label as null. These two functions are the only place that converts between the two."""

from __future__ import annotations

import math
from typing import Iterable


def labels_to_json(labels: Iterable[float | None]) -> list[float | None]:
  """Labels as a file stores them: NaN (or None) -> null, anything else a float."""
  return [None if v is None or math.isnan(v) else float(v) for v in labels]


def labels_from_json(values: Iterable[float | None]) -> list[float]:
  """Labels as read from a file: null (or NaN) -> NaN, anything else a float (what the loss and metrics read)."""
  return [math.nan if v is None else float(v) for v in values]
