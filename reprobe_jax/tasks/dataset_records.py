"""The records public math data files are read into (`MathProblem`, `LabelledSolution`, `Dataset`) and the record
checks every reader in `reprobe_jax.tasks.datasets` shares: where a record is (`path:line` in a JSONL file,
`path[index]` in a JSON array file), one check per field with one message shape, and the refusal of duplicate ids.

Step labels follow docs/method.md §A2: 1.0 incorrect, 0.0 correct, None unknown (NaN in memory, through
`reprobe_jax.steps.labels`, where the loss and the metrics read them).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable

from reprobe_jax.errors import DataFormatError
from reprobe_jax.io.readers import read_json, read_jsonl, shown
from reprobe_jax.io.seal import regular_file
from reprobe_jax.steps.labels import labels_from_json
from reprobe_jax.tasks.base import Problem, first_error
from reprobe_jax.tasks.math_task import MathTask
from reprobe_jax.tasks.hf_source import SEPARATOR, is_hf_source, read_rows


@dataclasses.dataclass(frozen=True)
class MathProblem:
  """One problem of a data file: `answer` is the reference final answer as the file writes it (GSM8K's text after
  '####', thousands separators kept), `solution` the worked text when the file has one (None otherwise), `source`
  the format it was read from, `meta` the record's other fields (level, subject, unique_id, ...)."""

  id: str
  question: str
  answer: str
  solution: str | None
  source: str
  # A dict cannot be hashed; the id already identifies the problem.
  meta: dict = dataclasses.field(default_factory=dict, hash=False)

  def to_json(self) -> dict:
    """The record as a JSON object."""
    return dataclasses.asdict(self)

  def to_problem(self) -> Problem:
    """The problem of the math task ('math', `tasks.math_task`) every job takes: the solution, source and the
    record's other fields in `data`."""
    return Problem(
      id=self.id,
      domain=MathTask.name,
      question=self.question,
      answer=self.answer,
      data={"solution": self.solution, "source": self.source, "meta": dict(self.meta)},
    )


@dataclasses.dataclass(frozen=True)
class LabelledSolution:
  """A written solution of `question` split into `steps`, each with a label (1.0 incorrect, 0.0 correct, None
  unknown; docs/method.md §A2), as ProcessBench and PRM800K ship them. `problem_id` groups the solutions of one
  problem (splits keep them together); `final_answer_correct` is None when the file does not say."""

  id: str
  problem_id: str
  question: str
  steps: tuple[str, ...]
  step_labels: tuple[float | None, ...]
  final_answer_correct: bool | None
  source: str
  meta: dict = dataclasses.field(default_factory=dict, hash=False)

  def __post_init__(self):
    if len(self.steps) != len(self.step_labels):
      raise DataFormatError(
        f"solution {self.id!r}: {len(self.steps)} steps but {len(self.step_labels)} step labels (one per step)"
      )

  @property
  def first_error(self) -> int | None:
    """The index of the first step labelled incorrect (ProcessBench's label), None when no step is."""
    return first_error(self.labels())

  def labels(self) -> list[float]:
    """The step labels as the loss and the metrics read them: unknown as NaN."""
    return labels_from_json(self.step_labels)

  def to_json(self) -> dict:
    """The record as a JSON object (unknown labels as null), with `first_error` written out."""
    out = dataclasses.asdict(self)
    out.update(steps=list(self.steps), step_labels=list(self.step_labels), first_error=self.first_error)
    return out


@dataclasses.dataclass(frozen=True)
class Dataset:
  """What `read_dataset` read from one file: its problems (with reference answers) and, for the step-labelled
  formats, its labelled solutions. ProcessBench gives no reference answers, so its `problems` are empty."""

  path: str
  format: str
  problems: tuple[MathProblem, ...]
  solutions: tuple[LabelledSolution, ...] = ()


# ---- where a record is, and its field checks ----

_NUMBER = "a string or a number"
KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
  "text": ("a non-empty string", lambda v: isinstance(v, str) and bool(v.strip())),
  "string": ("a string", lambda v: isinstance(v, str)),
  "answer": (
    f"{_NUMBER} (not empty)",
    lambda v: (
      (isinstance(v, str) and bool(v.strip()))
      or (isinstance(v, int) and not isinstance(v, bool))
      or (isinstance(v, float) and math.isfinite(v))
    ),
  ),
  "id": (
    "a non-empty string or an integer",
    lambda v: (isinstance(v, str) and bool(v.strip())) or (isinstance(v, int) and not isinstance(v, bool)),
  ),
  "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
  "bool": ("true or false", lambda v: isinstance(v, bool)),
  "list": ("a list", lambda v: isinstance(v, list)),
  "object": ("a JSON object", lambda v: isinstance(v, dict)),
}
_MISSING = object()


