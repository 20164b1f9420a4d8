"""Math answers: the final answer of a free-form solution, and whether two answers are equivalent.

`extract_answer` reads what a solution ends with in GSM8K and MATH style; `judge_answer` says whether a predicted
answer equals a reference one and why (an `AnswerVerdict`), and `is_equivalent` is its yes/no. Numbers, fractions,
decimals, percents, thousands separators, units, currency signs, `x = ...`, tuples, intervals and plain words are
settled by exact rules (`tasks/math_normalize.py`); everything else by math-verify (Hugging Face's Math-Verify
library) in a worker process, with a time limit that holds in any thread and in worker processes
(`tasks/math_sandbox.py`). docs/tasks.md ("Math answers") gives the rules.
"""

from __future__ import annotations

import dataclasses
import math
import re

from reprobe_jax.errors import ConfigError
import reprobe_jax.tasks.math_sandbox as math_sandbox
from reprobe_jax.tasks.math_normalize import brackets, clean, last_boxed, number, same_brackets, same_number, words

DEFAULT_TIMEOUT_S = 5.0  # math-verify's own default per comparison

# Every reason a verdict can give: equivalent True, False, or None (no verdict: the answer could not be judged).
REASONS = {
  "equal as numbers": True,
  "equal as tuples": True,
  "equal as text": True,
  "equal by math-verify": True,
  "different numbers": False,
  "different tuples": False,
  "different text": False,
  "text against a number": False,
  "different by math-verify": False,
  "unparseable prediction": None,
  "unparseable reference": None,
  "timed out": None,
  "comparison failed": None,
}

_GSM8K = re.compile(r"####")
_THE_ANSWER_IS = re.compile(r"\bthe\s+(?:final\s+)?answer\s+is\b:?", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
_LAST_NUMBER = re.compile(r"(?:(?<![\w)\]}])-)?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")


@dataclasses.dataclass(frozen=True)
class AnswerVerdict:
  """Whether a predicted answer equals the reference: True, False, or None when it could not be judged, with the
  reason (one of `REASONS`: how it was settled, or why it was not)."""

  equivalent: bool | None
  reason: str


def _text_arg(name: str, value: object) -> str:
  if not isinstance(value, str):
    raise ConfigError(f"{name} must be a str, found {type(value).__name__} {value!r:.60}")
  return value


def _tidy(answer: str) -> str | None:
  answer = answer.strip().strip("*").strip()  # `**18**`: markdown bold around the answer
  answer = answer.rstrip(".").strip()
  return answer or None


def extract_answer(text: str) -> str | None:
  """The final answer of a solution, as written: the content of the last `\\boxed{...}` (nested braces; `\\boxed 5`
  and `\\fbox{...}` too; an empty or unclosed one is passed over), else what follows the last GSM8K `####`, else what
  follows the last "the answer is" (any case; up to the end of its sentence or line, a trailing period dropped),
  else the last number in the text; None when there is none of these."""
  text = _text_arg("text", text)
  boxed = last_boxed(text)
  if boxed is not None:
    return boxed
  for pattern in (_GSM8K, _THE_ANSWER_IS):
    ends = [m.end() for m in pattern.finditer(text)]
    if ends:
      line = text[ends[-1] :].split("\n", 1)[0]
      answer = _tidy(_SENTENCE_END.split(line, maxsplit=1)[0] if pattern is _THE_ANSWER_IS else line)
      if answer is not None:
        return answer
  numbers = _LAST_NUMBER.findall(text)
  return numbers[-1] if numbers else None


def judge_answer(predicted: str, reference: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> AnswerVerdict:
  """Whether `predicted` is the same answer as `reference`, and why (docs/tasks.md, "Math answers").

  Both are cleaned (`math_normalize.clean`), then settled by the first rule that applies: one exact number each
  (decimals to 6 places, a percent with or without its sign); tuples, intervals or sets of numbers; plain words
  (any case); the same text; else math-verify with at most `timeout` seconds for parsing and comparing (in a worker
  process, so from any thread; the first call in a process also waits about a second for the worker to start).
  Not symmetric where math-verify is not: `reference` is its gold answer.
  """
  predicted, reference = _text_arg("predicted", predicted), _text_arg("reference", reference)
  if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
    raise ConfigError(f"timeout must be a positive number of seconds, found {timeout!r}")
  p, r = clean(predicted), clean(reference)
  if not r:
    return AnswerVerdict(None, "unparseable reference")
  if not p:
    return AnswerVerdict(None, "unparseable prediction")
  pn, rn = number(p), number(r)
  if pn is not None and rn is not None:
    same = same_number(pn, rn)
    return AnswerVerdict(same, "equal as numbers" if same else "different numbers")
  pb, rb = brackets(p), brackets(r)
  if pb is not None and rb is not None and (same := same_brackets(pb, rb)) is not None:
    return AnswerVerdict(same, "equal as tuples" if same else "different tuples")
  pw, rw = words(p), words(r)
  if pw is not None and rw is not None:
    return AnswerVerdict(pw == rw, "equal as text" if pw == rw else "different text")
  if (pw is not None and rn is not None) or (rw is not None and pn is not None):
    return AnswerVerdict(False, "text against a number")
  if "".join(p.split()) == "".join(r.split()):
    return AnswerVerdict(True, "equal as text")
  return AnswerVerdict(*math_sandbox.compare(p, r, float(timeout)))


def is_equivalent(predicted: str, reference: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> bool:
  """True when `judge_answer` finds the two answers equivalent; False when it finds them different and when it
  cannot judge them (unparseable, timed out): an answer that cannot be checked is not counted right."""
  return judge_answer(predicted, reference, timeout=timeout).equivalent is True
