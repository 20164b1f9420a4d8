"""Readers of public math data files (docs/tasks.md, "Data files"): GSM8K, MATH / MATH-500, ProcessBench, PRM800K
and a plain JSONL of questions and answers, each record checked, any defect a DataFormatError naming `path:line`
(`path[index]` in a JSON array file), the record's id when it has one, and the field. Nothing is downloaded: the
user gets the files (docs/tasks.md says where) and names them.

  from reprobe_jax.tasks.datasets import read_dataset
  data = read_dataset("gsm8k/test.jsonl", "gsm8k")     # Dataset(problems=(MathProblem, ...), solutions=())

`read_dataset(path, format)` picks the reader from `FORMATS` (a `reprobe_jax.registry.Registry`); each reader is
also a function of its own. Every format is read from JSONL or from a JSON array file (told apart by the first
non-space character). Records with no id of their own get `<file stem>-<line>` (`<file stem>-<index>`).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Callable

from reprobe_jax.io.readers import shown
from reprobe_jax.registry import Registry
from reprobe_jax.tasks.math_normalize import last_boxed
from reprobe_jax.tasks.dataset_records import (
  Dataset,
  IdBook,
  LabelledSolution,
  MathProblem,
  RecordAt,
  read_records,
  stem,
)

FORMATS: Registry[Callable[[str], Dataset]] = Registry("dataset format")


def read_dataset(path: str | os.PathLike, format: str) -> Dataset:
  """The problems (and, for processbench and prm800k, the labelled solutions) of a data file in `format`, one of
  gsm8k | math | jsonl | processbench | prm800k; ConfigError listing the known formats for any other."""
  reader = FORMATS.get(format)
  return reader(os.fspath(path))


def _problems(path: str, format: str, read: Callable[[str], list[MathProblem]]) -> Dataset:
  return Dataset(path=path, format=format, problems=tuple(read(path)))


# ---- problems with reference answers ----


def read_gsm8k(path: str | os.PathLike) -> list[MathProblem]:
  """GSM8K (`{"question", "answer"}` per line, openai/grade-school-math or the Hugging Face openai/gsm8k export):
  `answer` is the text after the last '####' as written (thousands separators kept, '1,000'), `solution` the worked
  text before it (GSM8K's calculator annotations `<<48/2=24>>` kept). A record without '####', or with nothing
  after it, is refused naming the line and the field 'answer'. An optional `id` is used when present."""

  def answer(at: RecordAt, obj: dict) -> tuple[str, str]:
    worked, mark, final = at.take(obj, "answer", "text").rpartition("####")
    if not mark:
      raise at.error("answer", "has no '#### <final answer>' (GSM8K writes the final value after '#### ')")
    if not final.strip():
      raise at.error("answer", "has nothing after its '####'")
    return final, worked.strip()

  return _read_problems(path, "gsm8k", ("id", "question", "answer"), answer)


def read_math(path: str | os.PathLike) -> list[MathProblem]:
  """MATH / MATH-500 (`{"problem", "solution", "answer"?, "level"?, "type" or "subject"?, "unique_id"?}`; the
  Hugging Face HuggingFaceH4/MATH-500 test.jsonl, or Hendrycks' MATH problems gathered into one JSONL): the
  answer is the `answer` field when present, else the content of the solution's last `\\boxed{...}` (or
  `\\fbox{...}`), nested braces included; neither is a DataFormatError naming the line and 'solution'. The id is
  `unique_id` when present; level, type / subject and any other field go to `meta`."""

  def answer(at: RecordAt, obj: dict) -> tuple[str, str]:
    solution = at.take(obj, "solution", "string")
    level = obj.get("level")
    if level is not None and (isinstance(level, bool) or not isinstance(level, (str, int))):
      raise at.error("level", f"must be a string ('Level 3') or an integer, got {shown(level)}")
    for name in ("type", "subject"):
      at.take(obj, name, "string", optional=True)
    given = at.take(obj, "answer", "answer", optional=True)
    if given is not None:
      return given, solution
    boxed = last_boxed(solution)
    if boxed is None:
      raise at.error("solution", "has no \\boxed{...} final answer and the record no 'answer' field")
    if not boxed.strip():
      raise at.error("solution", "ends with an empty \\boxed{} and the record has no 'answer' field")
    return boxed, solution

  return _read_problems(path, "math", ("unique_id", "problem", "solution", "answer"), answer)


def read_plain(path: str | os.PathLike) -> list[MathProblem]:
  """A plain JSONL of problems (`{"question", "answer", "id"?}`; any other fields go to `meta`): answers are text
  or numbers (kept as text); ids default to `<file stem>-<line>`; a repeated id is refused naming both lines."""
  return _read_problems(
    path, "jsonl", ("id", "question", "answer"), lambda at, obj: (at.take(obj, "answer", "answer"), None)
  )


_FILES = {"gsm8k": "GSM8K file", "math": "MATH file", "jsonl": "JSONL file of problems"}


def _read_problems(
  path: str | os.PathLike,
  source: str,
  fields: tuple[str, ...],
  answer: Callable[[RecordAt, dict], tuple[str, str | None]],
) -> list[MathProblem]:
  """The loop the problem formats share. `fields` are the id field, the question field and the fields `answer`
  reads (the record's other fields go to `meta`); `answer(at, obj)` gives the reference answer and the worked
  solution (or None)."""
  path = os.fspath(path)
  out, ids = [], IdBook()
  for at, record in read_records(path, _FILES[source]):
    obj = at.object(record)
    rid = _set_id(at, obj, fields[0], path, ids)
    question = at.take(obj, fields[1], "text")
    final, solution = answer(at, obj)
    out.append(MathProblem(rid, question, final.strip(), solution, source, _rest(obj, fields)))
  return out


# ---- step-labelled solutions ----


def read_processbench(path: str | os.PathLike) -> list[LabelledSolution]:
  """ProcessBench (`{"id", "generator"?, "problem", "steps": [str, ...], "final_answer_correct"?, "label"}`, the
  Hugging Face Qwen/ProcessBench splits exported to JSONL or a JSON array): `label` is the index of the first wrong
  step, -1 when every step is right. The steps before it are labelled correct (0.0), it incorrect (1.0), the steps
  after it unknown (None): ProcessBench does not label them. A label that is not an integer, below -1 or past the
  steps is refused naming the line, the id and 'label'."""
  path = os.fspath(path)
  out, ids = [], IdBook()
  for at, record in read_records(path, "ProcessBench file"):
    obj = at.object(record)
    at.id = at.take(obj, "id", "id")
    ids.add(at, at.id)
    question = at.take(obj, "problem", "text")
    steps = _texts(at, at.take(obj, "steps", "list"), "steps")
    label = at.take(obj, "label", "int")
    if not -1 <= label < len(steps):
      raise at.error("label", f"must be -1 (no wrong step) or a step index in 0..{len(steps) - 1}, got {label}")
    final = at.take(obj, "final_answer_correct", "bool", optional=True)
    at.take(obj, "generator", "string", optional=True)
    labels = [0.0] * len(steps) if label == -1 else [0.0] * label + [1.0] + [None] * (len(steps) - label - 1)
    meta = _rest(obj, ("id", "problem", "steps", "label", "final_answer_correct"))
    pid = problem_id(question, "processbench")
    out.append(LabelledSolution(at.id, pid, question, steps, tuple(labels), final, "processbench", meta))
  return out


def read_prm800k(path: str | os.PathLike) -> tuple[list[MathProblem], list[LabelledSolution]]:
  """PRM800K (openai/prm800k, data/phase1_*.jsonl and phase2_*.jsonl; the schema of its README): one labelled
  solution per line, following the chosen step at each step of `label.steps`: `completions[chosen_completion]`,
  else the labeller's own `human_completion` (a correct step), else the only completion (where phase 2 labelling
  stopped). A step with several completions and none chosen ends the solution; a step after it is refused.

  Labels, as in "Let's Verify Step by Step" (Lightman et al., 2023): rating -1 is incorrect (1.0), 0 (neutral)
  and +1 correct (0.0), a null rating unknown (None); the raw ratings are kept in `meta["ratings"]`, with the
  line's labeler, timestamp, generation, finish_reason and phase 2's pre_generated_answer.
  `final_answer_correct` is True when the labelling finished at a correct solution (`finish_reason` 'solution')
  and None otherwise (an error found says nothing of the final answer). Each distinct problem is also a
  MathProblem (reference answer `question.ground_truth_answer`). A rating outside -1..1 or a `chosen_completion`
  past the completions is refused naming the line and the step. A line whose labelling ended before its first
  step gives no solution (its problem is kept)."""
  path = os.fspath(path)
  problems: dict[str, tuple[MathProblem, RecordAt]] = {}
  solutions = []
  for at, record in read_records(path, "PRM800K file"):
    obj = at.object(record)
    q = at.take(obj, "question", "object")
    question = at.take(q, "problem", "text", field="question.problem")
    answer = at.take(q, "ground_truth_answer", "answer", field="question.ground_truth_answer").strip()
    worked = at.take(q, "ground_truth_solution", "string", field="question.ground_truth_solution", optional=True)
    pid = problem_id(question, "prm800k")
    if pid in problems and problems[pid][0].answer != answer:
      first = problems[pid]
      raise at.error(
        "question.ground_truth_answer",
        f"is {answer!r}, but {first[1].where} gives the same problem {first[0].answer!r}",
      )
    problems.setdefault(pid, (MathProblem(pid, question, answer, worked, "prm800k", {}), at))
    label = at.take(obj, "label", "object")
    finish = at.take(label, "finish_reason", "string", field="label.finish_reason", optional=True)
    steps, ratings = _follow(at, at.take(label, "steps", "list", field="label.steps"))
    if not steps:
      continue
    labels = tuple(None if r is None else float(r == -1) for r in ratings)
    meta = {k: v for k, v in obj.items() if k not in ("question", "label")}
    meta.update({k: v for k, v in q.items() if k in ("pre_generated_answer", "pre_generated_verifier_score")})
    meta.update(finish_reason=finish, ratings=list(ratings))
    final = True if finish == "solution" else None
    solutions.append(
      LabelledSolution(f"{stem(path)}-{at.key}", pid, question, tuple(steps), labels, final, "prm800k", meta)
    )
  return [p for p, _ in problems.values()], solutions


def _follow(at: RecordAt, steps: list) -> tuple[list[str], list[int | None]]:
  """The texts and ratings of the chosen path through PRM800K's `label.steps`, every completion checked."""
  texts, ratings, ended = [], [], None
  for i, step in enumerate(steps):
    field = f"label.steps[{i}]"
    step = at.check(step, "object", field)
    completions = at.take(step, "completions", "list", field=f"{field}.completions")
    options = []
    for j, completion in enumerate(completions):
      where = f"{field}.completions[{j}]"
      completion = at.check(completion, "object", where)
      text = at.take(completion, "text", "string", field=f"{where}.text")
      rating = at.take(completion, "rating", "int", field=f"{where}.rating", optional=True)
      if rating is not None and rating not in (-1, 0, 1):
        raise at.error(f"{where}.rating", f"must be -1, 0 or 1 (or null), got {rating}")
      options.append((text, rating))
    if ended is not None:
      raise at.error(field, f"follows {ended}, where the labelled path ended (several completions, none chosen)")
    chosen = at.take(step, "chosen_completion", "int", field=f"{field}.chosen_completion", optional=True)
    human = _human_text(at, step.get("human_completion"), f"{field}.human_completion")
    if chosen is not None:
      if not 0 <= chosen < len(options):
        raise at.error(f"{field}.chosen_completion", f"must index the step's {len(options)} completions, got {chosen}")
      option = options[chosen]
    elif human is not None:
      option = (human, 1)
    elif len(options) == 1:
      option = options[0]
    else:
      ended = field
      continue
    texts.append(option[0])
    ratings.append(option[1])
  return texts, ratings


def _human_text(at: RecordAt, human: Any, field: str) -> str | None:
  """The text of a step's `human_completion` (an object with a `text`, or the text itself), checked whether or not
  the path takes it; None when there is none."""
  if isinstance(human, dict):
    return at.take(human, "text", "string", field=f"{field}.text")
  return None if human is None else at.check(human, "string", field)


def problem_id(question: str, source: str) -> str:
  """A stable id for a problem that has none (PRM800K, ProcessBench): the source and 12 hex digits of the sha256 of
  its text, so the solutions of one problem share it in every run and process."""
  return f"{source}-{hashlib.sha256(question.encode()).hexdigest()[:12]}"


def _texts(at: RecordAt, values: list, field: str) -> tuple[str, ...]:
  if not values:
    raise at.error(field, "is empty (a solution needs at least one step)")
  return tuple(at.check(v, "text", f"{field}[{i}]") for i, v in enumerate(values))


def _set_id(at: RecordAt, obj: dict, name: str, path: str, ids: IdBook) -> str:
  """The record's id: field `name` when present (then named in every later error), else `<file stem>-<line>`;
  refused when another record of the file has it."""
  at.id = at.take(obj, name, "id", optional=True)
  own = at.id is not None
  rid = at.id if own else f"{stem(path)}-{at.key}"
  ids.add(at, rid, name if own else f"{name} (none given, so {rid!r})")
  return rid


def _rest(obj: dict, read: tuple[str, ...]) -> dict[str, Any]:
  return {k: v for k, v in obj.items() if k not in read}


FORMATS.register("gsm8k", lambda path: _problems(path, "gsm8k", read_gsm8k))
FORMATS.register("math", lambda path: _problems(path, "math", read_math))
FORMATS.register("jsonl", lambda path: _problems(path, "jsonl", read_plain))
FORMATS.register(
  "processbench",
  lambda path: Dataset(path=path, format="processbench", problems=(), solutions=tuple(read_processbench(path))),
)
FORMATS.register("prm800k", lambda path: Dataset(path, "prm800k", *map(tuple, read_prm800k(path))))