@dataclasses.dataclass
class RecordAt:
  """Where one record of a file is: `where` is 'path:line' (JSONL) or 'path[index]' (a JSON array file), `key` the
  line or index, `id` the record's id once it is known, so every error names all three with the field."""

  where: str
  key: int
  id: str | None = None

  def error(self, field: str, problem: str) -> DataFormatError:
    """The error for a defect of `field` ('label.steps[2].rating' style paths for nested fields)."""
    record = f" record {self.id!r}:" if self.id is not None else ""
    return DataFormatError(f"{self.where}:{record} field {field!r} {problem}")

  def check(self, value: Any, kind: str, field: str) -> Any:
    """`value` when it is of `kind` (a key of KINDS); the error naming `field`, what was expected and what was found
    otherwise. Answers and ids given as numbers come back as their text."""
    expected, ok = KINDS[kind]
    if not ok(value):
      raise self.error(field, f"must be {expected}, got {shown(value)}")
    if kind in ("answer", "id") and not isinstance(value, str):
      return str(value)
    return value

  def take(self, obj: dict, name: str, kind: str, *, field: str | None = None, optional: bool = False) -> Any:
    """`obj[name]` checked as `kind`; a missing (or, when `optional`, a null) field is None when `optional` and an
    error otherwise. `field` is the name in messages (default `name`)."""
    field = field or name
    value = obj.get(name, _MISSING)
    if value is _MISSING or (optional and value is None):
      if optional:
        return None
      raise self.error(field, "is missing")
    return self.check(value, kind, field)

  def object(self, record: Any) -> dict:
    """The record itself, which must be a JSON object."""
    if not isinstance(record, dict):
      raise DataFormatError(f"{self.where}: expected a JSON object, got {shown(record)}")
    return record


def read_records(path: str | os.PathLike, what: str) -> list[tuple[RecordAt, Any]]:
  """Every record of a JSONL file, or of a JSON array file (the first non-space character is '['), with where it
  is; DataFormatError naming the file when it holds no record, and (from `reprobe_jax.io.readers`) on a missing
  file, non-UTF-8 bytes or invalid JSON, naming the line. A Hugging Face dataset (`tasks.hf_source`: a folder
  `save_to_disk` wrote, a hub id in the local cache, an optional `::split`) gives its rows, at `path[row i]`."""
  path = os.fspath(path)
  if is_hf_source(path):
    out = [(RecordAt(f"{path}[row {i}]", i), r) for i, r in read_rows(path, what)]
  elif _first_character(path, what) == "[":
    out = [(RecordAt(f"{path}[{i}]", i), r) for i, r in enumerate(read_json(path, what, kind=list))]
  else:
    out = [(RecordAt(f"{path}:{n}", n), r) for n, r in read_jsonl(path, what)]
  if not out:
    raise DataFormatError(f"{path}: {what} holds no records (an empty file)")
  return out


def _first_character(path: str, what: str) -> str:
  """The first non-whitespace character of a file ('' when there is none), read in small chunks, so a large JSONL
  file is not read twice to tell it from a JSON array."""
  try:
    with open(regular_file(path, what), "rb") as f:
      while chunk := f.read(4096):
        if stripped := chunk.lstrip():
          return chr(stripped[0])
  except OSError as e:
    raise DataFormatError(f"{path}: cannot read {what} ({e.strerror or e})") from None
  return ""


class IdBook:
  """The ids of one file seen so far: a second record with the same id is refused naming both places."""

  def __init__(self):
    self._seen: dict[str, str] = {}

  def add(self, at: RecordAt, id: str, field: str = "id") -> None:
    """Records the id of the record at `at`; the error naming both records when it was seen before."""
    if id in self._seen:
      raise at.error(field, f"repeats the id {id!r} of {self._seen[id]} (ids must be unique in a file)")
    self._seen[id] = at.where


def stem(path: str) -> str:
  """The file name without its extension: the prefix of the ids of records that have none (a Hugging Face
  dataset's folder or name, then its split: `gsm8k-test`)."""
  base, *split = path.split(SEPARATOR)
  return "-".join([os.path.splitext(os.path.basename(base.rstrip("/")))[0], *split])
