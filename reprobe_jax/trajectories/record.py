"""The trajectory record: one sampled response with per-token statistics and exact step spans, and its JSONL file.

A trajectory record (`Trajectory`; JSONL, one per sample, keys in this order):
  id, problem_id, domain, mode ('line' | 'thinking'), sample (k of N),
  prompt_ids, response_ids (without the final EOS), response (text), finish_reason,
  logprobs, entropy, self_certainty: per response token j, about the distribution that produced token j
    (next-token aligned, docs/method.md §A3), from the sampler (temperature 1, unfiltered),
  steps: [{text, start, end}] token spans relative to the response (docs/method.md §A1; line mode: every non-empty line
    including '<Answer>: ...'; thinking mode: '.\\n\\n' paragraphs before </think>).
An annotated record (`reprobe_jax.annotate`) adds
  labels: one per step, 1.0 = incorrect, 0.0 = correct, null = unknown (NaN in memory),
  first_error: index of the first incorrect step the annotator found, or null,
  annotator: who labelled ('rule', 'judge:<backend>', 'import:<format>'),
and then the annotator's own keys (the rule annotator's answer and correct, a judge's judge_replies), kept in
`Trajectory.extra`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Collection, Mapping

import numpy as np

from reprobe_jax.errors import DataFormatError
from reprobe_jax.io.readers import read_jsonl, shown
from reprobe_jax.steps.labels import labels_from_json, labels_to_json
from reprobe_jax.steps.modes import RESPONSE_FORMATS as MODES


@dataclasses.dataclass(frozen=True)
class StepSpan:
  """One aligned step of a trajectory: its text and its token span [start, end) in the response (docs/method.md §A1)."""

  text: str
  start: int
  end: int

  @property
  def has_tokens(self) -> bool:
    """Whether the span holds a token (a step with none has no feature to read, so no label)."""
    return self.end > self.start

  def to_json(self) -> dict:
    return {"text": self.text, "start": self.start, "end": self.end}


def _ints(v) -> bool:
  return isinstance(v, list) and all(type(x) is int and x >= 0 for x in v)


def _floats_ok(v) -> bool:
  return isinstance(v, list) and all(type(x) is int or (type(x) is float and math.isfinite(x)) for x in v)


def _str_or_none(v) -> bool:
  return v is None or isinstance(v, str)


# (field, check, what the check expects) in file order; `labels`, `first_error`, `annotator` follow.
_SCHEMA = (
  ("id", lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
  ("problem_id", lambda v: isinstance(v, str), "a string"),
  ("domain", lambda v: isinstance(v, str), "a string"),
  ("mode", lambda v: v in MODES, f"one of {', '.join(MODES)}"),
  ("sample", lambda v: type(v) is int and v >= 0, "an integer >= 0"),
  # At least one prompt token: token j's features come from position j - 1 (docs/method.md §A3).
  ("prompt_ids", lambda v: _ints(v) and bool(v), "a non-empty list of integers >= 0 (token ids)"),
  ("response_ids", _ints, "a list of integers >= 0 (token ids)"),
  ("response", _str_or_none, "a string"),
  ("finish_reason", _str_or_none, "a string"),
  ("logprobs", _floats_ok, "a list of numbers, each finite"),
  ("entropy", _floats_ok, "a list of numbers, each finite"),
  ("self_certainty", _floats_ok, "a list of numbers, each finite"),
  ("steps", lambda v: isinstance(v, list), "a list of {text, start, end} objects (align steps first)"),
)
RECORD_FIELDS = tuple(name for name, _, _ in _SCHEMA)  # what `sample_trajectories` writes; a file must have all
_TOKEN_STATS = ("logprobs", "entropy", "self_certainty")  # one value per response token
_LABEL_FIELDS = ("labels", "first_error", "annotator")


@dataclasses.dataclass(frozen=True)
class Trajectory:
  """One sampled trajectory and, once annotated, its step labels (the record schema is in the module docstring).

  labels: [num_steps] 1.0 / 0.0 / NaN (unknown), or None before annotation. `extra` holds the keys an annotator
  adds beyond labels (written after them, in their order).
  """

  id: str
  problem_id: str
  domain: str
  mode: str
  steps: tuple[StepSpan, ...]
  sample: int = 0
  prompt_ids: tuple[int, ...] = ()
  response_ids: tuple[int, ...] = ()
  response: str | None = None
  finish_reason: str | None = None
  logprobs: tuple[float, ...] = ()  # [num_response_tokens]
  entropy: tuple[float, ...] = ()  # [num_response_tokens]
  self_certainty: tuple[float, ...] = ()  # [num_response_tokens]
  labels: tuple[float, ...] | None = None  # [num_steps]
  first_error: int | None = None
  annotator: str | None = None
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)

  @property
  def spans(self) -> list[tuple[int, int]]:
    """[(start, end)] token span of every step."""
    return [(s.start, s.end) for s in self.steps]

  def label_array(self) -> np.ndarray:
    """[num_steps] float32 labels, NaN = unknown; DataFormatError when the trajectory is not annotated."""
    if self.labels is None:
      raise DataFormatError(f"trajectory {self.id!r} has no labels (annotate it first)")
    return np.asarray(self.labels, np.float32)

  def to_json(self) -> dict:
    """The JSONL record: the sampler's keys, then labels / first_error / annotator once annotated, then `extra`."""
    out: dict[str, Any] = {name: _json_value(name, getattr(self, name)) for name in RECORD_FIELDS}
    if self.labels is not None:
      out.update(labels=labels_to_json(self.labels), first_error=self.first_error, annotator=self.annotator)
    out.update(self.extra)
    return out

  @classmethod
  def from_json(cls, obj: Any, where: str = "", *, required: Collection[str] = RECORD_FIELDS) -> Trajectory:
    """A Trajectory from a JSON record; DataFormatError '<where>trajectory <id>: ...' naming the field on any defect.

    required: the fields that must be present (default: all the sampler writes); absent optional ones take their
    defaults, so annotators can take text-only records. Keys beyond the schema go to `extra`.
    """
    if not isinstance(obj, Mapping):
      raise DataFormatError(f"{where}expected a trajectory record (a JSON object), found {type(obj).__name__}")
    name = _record_name(obj.get("id"), where)
    values: dict[str, Any] = {}
    for field, check, expected in _SCHEMA:
      if field not in obj:
        if field in required:
          raise DataFormatError(f"{name}: missing field {field!r}")
        continue
      values[field] = _checked(name, field, obj[field], check, expected)
    n_tokens = len(values["response_ids"]) if "response_ids" in values else None
    for field in _TOKEN_STATS:
      if n_tokens is not None and field in values and len(values[field]) != n_tokens:
        raise DataFormatError(
          f"{name}: field {field!r} has {len(values[field])} values for {n_tokens} response tokens (one per token)"
        )
    values["steps"] = _steps(values.get("steps", []), n_tokens, name)
    for field in ("prompt_ids", "response_ids", *_TOKEN_STATS):
      if field in values:
        values[field] = tuple(values[field])
    labels = obj.get("labels")
    if labels is not None:
      if not isinstance(labels, list) or not all(
        v is None or (type(v) in (int, float) and v in (0, 1)) for v in labels
      ):
        raise DataFormatError(
          f"{name}: field 'labels' must be a list of numbers or nulls, each 0 (correct), 1 "
          f"(incorrect) or null (unknown), found {shown(labels)}"
        )
      if len(labels) != len(values["steps"]):
        raise DataFormatError(f"{name}: {len(labels)} labels for {len(values['steps'])} steps")
      values["labels"] = tuple(labels_from_json(labels))
    first = obj.get("first_error")
    if first is not None and (type(first) is not int or not 0 <= first < len(values["steps"])):
      raise DataFormatError(
        f"{name}: field 'first_error' must be an integer or null, a step index in "
        f"0..{len(values['steps']) - 1}, found {shown(first)}"
      )
    if not _str_or_none(obj.get("annotator")):
      raise DataFormatError(f"{name}: field 'annotator' must be a string, found {shown(obj['annotator'])}")
    known = set(RECORD_FIELDS) | set(_LABEL_FIELDS)
    return cls(
      **{"id": "", "problem_id": "", "domain": "", "mode": "", **values},
      first_error=first,
      annotator=obj.get("annotator"),
      extra={k: v for k, v in obj.items() if k not in known},
    )

  def check(self, where: str = "", *, fields: Collection[str] = RECORD_FIELDS) -> None:
    """DataFormatError '<where>trajectory <id>: ...' naming the first of `fields` whose value the record schema
    refuses, as `from_json` would refuse it in a file (a record built in code is held to the same schema)."""
    name = _record_name(self.id, where)
    for field, check, expected in _SCHEMA:
      if field in fields:
        _checked(name, field, _json_value(field, getattr(self, field)), check, expected)


