"""Rule-based labels (docs/method.md §A2(a)) for any task, mapped onto aligned steps (docs/method.md §A1): exact step
labels where the problem's task has an exact checker (`Task.exact_steps`: the synthetic families), NaN step labels
where it has none (the math task: its step labels come from an LLM judge or a file), and the outcome label (the final
answer checked by `Task.check_answer` against the true answer) for every task.

Line mode: the aligned steps are the non-empty lines, the final '<Answer>: X' line included. The lines before the
answer line are the steps `tasks.response.parse_line` reads (a '- Step k:' prefix is removed where present),
labelled by the task's `judge_steps` over the whole sequence (a family's `check_steps`), so a step that builds
correctly on a wrong earlier value is correct. The answer line is 0.0 when `check_answer` accepts X, else 1.0, for
every task. Lines the checker cannot parse, and lines after the answer line, are NaN. For a family these are
exactly the labels of `formats.check_response`, plus the answer line. A response without an answer line (a math
model that writes 'The answer is 18.') gets its answer from `Task.parse_response`; only the outcome carries it.

Thinking mode: the aligned steps are '.\\n\\n' paragraphs. The response's paragraphs (`Task.parse_response`) are
labelled by the task's `judge_steps` (a family's `formats.check_thinking`; NaN without an exact checker), and each
aligned step takes the label of the paragraph with the same text, matched in order; an aligned step that matches no
paragraph (a token that swallowed a boundary) is NaN.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from reprobe_jax.annotate.records import Record, as_trajectory, labelled, record_id
from reprobe_jax.errors import DataFormatError
from reprobe_jax.tasks.base import Problem, get_task
from reprobe_jax.tasks.response import parse_line
from reprobe_jax.trajectories import Trajectory

ANNOTATOR = "rule"


def annotate_rule(records: Sequence[Record], problems: Mapping[str, Problem]) -> list[Record]:
  """New records with rule-based `labels`, `first_error`, `annotator`='rule', `answer` and `correct` (docs/method.md
  §A2(a)); step labels NaN for a task without an exact checker.

  `problems` maps problem id -> Problem; each record's `problem_id` must be among them (DataFormatError naming the
  record otherwise). `answer` is the final answer parsed from the response by its task (None if there is none) and
  `correct` whether it equals the true answer (`Task.check_answer`).
  """
  out = []
  for index, record in enumerate(records):
    traj = as_trajectory(record, index)
    rid = record_id(record, index)
    problem = _problem(traj, rid, problems)
    task = get_task(problem.domain)
    mode = traj.mode
    texts = [s.text for s in traj.steps]
    if mode == "line":
      labels, answer = line_labels(problem, texts)
      if answer is None and traj.response is not None:
        answer = task.parse_response(traj.response, "line")[1]
    elif mode == "thinking":
      response = traj.response
      if response is None:
        response = "".join(t + "\n\n" for t in texts)
      paragraphs, answer = task.parse_response(response, "thinking")
      labels = match_labels(texts, paragraphs, task.judge_steps(problem, paragraphs, "thinking"))
    else:
      raise DataFormatError(f"trajectory {rid}: field 'mode' must be 'line' or 'thinking', found {mode!r}")
    correct = task.check_answer(problem, answer)
    out.append(labelled(record, labels, ANNOTATOR, answer=answer, correct=bool(correct)))
  return out


def _problem(traj: Trajectory, rid: str, problems: Mapping[str, Problem]) -> Problem:
  pid = traj.problem_id
  if not pid:
    raise DataFormatError(f"trajectory {rid}: no 'problem_id', so its problem cannot be found")
  try:
    return problems[pid]
  except KeyError:
    raise DataFormatError(
      f"trajectory {rid}: problem {pid!r} is not among the {len(problems)} problems given"
    ) from None


def line_labels(problem: Problem, texts: Sequence[str]) -> tuple[list[float], str | None]:
  """(labels per aligned line, the answer of the first '<Answer>' line or None) for line mode; the steps' labels
  are NaN for a task without an exact checker, the answer line's label is the outcome's."""
  task = get_task(problem.domain)
  labels = [math.nan] * len(texts)
  bodies, where = [], []
  answer = None
  for i, text in enumerate(texts):
    body, found = parse_line(text)
    if found is not None and not body:
      labels[i] = 0.0 if task.check_answer(problem, found) else 1.0
      answer = found
      break  # parse_line ignores what follows the answer line: those lines stay NaN
    if len(body) == 1:
      bodies.append(body[0])
      where.append(i)
  for i, label in zip(where, task.judge_steps(problem, bodies, "line")):
    labels[i] = label
  return labels, answer


def _norm(text: str) -> str:
  return " ".join(text.split())


def match_labels(texts: Sequence[str], paragraphs: Sequence[str], labels: Sequence[float]) -> list[float]:
  """Labels of `paragraphs` carried to the aligned step `texts`: in order, by equal text (whitespace-normalised);
  a step with no matching paragraph gets NaN, and later steps are still matched."""
  keys = [_norm(p) for p in paragraphs]
  out, p = [], 0
  for text in texts:
    key = _norm(text)
    q = next((q for q in range(p, len(keys)) if keys[q] == key), None)
    if q is None:
      out.append(math.nan)
    else:
      out.append(labels[q])
      p = q + 1
  return out
