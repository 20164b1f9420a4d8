"""Step labels imported from a file (docs/method.md §A2(c)): per-step labels, a ProcessBench first-error index, or
PRM800K ratings.

The file is JSONL, one object per trajectory: {"id": <trajectory id>} plus exactly one of
  "labels": [0 | 1 | null, ...]   one per step; 1 = incorrect, 0 = correct, null = unknown (our convention).
  "first_error": k | -1 | null    ProcessBench: steps before k are correct, step k is incorrect, steps after k are
                                  unknown (NaN: after the first error the annotation says nothing). -1 or null = no
                                  error: every step is correct.
  "ratings": [-1 | 0 | 1 | null, ...]  PRM800K: -1 = bad (label 1), 0 = neutral (label 0: PRM800K counts a
                                  neutral step as acceptable), 1 = good (label 0), null = unknown.
Worked example for a trajectory of 4 steps: first_error 1 -> labels [0, 1, NaN, NaN]; first_error -1 ->
[0, 0, 0, 0]; ratings [1, 0, -1, 1] -> [0, 0, 1, 0].
The annotator name is 'import:<format>' ('import:labels', 'import:first_error', 'import:ratings').
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

from absl import logging

from reprobe_jax.annotate.records import Record, labelled, record_id, record_steps
from reprobe_jax.errors import DataFormatError
from reprobe_jax.io.readers import read_jsonl

FORMATS = ("labels", "first_error", "ratings")
MISSING = "import:missing"


def import_labels(records: Sequence[Record], path: str | os.PathLike, *, strict: bool = True) -> list[Record]:
  """New records with labels read from the JSONL file at `path` (format in the module docstring).

  Every defect of the file raises DataFormatError naming 'path:line': bad JSON, a missing or duplicate id, not
  exactly one of labels / first_error / ratings, a bad value, a label list whose length differs from the record's
  step count, a first_error past the last step.
  strict=True (the default) also raises when the file names an id that is not among `records`, or when a record
  has no entry in the file. strict=False ignores unknown ids (logged) and returns every record: one without an
  entry gets all-unknown labels (None) and annotator 'import:missing', so callers can drop it.
  """
  path = os.fspath(path)
  by_id: dict[str, int] = {}
  num_steps = []
  for index, record in enumerate(records):
    num_steps.append(len(record_steps(record, index)))
    rid = record_id(record, index)
    if rid in by_id:
      raise DataFormatError(
        f"trajectory {rid}: the id is used by records {by_id[rid]} and {index}; imported labels are matched by id"
      )
    by_id[rid] = index
  entries: dict[int, tuple[list[float], str]] = {}
  seen: dict[str, int] = {}
  unknown = []
  for number, obj in read_jsonl(path):
    where = f"{path}:{number}"
    if not isinstance(obj, dict):
      raise DataFormatError(f"{where}: expected a JSON object, found {type(obj).__name__}")
    rid = obj.get("id")
    if not isinstance(rid, str) or not rid:
      raise DataFormatError(f"{where}: field 'id' must be a non-empty string (the trajectory id), found {rid!r}")
    if rid in seen:
      raise DataFormatError(f"{where}: trajectory {rid!r} already has labels at line {seen[rid]}")
    seen[rid] = number
    if rid not in by_id:
      unknown.append((where, rid))
      continue
    index = by_id[rid]
    entries[index] = _parse(obj, where, rid, num_steps[index])

  if unknown:
    if strict:
      where, rid = unknown[0]
      raise DataFormatError(
        f"{where}: trajectory {rid!r} is not among the {len(records)} records given "
        f"({len(unknown)} unknown id(s) in the file; strict=False ignores them)"
      )
    logging.warning("%s: %d id(s) not among the records were ignored, e.g. %r", path, len(unknown), unknown[0][1])
  missing = [record_id(r, i) for i, r in enumerate(records) if i not in entries]
  if missing and strict:
    raise DataFormatError(
      f"{path}: {len(missing)} of {len(records)} trajectories have no labels in the file, "
      f"e.g. {missing[:3]} (strict=False keeps them with unknown labels)"
    )

  out = []
  for index, record in enumerate(records):
    if index in entries:
      labels, fmt = entries[index]
      out.append(labelled(record, labels, f"import:{fmt}"))
    else:
      out.append(labelled(record, [math.nan] * num_steps[index], MISSING))
  return out


def _parse(obj: dict, where: str, rid: str, n: int) -> tuple[list[float], str]:
  """(labels, format) of one line for a trajectory of `n` steps."""
  present = [f for f in FORMATS if f in obj]
  if len(present) != 1:
    raise DataFormatError(
      f"{where}: trajectory {rid!r} needs exactly one of {', '.join(FORMATS)}, found {present or 'none'}"
    )
  fmt = present[0]
  value = obj[fmt]
  if fmt == "first_error":
    if value is None or (_is_int(value) and value == -1):
      return [0.0] * n, fmt
    if not _is_int(value) or not 0 <= value < n:
      raise DataFormatError(
        f"{where}: trajectory {rid!r} has {n} steps; first_error must be -1, null or an index "
        f"in 0..{n - 1}, found {value!r}"
      )
    return [0.0] * value + [1.0] + [math.nan] * (n - value - 1), fmt
  if not isinstance(value, list):
    raise DataFormatError(f"{where}: field {fmt!r} must be a list, found {type(value).__name__}")
  if len(value) != n:
    raise DataFormatError(f"{where}: trajectory {rid!r} has {n} steps but {fmt!r} has {len(value)} entries")
  allowed = {"labels": {0: 0.0, 1: 1.0}, "ratings": {-1: 1.0, 0: 0.0, 1: 0.0}}[fmt]
  labels = []
  for k, v in enumerate(value):
    if v is None:
      labels.append(math.nan)
    elif _is_int(v) and v in allowed:
      labels.append(allowed[v])
    else:
      raise DataFormatError(f"{where}: {fmt}[{k}] must be one of {sorted(allowed)} or null, found {v!r}")
  return labels, fmt


def _is_int(v: Any) -> bool:
  """A JSON integer (1.0 and true are not accepted: a label file with them is probably something else)."""
  return type(v) is int
