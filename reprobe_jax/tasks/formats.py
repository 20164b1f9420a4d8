"""Responses checked by their task: `check_response` and `user_prompt` for any task, and the synthetic families'
thinking-mode checker (docs/method.md §A2(a), thinking variant). The text of the two formats is `tasks.response`.

In thinking mode every paragraph ends with ".\\n\\n" (the SPAE step boundary). A paragraph is a work step
("Step 2: 12 * 3 = 36."), a reflection that re-checks an earlier step ("Wait, let me check: 12 * 3 = 36."), or
other text (a conclusion "So the answer is 36.", filler).
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple, Sequence

from reprobe_jax.errors import ConfigError
from reprobe_jax.steps.modes import RESPONSE_FORMATS as MODES
from reprobe_jax.tasks.base import FAMILIES, Problem, State, TaskFamily, first_error, get_family, get_task

REFLECT_PREFIXES = ("Wait, let me check: ", "Let me double-check: ", "Hmm, let me verify: ")
_REFLECT = re.compile(
  r"^\s*(?:wait|hmm|actually|let me)\b[^:]*\b(?:check|verify)\b[^:]*:\s*(.*)$", re.IGNORECASE | re.DOTALL
)  # 'check' also covers re-check and double-check
_WORK_PREFIX = re.compile(r"^\s*(?:(?:first|next|then|now)\s*,|step\s*\d+\s*[:.])\s*", re.IGNORECASE)
_CLAIM = re.compile(r"^\s*so,?\s+the\s+(?:final\s+)?(?:answer|result)\s+is\s*:?\s*(.+?)\s*\.?\s*$", re.IGNORECASE)


def _family(problem: Problem) -> TaskFamily:
  """The problem's synthetic family; ConfigError naming the problem and its task when the task is none (its
  paragraphs have no step parser and no state to replay: the math task)."""
  if problem.domain not in FAMILIES:
    raise ConfigError(
      f"problem {problem.id!r}: task {problem.domain!r} is not a synthetic family, so its thinking paragraphs cannot "
      f"be parsed as steps and replayed (classify_paragraph, check_thinking, answers_so_far and thinking_progress "
      f"need one of {', '.join(FAMILIES.names())}); check_response labels any task's answer"
    )
  return get_family(problem.domain)


def _check_mode(mode: str) -> None:
  if mode not in MODES:
    raise ConfigError(f"answer mode must be one of {MODES}, found {mode!r}")


# --- thinking mode -----------------------------------------------------------------------------------------------


def work_paragraph(body: str, number: int) -> str:
  """The `number`-th thinking-mode work step of a chain: 'Step 2: body.'.

  Numbered like line-mode steps (and like the operations of an arithmetic question), so a model can find what step
  k works on by its number; the parser also reads the 'First, ...' / 'Next, ...' of real reasoning models.
  """
  return f"Step {number}: {body}."


def reflect_paragraph(body: str, variant: int = 0) -> str:
  """A thinking-mode re-check of an earlier step: 'Wait, let me check: body.' (or another phrasing)."""
  return f"{REFLECT_PREFIXES[variant % len(REFLECT_PREFIXES)]}{body}."


def conclude_paragraph(answer: str) -> str:
  """A thinking-mode conclusion: 'So the answer is X.'."""
  return f"So the answer is {answer}."


def _strip_period(text: str) -> str:
  text = text.strip()
  return text[:-1].rstrip() if text.endswith(".") else text


def split_paragraph(problem: Problem, paragraph: str) -> tuple[str, str | None, Any]:
  """(kind, step body or None, parsed step or None) of one thinking paragraph; kind as `classify_paragraph`."""
  family = _family(problem)
  m = _REFLECT.match(paragraph or "")
  if m:
    body = _strip_period(m.group(1))
    return "reflect", body, family.parse_step(body)
  body = _strip_period(_WORK_PREFIX.sub("", paragraph or "", count=1))
  parsed = family.parse_step(body)
  return ("step", body, parsed) if parsed is not None else ("other", None, None)


def is_recheck(paragraph: str) -> bool:
  """Whether a thinking paragraph is phrased as a re-check of earlier work ('Wait, let me check: ...'), read from its
  words alone, so for any task (`classify_paragraph` also parses what it re-checks, for a synthetic family)."""
  return _REFLECT.match(paragraph or "") is not None


def classify_paragraph(problem: Problem, paragraph: str) -> str:
  """'reflect' for a re-check ('Wait, let me check: ...'), 'step' for a parseable work step, else 'other'."""
  return split_paragraph(problem, paragraph)[0]


def step_texts_for_check(problem: Problem, paragraphs: Sequence[str]) -> list[tuple[str, str | None]]:
  """How thinking paragraphs map to checkable steps: (kind, step body or None) per paragraph."""
  return [split_paragraph(problem, p)[:2] for p in paragraphs]


def match_snapshot(
  family: TaskFamily, problem: Problem, snapshots: Sequence[tuple[State, State]], parsed: Any
) -> int | None:
  """Which earlier work step a re-check refers to: best `match_score`, the latest on ties; None if none fits."""
  best, best_score = None, 0
  for j, (before, _) in enumerate(snapshots):
    score = family.match_score(problem, before, parsed)
    if score >= best_score and score > 0:
      best, best_score = j, score
  return best


def answer_claim(paragraph: str) -> str | None:
  """X of a conclusion paragraph 'So the answer is X.', else None."""
  m = _CLAIM.match(paragraph or "")
  return None if m is None else m.group(1)


def _replay_thinking(problem: Problem, paragraphs: Sequence[str]):
  """Yields (kind, label, state after the paragraph) for each paragraph; the logic behind `check_thinking`."""
  family = _family(problem)
  items = [split_paragraph(problem, p) for p in paragraphs]
  state = family.initial_state(problem)
  snapshots: list[tuple[State, State]] = []  # (before, after) of each work step of the current chain
  for i, (kind, _, parsed) in enumerate(items):
    if kind == "step":
      following = next((q for k, _, q in items[i + 1 :] if k == "step"), None)
      ok, new = family.judge_step(problem, state, parsed, following)
      snapshots.append((state, new))
      state = new
      yield kind, 0.0 if ok else 1.0, state
    elif kind == "reflect":
      if parsed is None:
        yield kind, math.nan, state
        continue
      j = match_snapshot(family, problem, snapshots, parsed)
      if j is None:
        yield kind, 1.0, state
        continue
      before, after = snapshots[j]
      ok, new = family.judge_step(problem, before, parsed, None)
      if new != after:
        snapshots = snapshots[:j] + [(before, new)]
        state = new
      yield kind, 0.0 if ok else 1.0, state
    else:
      claim = answer_claim(paragraphs[i])
      if claim is None:
        yield kind, math.nan, state
      else:
        implied = family.normalize_answer(family.state_answer(problem, state))
        consistent = family.is_done(problem, state) and family.normalize_answer(claim) == implied
        yield kind, 0.0 if consistent else 1.0, state


def check_thinking(problem: Problem, paragraphs: Sequence[str]) -> list[float]:
  """Per-paragraph labels for thinking mode (docs/method.md §A2, thinking variant): 1.0 incorrect, 0.0 correct, NaN
  unknown.

  - Work steps are judged like line-mode steps, from the state the paragraphs so far left.
  - A reflection is judged as if it were the earlier work step it refers to (`match_snapshot`), from that step's
    starting state: a right re-check is correct (redundant steps count as correct), a wrong one incorrect, one that
    refers to no earlier step incorrect. When the re-check's result differs from what was written there, the
    solution has changed its mind: the chain continues from the re-check, and later work steps are judged on it.
  - 'So the answer is X.' is correct iff the chain is complete and X is the answer it implies; other text is NaN.
  """
  return [label for _, label, _ in _replay_thinking(problem, paragraphs)]


class Progress(NamedTuple):
  """Where a thinking trajectory first completes its chain, and what happened after (docs/method.md §B3).

  established: index of the first paragraph after which the chain is complete (None if it never is);
  established_answer: the answer the chain implied there; right_established: that answer is the true one;
  rechecks_after: number of re-check paragraphs after `established`.
  """

  established: int | None
  established_answer: str | None
  right_established: bool
  rechecks_after: int


def answers_so_far(problem: Problem, paragraphs: Sequence[str]) -> list[tuple[str, bool]]:
  """(the answer the paragraphs up to and including i imply, whether the chain is complete there) for each i: what
  a solver interrupted after paragraph i believes (the running value while the chain is incomplete)."""
  family = _family(problem)
  return [
    (family.state_answer(problem, state), family.is_done(problem, state))
    for _, _, state in _replay_thinking(problem, paragraphs)
  ]


def thinking_progress(problem: Problem, paragraphs: Sequence[str]) -> Progress:
  """Replays a thinking trajectory and reports when its answer was first established (for over-checking and R2W)."""
  family = _family(problem)
  established, answer, rechecks = None, None, 0
  for i, (kind, _, state) in enumerate(_replay_thinking(problem, paragraphs)):
    if established is None and family.is_done(problem, state):
      established, answer = i, family.state_answer(problem, state)
    elif established is not None and kind == "reflect":
      rechecks += 1
  right = answer is not None and family.check_answer(problem, answer)
  return Progress(established, answer, right, rechecks)


# --- both modes --------------------------------------------------------------------------------------------------


class Checked(NamedTuple):
  """A response split into steps and labelled: steps (line bodies or paragraphs), labels, answer, correct."""

  steps: list[str]
  labels: list[float]
  answer: str | None
  correct: bool
  first_error: int | None


def check_response(problem: Problem, text: str, mode: str) -> Checked:
  """Parses a model response in `mode` with the problem's task and labels it: its steps by the task's exact checker
  (docs/method.md §A2(a); NaN for a task without one) and its answer against the true answer."""
  _check_mode(mode)
  task = get_task(problem.domain)
  steps, answer = task.parse_response(text, mode)
  labels = task.judge_steps(problem, steps, mode)
  return Checked(steps, labels, answer, task.check_answer(problem, answer), first_error(labels))


def user_prompt(problem: Problem, mode: str, example: bool = True, first_step: bool = False) -> str:
  """The user message of `problem` in response format `mode`, as its task writes it (`Task.user_prompt`).

  example: the step hint may give a made-up step ("like 'the boss of 4 is 9'"). Prompts after worked examples leave
  it out (`trajectories.prompt_text`): the examples show the format, and SmolLM2-135M copied the made-up step's
  people into its own qa steps (docs/tasks.md, "SmolLM2").
  first_step: the question with its first step's starting point spelled out (`TaskFamily.first_step_question`;
  qa's start person as the first look-up's subject, planning's start room as the first move's origin).
  """
  _check_mode(mode)
  return get_task(problem.domain).user_prompt(problem, mode, example=example, first_step=first_step)