def _record_name(rid: Any, where: str) -> str:
  """'<where>trajectory <id>' for error messages ('<where>trajectory' while the id is not a non-empty string)."""
  return f"{where}trajectory {rid!r}" if isinstance(rid, str) and rid else f"{where}trajectory"


def _checked(name: str, field: str, value: Any, check: Callable[[Any], bool], expected: str) -> Any:
  if not check(value):
    raise DataFormatError(f"{name}: field {field!r} must be {expected}, found {shown(value)}")
  return value


def _json_value(field: str, value: Any) -> Any:
  """A record field's value as the JSONL file holds it (tuples as lists, steps as {text, start, end} objects)."""
  if field == "steps":
    return [s.to_json() for s in value]
  return list(value) if isinstance(value, tuple) else value


def _steps(raw: list, n_tokens: int | None, name: str) -> tuple[StepSpan, ...]:
  """The checked steps of a record: {text, start, end} objects whose token spans are ordered, do not overlap and lie
  in the response (0 <= start <= end <= n_tokens, each start at or after the previous end; docs/method.md §A1)."""
  steps, prev = [], 0
  for k, s in enumerate(raw):
    if not (
      isinstance(s, Mapping)
      and isinstance(s.get("text"), str)
      and type(s.get("start")) is int
      and type(s.get("end")) is int
    ):
      raise DataFormatError(
        f"{name}: steps[{k}] must be a {{text, start, end}} object (text a string, start "
        f"and end integers), found {shown(s)}"
      )
    start, end = s["start"], s["end"]
    if not prev <= start <= end:
      raise DataFormatError(
        f"{name}: steps[{k}] spans tokens [{start}, {end}); spans must be ordered and not "
        f"overlap (start >= {prev}, the previous step's end, and end >= start)"
      )
    if n_tokens is not None and end > n_tokens:
      raise DataFormatError(f"{name}: steps[{k}] spans tokens [{start}, {end}), past the response's {n_tokens} tokens")
    steps.append(StepSpan(s["text"], start, end))
    prev = end
  return tuple(steps)


def read_trajectories(path: str | os.PathLike, *, sealed: bool = False) -> list[Trajectory]:
  """The trajectories of a JSONL file, checked; DataFormatError naming 'path:line', the trajectory and the field
  (and, when `sealed`, the file when it does not match its seal: a job's own stored trajectories)."""
  path = os.fspath(path)
  out, seen = [], {}
  for number, obj in read_jsonl(path, sealed=sealed):
    traj = Trajectory.from_json(obj, f"{path}:{number}: ")
    if traj.id in seen:
      raise DataFormatError(f"{path}:{number}: duplicate trajectory id {traj.id!r} (first on line {seen[traj.id]})")
    seen[traj.id] = number
    out.append(traj)
  return out
