"""The math task: the user's own problems (GSM8K, MATH, any JSONL of question and answer) as a registered task.

A problem of this task is `Problem(domain="math", answer=<the reference final answer>, data={"solution": ...,
"source": ..., "meta": {...}})`, usually made from a data file's record by `MathProblem.to_problem`. Responses are
read in either response format (docs/method.md §A1): line mode asks for '- Step k:' lines and an '<Answer>:' line,
thinking mode for paragraphs and a `\\boxed{}`; a response that does not write the asked answer line still gets the
final answer `tasks.math.extract_answer` finds in it. Answers are compared by `tasks.math.is_equivalent`. There is
no exact step checker: step labels come from an LLM judge or a file (docs/own-data.md), outcome labels from the
answer.
"""

from __future__ import annotations

import re
from fractions import Fraction

from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.steps.modes import THINK_CLOSE
from reprobe_jax.tasks.math import extract_answer, is_equivalent
from reprobe_jax.tasks.base import Problem, Task, register_task
from reprobe_jax.tasks.math_normalize import ROUND_PLACES, brackets, clean, number, words
from reprobe_jax.tasks.response import parse_line, parse_thinking, render_line, render_thinking

_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations: '48/2 = <<48/2=24>>24'
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z$\\(])")

# Worked examples written for this library (not from any dataset), shown as earlier chat turns when a job asks for
# few-shot prompts: (question, steps, answer).
EXAMPLES: tuple[tuple[str, tuple[str, ...], str], ...] = (
  (
    "A baker makes 4 trays of 12 rolls and sells 30 rolls. How many rolls are left?",
    ("4 trays of 12 rolls is 4 * 12 = 48 rolls.", "After selling 30, 48 - 30 = 18 rolls are left."),
    "18",
  ),
  (
    "Tom reads 15 pages a day. How many days does he need for a 120-page book?",
    ("Each day he reads 15 pages.", "120 / 15 = 8 days."),
    "8",
  ),
  (
    "A shirt costs $25 and is sold at 20% off. What is the sale price in dollars?",
    ("20% of 25 is 0.2 * 25 = 5 dollars.", "The sale price is 25 - 5 = 20 dollars."),
    "20",
  ),
  (
    "What is the sum of the solutions of x^2 - 5x + 6 = 0?",
    ("The equation factors as (x - 2)(x - 3) = 0.", "The solutions are 2 and 3, whose sum is 2 + 3 = 5."),
    "5",
  ),
)


class MathTask(Task):
  """Free-form math word problems checked by their final answer (module docstring)."""

  name = "math"

  def validate(self, problem: Problem, where: str) -> None:
    if not clean(problem.answer):
      raise DataFormatError(f"{where}: field 'answer' is no answer once its wrapping is removed: {problem.answer!r}")
    solution = problem.data.get("solution")
    if solution is not None and not isinstance(solution, str):
      raise DataFormatError(f"{where}: field 'data.solution' must be a string or null, found {type(solution).__name__}")

  def user_prompt(self, problem: Problem, mode: str, *, example: bool = True, first_step: bool = False) -> str:
    if mode == "line":
      how = "Solve step by step, one '- Step k:' line each, then '<Answer>: ' and the final answer alone."
    else:
      how = "Think step by step in <think> paragraphs, then '**Final Answer**' and the answer in \\boxed{}."
    return f"{problem.question}\n\n{how}"

  def worked_examples(
    self, mode: str, k: int, *, first_step: bool = False, goal_mark: bool = False
  ) -> list[tuple[str, str]]:
    if k > len(EXAMPLES):
      raise ConfigError(f"the math task has {len(EXAMPLES)} worked examples; asked for {k}")
    out = []
    for question, steps, answer in EXAMPLES[:k]:
      shot = Problem(f"math-example-{len(out)}", self.name, question, answer)
      response = render_line(steps, answer) if mode == "line" else render_thinking(steps, answer)
      out.append((self.user_prompt(shot, mode), response))
    return out

  def parse_response(self, text: str, mode: str) -> tuple[list[str], str | None]:
    """The format's steps and answer; when the answer line or box is missing, the answer `extract_answer` finds in
    the text after the steps (in thinking mode only after '</think>': the thinking's numbers are no answer)."""
    if mode == "line":
      steps, answer = parse_line(text)
      return steps, answer if answer else extract_answer(text or "")
    paragraphs, answer = parse_thinking(text)
    if answer is None and THINK_CLOSE in (text or ""):
      answer = extract_answer(text.split(THINK_CLOSE, 1)[1])
    return paragraphs, answer

  def normalize_answer(self, answer: str) -> str | None:
    """The key answers are voted on by: a number as its exact value (to ROUND_PLACES decimals; a percent as its
    number, GSM8K's convention), a tuple of numbers item by item, plain words casefolded, else the cleaned text
    without spaces; None when nothing is left. Coarser than `is_equivalent` (no math-verify: `\\sqrt{4}` and `2`
    are two keys)."""
    text = clean(answer)
    if not text:
      return None
    if (n := number(text)) is not None:
      return _number_key(n.value)
    group = brackets(text)
    if group is not None and all(number(i) is not None for i in group[1]):
      return group[0] + ",".join(_number_key(number(i).value) for i in group[1]) + group[2]
    return words(text) or "".join(text.split())

  def is_equivalent(self, predicted: str, reference: str) -> bool:
    return is_equivalent(predicted, reference)

  def reference_steps(self, problem: Problem) -> list[str]:
    """The problem's worked solution cut into steps (`solution_steps`), [] when it has none."""
    solution = problem.data.get("solution")
    return solution_steps(solution) if solution else []


def _number_key(value: Fraction) -> str:
  return str(Fraction(round(value, ROUND_PLACES)))


def solution_steps(solution: str, boundary: str = "auto") -> list[str]:
  """A worked solution cut into steps: 'line' at line breaks (GSM8K's rationales; the '#### answer' line and its
  calculator annotations dropped), 'paragraph' at blank lines, 'sentence' at sentence ends (MATH's solutions are
  prose); 'auto' takes lines when the text has several, else sentences."""
  if boundary not in ("auto", "line", "paragraph", "sentence"):
    raise ConfigError(f"solution step boundary must be auto, line, paragraph or sentence, found {boundary!r}")
  text = _CALCULATOR.sub("", solution).split("####", 1)[0]
  lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
  if boundary == "auto":
    boundary = "line" if len(lines) > 1 else "sentence"
  if boundary == "line":
    return lines
  if boundary == "paragraph":
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
  return [s.strip() for s in _SENTENCE.split(" ".join(text.split())) if s.strip()]


register_task(MathTask())
