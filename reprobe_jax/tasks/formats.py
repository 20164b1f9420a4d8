"""Answer formats: line mode (docs/method.md §A1) and thinking mode (docs/method.md §B1), their prompts, parsers and
checkers.

Line mode:      "- Step 1: 12 + 5 = 17\\n- Step 2: ...\\n<Answer>: 36"
Thinking mode:  "<think>\\nStep 1: 12 + 5 = 17.\\n\\nStep 2: ...\\n\\n</think>\\n\\n**Final Answer**\\n\\\\boxed{36}"

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
from reprobe_jax.tasks.base import Problem, State, TaskFamily, first_error, get_family

REFLECT_PREFIXES = ("Wait, let me check: ", "Let me double-check: ", "Hmm, let me verify: ")
_LINE_STEP = re.compile(r"^\s*[-*]?\s*step\s*(\d+)\s*[:.]\s*(.*?)\s*$", re.IGNORECASE)
_LINE_ANSWER = re.compile(r"^\s*<answer>\s*:?\s*(.*?)\s*$", re.IGNORECASE)
_HEADER = re.compile(r"^\s*(reasoning steps|solution|steps)\s*:?\s*$", re.IGNORECASE)
_REFLECT = re.compile(
  r"^\s*(?:wait|hmm|actually|let me)\b[^:]*\b(?:check|verify)\b[^:]*:\s*(.*)$", re.IGNORECASE | re.DOTALL
)  # 'check' also covers re-check and double-check
_WORK_PREFIX = re.compile(r"^\s*(?:(?:first|next|then|now)\s*,|step\s*\d+\s*[:.])\s*", re.IGNORECASE)
_CLAIM = re.compile(r"^\s*so,?\s+the\s+(?:final\s+)?(?:answer|result)\s+is\s*:?\s*(.+?)\s*\.?\s*$", re.IGNORECASE)
_BOUNDARY = ".\n\n"


def _family(problem: Problem) -> TaskFamily:
  return get_family(problem.domain)


def _check_mode(mode: str) -> None:
  if mode not in MODES:
    raise ConfigError(f"answer mode must be one of {MODES}, found {mode!r}")


# --- line mode ---------------------------------------------------------------------------------------------------


def render_line(steps: Sequence[str], answer: str | None) -> str:
  """'- Step k: body' per step, then '<Answer>: answer' (docs/method.md §A1 line mode)."""
  lines = [f"- Step {k}: {body}" for k, body in enumerate(steps, start=1)]
  if answer is not None:
    lines.append(f"<Answer>: {answer}")
  return "\n".join(lines)


def parse_line(text: str) -> tuple[list[str], str | None]:
  """(step bodies, answer or None) from line-mode text; tolerant of model output.

  Steps are the non-empty lines before the answer line (docs/method.md §A1); header lines are skipped; a 'Step k:'
  prefix is removed where present, and other lines are kept whole so the checker can label them (NaN if unparseable).
  Text after the answer line is ignored.
  """
  steps: list[str] = []
  for line in (text or "").splitlines():
    if not line.strip() or _HEADER.match(line):
      continue
    m = _LINE_ANSWER.match(line)
    if m:
      return steps, m.group(1)
    m = _LINE_STEP.match(line)
    steps.append(m.group(2) if m else line.strip().lstrip("-* ").strip())
  return steps, None


def is_answer_line(text: str) -> bool:
  """Whether a line-mode step (an aligned line, docs/method.md §A1) is the '<Answer>: X' line rather than a reasoning
  step."""
  return _LINE_ANSWER.match((text or "").strip()) is not None


# --- thinking mode -----------------------------------------------------------------------------------------------


def _with_period(paragraph: str) -> str:
  paragraph = paragraph.strip()
  return paragraph if paragraph.endswith(".") else paragraph + "."


# What opens the final answer; SPAE's probe appends it inside the thinking to ask for the answer so far (docs/method.md
# §B1).
ANSWER_OPENER = "**Final Answer**\n\\boxed{"


def render_thinking(paragraphs: Sequence[str], answer: str | None) -> str:
  """'<think>\\n' + paragraphs each ending in '.\\n\\n' + '</think>\\n\\n**Final Answer**\\n\\\\boxed{answer}'."""
  body = "".join(_with_period(p) + "\n\n" for p in paragraphs)
  tail = "" if answer is None else f"{ANSWER_OPENER}{answer}}}"
  return f"<think>\n{body}</think>\n\n{tail}"


def _last_boxed(text: str) -> str | None:
  """Content of the last \\boxed{...}, braces balanced; None when there is none or it is unclosed."""
  start = text.rfind("\\boxed{")
  if start < 0:
    return None
  depth, i = 1, start + len("\\boxed{")
  for j in range(i, len(text)):
    if text[j] == "{":
      depth += 1
    elif text[j] == "}":
      depth -= 1
      if depth == 0:
        return text[i:j].strip()
  return None


def parse_thinking(text: str) -> tuple[list[str], str | None]:
  """(paragraphs, answer or None) from thinking-mode text; tolerant of model output.

  Paragraphs are split at '.\\n\\n' (the SPAE boundary of docs/method.md §A1/B1) before '</think>'; each keeps its final
  period; a trailing piece without a boundary is kept as the last paragraph. Without '<think>' the text starts at
  the beginning; without '</think>' everything is thinking. The answer is the last \\boxed{...} after '</think>'
  (anywhere when '</think>' is missing).
  """
  text = text or ""
  start = text.find("<think>")
  start = 0 if start < 0 else start + len("<think>")
  end = text.find("</think>", start)
  thinking = text[start:] if end < 0 else text[start:end]
  after = text if end < 0 else text[end + len("</think>") :]
  pieces = thinking.split(_BOUNDARY)
  paragraphs = [(p + ".").strip() for p in pieces[:-1] if p.strip()]
  if pieces[-1].strip():
    paragraphs.append(pieces[-1].strip())
  return paragraphs, _last_boxed(after)


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
  """Parses a model response in `mode` and labels its steps with the rule-based checker (docs/method.md §A2(a))."""
  _check_mode(mode)
  family = _family(problem)
  if mode == "line":
    steps, answer = parse_line(text)
    labels = family.check_steps(problem, steps)
  else:
    steps, answer = parse_thinking(text)
    labels = check_thinking(problem, steps)
  return Checked(steps, labels, answer, family.check_answer(problem, answer), first_error(labels))


def user_prompt(problem: Problem, mode: str, example: bool = True, first_step: bool = False) -> str:
  """The user message: the question, then how to lay out the steps and the answer in `mode`.

  example: the step hint gives a made-up step ("like 'the boss of 4 is 9'"). Prompts after worked examples leave
  it out (`trajectories.prompt_text`): the examples show the format, and SmolLM2-135M copied the made-up step's
  people into its own qa steps (docs/tasks.md, "SmolLM2").
  first_step: the question with its first step's starting point spelled out (`TaskFamily.first_step_question`;
  qa's start person as the first look-up's subject, planning's start room as the first move's origin).
  """
  _check_mode(mode)
  family = _family(problem)
  question = family.first_step_question(problem) if first_step else problem.question
  hint = family.step_hint if example or not family.step_rule else family.step_rule
  # Kept short: the built-in tiny model reads every prompt token on two CPU cores, many thousand times.
  if mode == "line":
    how = f"Solve step by step, one '- Step k:' line each ({hint}), then '<Answer>: ...'."
  else:
    how = f"Think in <think> paragraphs ({hint}), then '**Final Answer**' and \\boxed{{}}."
  return f"{question}\n\n{how}"
