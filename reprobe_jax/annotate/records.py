"""What every annotator does with a record: read it (a `Trajectory`, or a plain dict in the JSONL schema) and
return it labelled, as the same kind it came in."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence, Union

import numpy as np

from reprobe_jax.errors import DataFormatError
from reprobe_jax.steps.labels import labels_from_json, labels_to_json
from reprobe_jax.tasks.base import first_error
from reprobe_jax.trajectories import StepSpan, Trajectory

Record = Union[Trajectory, Mapping[str, Any]]

# A dict given to an annotator needs its steps; the sampler's other fields are optional (text-only data).
_ANNOTATE_FIELDS = ("steps",)


def as_trajectory(record: Record, index: int) -> Trajectory:
  """The record as a Trajectory (a dict is checked against the schema; DataFormatError naming it otherwise)."""
  if isinstance(record, Trajectory):
    return record
  if not isinstance(record, Mapping):
    raise DataFormatError(
      f"<record {index}>: expected a trajectory record (Trajectory or dict), found {type(record).__name__}"
    )
  return Trajectory.from_json(record, required=_ANNOTATE_FIELDS)


def record_id(record: Record, index: int) -> str:
  """The record's id for error messages (its position when it has none)."""
  rid = record.id if isinstance(record, Trajectory) else record.get("id") if isinstance(record, Mapping) else None
  return str(rid) if rid else f"<record {index}>"


def record_steps(record: Record, index: int) -> tuple[StepSpan, ...]:
  """The record's steps, checked; DataFormatError naming the record otherwise."""
  return as_trajectory(record, index).steps


def has_tokens(step: StepSpan | Mapping[str, Any]) -> bool:
  """Whether a step's token span [start, end) is non-empty."""
  if isinstance(step, StepSpan):
    return step.has_tokens
  return int(step["end"]) > int(step["start"])


def labelled(record: Record, labels: Sequence[float | None], annotator: str, **extra: Any) -> Record:
  """The record with `labels` (NaN or None = unknown; a step without tokens is unknown too), `first_error` and
  `annotator` set and `extra` added: a new Trajectory for a Trajectory, a new dict (labels null for unknown) for a
  dict. `first_error` is taken before steps without tokens are set unknown (it describes the text). The record's
  steps must have been checked (`record_steps`)."""
  steps = record.steps if isinstance(record, Trajectory) else record["steps"]
  if len(labels) != len(steps):
    raise ValueError(f"{len(labels)} labels for {len(steps)} steps")  # a bug in an annotator, not bad input
  values = labels_from_json(labels)
  first = first_error(values)
  values = [v if has_tokens(s) else math.nan for v, s in zip(values, steps)]
  if isinstance(record, Trajectory):
    return dataclasses.replace(
      record, labels=tuple(values), first_error=first, annotator=annotator, extra={**record.extra, **extra}
    )
  out = dict(record)
  out["labels"] = labels_to_json(values)
  out["first_error"] = first
  out["annotator"] = annotator
  out.update(extra)
  return out


def label_array(record: Record) -> np.ndarray:
  """[num_steps] float32 labels of an annotated record, NaN = unknown (what the loss and the metrics read)."""
  if isinstance(record, Trajectory):
    return record.label_array()
  if record.get("labels") is None:
    raise DataFormatError(f"trajectory {record.get('id')}: no 'labels'; annotate it first")
  return np.asarray(labels_from_json(record["labels"]), np.float32)
