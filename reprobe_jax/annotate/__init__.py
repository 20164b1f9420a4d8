"""Step labels for trajectory records (METHOD A2): rule-based, LLM judge (self-annotation or an API), imported.

Every annotator takes trajectory records (dicts, schema in `reprobe_jax.trajectories`) and returns new records (the
inputs are not changed; nested values such as `steps` are shared, not copied) with these keys added:
  labels: one per step, 1.0 = incorrect, 0.0 = correct, None = unknown (NaN; JSON has no NaN). A step with no
    tokens (end <= start) is always None: no feature can be read for it.
  first_error: index of the first step the annotator found incorrect (ProcessBench style), or None. It is taken
    before steps with no tokens are set to None, so it describes the text, not what can be trained on.
  annotator: who labelled ('rule', 'judge:<backend>', 'import:<format>').
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from reprobe_jax.errors import DataFormatError
from reprobe_jax.tasks.base import first_error


def record_id(record: Mapping[str, Any], index: int) -> str:
  """The record's id for error messages (its position when it has none)."""
  rid = record.get("id") if isinstance(record, Mapping) else None
  return str(rid) if rid is not None else f"<record {index}>"


def record_steps(record: Mapping[str, Any], index: int) -> list[dict]:
  """The record's `steps` list, checked; DataFormatError naming the record otherwise."""
  if not isinstance(record, Mapping):
    raise DataFormatError(f"<record {index}>: expected a trajectory record (dict), found {type(record).__name__}")
  steps = record.get("steps")
  if not isinstance(steps, list) or not all(isinstance(s, Mapping) and "text" in s for s in steps):
    raise DataFormatError(f"trajectory {record_id(record, index)}: field 'steps' must be a list of "
                          "{text, start, end} objects (align steps before annotating)")
  return steps


def has_tokens(step: Mapping[str, Any]) -> bool:
  """Whether a step's token span [start, end) is non-empty (steps without spans count as having tokens)."""
  if "start" not in step or "end" not in step:
    return True
  return int(step["end"]) > int(step["start"])


def labelled(record: Mapping[str, Any], labels: Sequence[float], annotator: str, **extra: Any) -> dict:
  """A new record with `labels` (NaN -> None, steps without tokens -> None), `first_error` and `annotator`."""
  steps = record["steps"]
  if len(labels) != len(steps):
    raise ValueError(f"{len(labels)} labels for {len(steps)} steps")  # a bug in an annotator, not bad input
  out = dict(record)
  out["labels"] = [None if (v is None or math.isnan(v) or not has_tokens(s)) else float(v)
                   for v, s in zip(labels, steps)]
  out["first_error"] = first_error([math.nan if v is None else float(v) for v in labels])
  out["annotator"] = annotator
  out.update(extra)
  return out


def label_array(record: Mapping[str, Any]) -> np.ndarray:
  """[num_steps] float32 labels of an annotated record, None -> NaN (what the loss and the metrics read)."""
  if "labels" not in record:
    raise DataFormatError(f"trajectory {record.get('id')}: no 'labels'; annotate it first")
  return np.asarray([np.nan if v is None else v for v in record["labels"]], np.float32)


from reprobe_jax.annotate.importer import import_labels  # noqa: E402
from reprobe_jax.annotate.judge import (JudgeBackendError, JudgePrompts, OpenAICompatibleJudge,  # noqa: E402
                                        SelfJudge, annotate_judge, parse_verdict, parse_verdict_list,
                                        reference_solution)
from reprobe_jax.annotate.rule import annotate_rule  # noqa: E402

__all__ = ["JudgeBackendError", "JudgePrompts", "OpenAICompatibleJudge", "SelfJudge", "annotate_judge",
           "annotate_rule", "has_tokens", "import_labels", "label_array", "labelled", "parse_verdict",
           "parse_verdict_list", "record_id", "record_steps", "reference_solution"]
