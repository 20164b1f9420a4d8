"""Math answers (reprobe_jax/tasks/math.py): extract_answer and judge_answer / is_equivalent held to tables written
here, each row with the verdict a careful grader gives, and the time limit held from a thread and from a worker
process on an answer sympy would chew on for minutes (`9^{9^{9}}` against `1`)."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import threading
import time

import pytest

from reprobe_jax.errors import ConfigError
from reprobe_jax.tasks import math_sandbox
from reprobe_jax.tasks.math import REASONS, AnswerVerdict, extract_answer, is_equivalent, judge_answer

NUM, DNUM = "equal as numbers", "different numbers"
TUP, DTUP = "equal as tuples", "different tuples"
TXT, DTXT = "equal as text", "different text"
MV, DMV = "equal by math-verify", "different by math-verify"

# (predicted, reference, equivalent, reason). Decisions worth a word: a percent equals its number with or without
# the sign and its fraction (50% = 50 = 0.5: GSM8K writes "what percent" answers bare); `x = 3` and `y = 3` both
# equal 3 (the variable's name is not the answer); decimals are compared to 6 places, fractions exactly.
EQUIVALENCE = [
  # numbers and decimals
  ("18", "18", True, NUM),
  ("18.0", "18", True, NUM),
  ("18.00", "18.0", True, NUM),
  ("18.", "18", True, NUM),
  ("3", "4", False, DNUM),
  ("-5", "5", False, DNUM),
  ("\u22125", "-5", True, NUM),
  ("+7", "7", True, NUM),
  (".5", "0.5", True, NUM),
  ("0.10000001", "0.1", True, NUM),
  ("0.1001", "0.1", False, DNUM),
  ("007", "7", True, NUM),
  # fractions
  ("\\frac{1}{2}", "0.5", True, NUM),
  ("\\dfrac{3}{4}", "0.75", True, NUM),
  ("\\tfrac{2}{4}", "\\frac{1}{2}", True, NUM),
  ("\\frac12", "0.5", True, NUM),
  ("-\\frac{3}{4}", "-0.75", True, NUM),
  ("1/3", "\\frac{1}{3}", True, NUM),
  ("0.333333", "\\frac{1}{3}", True, NUM),
  ("0.33", "\\frac{1}{3}", False, DNUM),
  ("\\frac{2}{3}", "\\frac{3}{2}", False, DNUM),
  # percents
  ("50\\%", "50", True, NUM),
  ("50%", "0.5", True, NUM),
  ("12.5%", "12.5\\%", True, NUM),
  ("50\\%", "5", False, DNUM),
  ("25%", "0.25%", False, DNUM),
  # thousands separators
  ("1,000", "1000", True, NUM),
  ("1,234,567", "1234567", True, NUM),
  ("1{,}000", "1000", True, NUM),
  ("1,000.5", "1000.5", True, NUM),
  ("1,000", "100", False, DNUM),
  # units and currency signs
  ("$18", "18", True, NUM),
  ("\\$18.00", "18", True, NUM),
  ("\u20ac20", "20", True, NUM),
  ("18 dollars", "18", True, NUM),
  ("12 dollars per hour", "12", True, NUM),
  ("5 \\text{ cm}", "5", True, NUM),
  ("5\\text{ cm}^2", "5", True, NUM),
  ("90^\\circ", "90", True, NUM),
  ("18 apples", "19", False, DNUM),
  # x = ...
  ("x = 3", "3", True, NUM),
  ("3", "x=3", True, NUM),
  ("y = -2", "-2", True, NUM),
  ("a_1 = 5", "5", True, NUM),
  ("x = 3", "4", False, DNUM),
  # tuples, intervals and sets
  ("(1, 2)", "(1,2)", True, TUP),
  ("(1, 2)", "(2, 1)", False, DTUP),
  ("[0, 1)", "[0,1)", True, TUP),
  ("(0, 1]", "(0, 1)", False, DTUP),
  ("[1, 5]", "[1, 5)", False, DTUP),
  ("\\left( 3, \\frac{1}{2} \\right)", "(3, 0.5)", True, TUP),
  ("(1, 2, 3)", "(1, 2)", False, DTUP),
  ("\\{1, 2\\}", "\\{2, 1\\}", True, TUP),
  ("(-\\infty, 0)", "(-\\infty,0)", True, TXT),
  ("(2, \\sqrt{3})", "(2, 3^{1/2})", True, MV),
  # \sqrt, \frac over expressions, and whatever else math-verify settles
  ("\\sqrt{2}", "2^{1/2}", True, MV),
  ("2\\sqrt{3}", "\\sqrt{12}", True, MV),
  ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", True, MV),
  ("\\dfrac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{2}", True, TXT),
  ("\\sqrt{2}", "\\sqrt{3}", False, DMV),
  ("x^2+2x+1", "(x+1)^2", True, MV),
  ("\\frac{\\pi}{2}", "\\frac{\\pi}{3}", False, DMV),
  ("\\boxed{5}", "5", True, NUM),
  ("$\\frac{1}{2}$", "\\frac{1}{2}", True, NUM),
  # plain text
  ("blue", "Blue", True, TXT),
  ("blue", "red", False, DTXT),
  ("blue", "bule", False, DTXT),  # math-verify alone reads both as b*l*u*e and says equal
  ("\\text{Blue}", "blue", True, TXT),
  ("(C)", "C", True, TXT),
  ("New York", "new  york", True, TXT),
  ("five", "5", False, "text against a number"),
  # what cannot be judged
  ("", "5", None, "unparseable prediction"),
  ("\\frac{", "1", None, "unparseable prediction"),
  ("$", "5", None, "unparseable prediction"),
  ("5", "", None, "unparseable reference"),
]


@pytest.mark.parametrize("predicted, reference, equivalent, reason", EQUIVALENCE)
def test_judge_answer_against_the_table(predicted, reference, equivalent, reason):
  verdict = judge_answer(predicted, reference)
  assert verdict == AnswerVerdict(equivalent, reason)
  assert REASONS[verdict.reason] is verdict.equivalent
  assert is_equivalent(predicted, reference) is (equivalent is True)


def test_the_table_covers_every_kind_both_ways():
  assert len(EQUIVALENCE) >= 60
  outcomes = {(equivalent, reason) for _, _, equivalent, reason in EQUIVALENCE}
  for reason in (NUM, DNUM, TUP, DTUP, TXT, DTXT, MV, DMV):
    assert (REASONS[reason], reason) in outcomes


# (text, answer) for extract_answer.
EXTRACTION = [
  ("So the total is \\boxed{5}.", "5"),
  ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
  ("We get $\\boxed{\\frac{\\sqrt{3}}{2}}$", "\\frac{\\sqrt{3}}{2}"),
  ("First \\boxed{3}, then on reflection \\boxed{4}.", "4"),
  ("The value is \\boxed 5", "5"),
  ("\\fbox{7}", "7"),
  ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
  ("\\boxed{\\text{(C)}}", "\\text{(C)}"),
  ("\\boxed{3} and then \\boxed{4", "3"),  # the last one is not closed
  ("\\boxed{} so it is 12", "12"),  # an empty box is no answer
  ("#### 5\nOn second thought \\boxed{6}", "6"),  # a box wins over ####
  ("She pays 3 * 6 = 18 dollars.\n#### 18", "18"),
  ("#### 1,000", "1,000"),
  ("####18", "18"),
  ("#### 4\nNo, it is\n#### 5", "5"),
  ("The answer is 42.", "42"),
  ("After all that, the answer is: 3.5", "3.5"),
  ("THE ANSWER IS $\\frac{1}{2}$.", "$\\frac{1}{2}$"),
  ("So the final answer is **7**. Done.", "7"),
  ("The answer is 3. Wait, the answer is 4.", "4"),
  ("The answer is 3.5. I am sure of it, 9 times over.", "3.5"),
  ("The answer is blue.", "blue"),
  ("I have 3 apples and 5 pears", "5"),
  ("It costs 1,200 dollars.", "1,200"),
  ("-7 is what is left", "-7"),
  ("the total is 2.5.", "2.5"),
  ("eat 3/4 of the cake", "3/4"),
  ("no numbers here", None),
  ("", None),
  ("\\boxed{}", None),
]


@pytest.mark.parametrize("text, answer", EXTRACTION)
def test_extract_answer_against_the_table(text, answer):
  assert extract_answer(text) == answer


def test_extracted_answers_judge_against_their_references():
  assert is_equivalent(extract_answer("She pays 3 * 6 = 18 dollars.\n#### 18"), "18.0")
  assert is_equivalent(extract_answer("so $\\boxed{\\dfrac{1}{2}}$"), "0.5")
  assert not is_equivalent(extract_answer("The answer is 17."), "18")


@pytest.mark.parametrize(
  "call, name",
  [
    (lambda: judge_answer(None, "5"), "predicted"),
    (lambda: judge_answer("5", b"5"), "reference"),
    (lambda: is_equivalent(b"5", "5"), "predicted"),
    (lambda: extract_answer(b"\\boxed{5}"), "text"),
    (lambda: extract_answer(None), "text"),
    (lambda: judge_answer("5", "5", timeout=0), "timeout"),
    (lambda: judge_answer("5", "5", timeout=float("nan")), "timeout"),
    (lambda: judge_answer("5", "5", timeout="5"), "timeout"),
  ],
)
def test_bad_arguments_name_the_argument(call, name):
  with pytest.raises(ConfigError, match=f"^{name} must be"):
    call()


# The time limit. `9^{9^{9}}` against `1` keeps sympy busy for minutes (measured: no answer in 20 s); a warm call
# first, so the timed call measures the comparison and not the worker's start (about a second, once per process).
SLOW = ("9^{9^{9}}", "1")
LIMIT_S, SLACK_S = 1.0, 1.5


def _timed_slow_judge() -> tuple[AnswerVerdict, float, AnswerVerdict]:
  judge_answer("\\sqrt{4}", "2")  # warms this process's worker
  start = time.monotonic()
  verdict = judge_answer(*SLOW, timeout=LIMIT_S)
  elapsed = time.monotonic() - start
  return verdict, elapsed, judge_answer("\\sqrt{4}", "2")  # the killed worker is replaced


def _check_timed(result: tuple[AnswerVerdict, float, AnswerVerdict]) -> None:
  verdict, elapsed, after = result
  assert verdict == AnswerVerdict(None, "timed out")
  assert LIMIT_S <= elapsed < LIMIT_S + SLACK_S
  assert after == AnswerVerdict(True, MV)


def test_time_limit_holds_in_the_main_thread():
  _check_timed(_timed_slow_judge())


def test_time_limit_holds_in_threads_at_once():
  results = [None, None]

  def run(i: int) -> None:
    results[i] = _timed_slow_judge()

  threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=60)
  for result in results:
    _check_timed(result)


def _owners_then_timed_slow_judge() -> tuple[int, list[int], tuple[AnswerVerdict, float, AnswerVerdict]]:
  judge_answer("\\sqrt{4}", "2")
  return os.getpid(), [worker.owner for worker in math_sandbox._idle], _timed_slow_judge()


def test_time_limit_holds_in_a_worker_process():
  """In a pool worker (spawned: forking a process that runs JAX's threads can deadlock, so the test never forks)."""
  judge_answer("\\sqrt{4}", "2")  # the parent holds a worker: the child must start its own
  spawn = multiprocessing.get_context("spawn")
  with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
    pid, owners, result = pool.submit(_owners_then_timed_slow_judge).result(timeout=60)
  assert owners == [pid]  # the child compared with a worker of its own, not one of its parent's
  _check_timed(result)


@pytest.mark.parametrize(
  "text",
  ["\\boxed{" * 100_000, "\\boxed{}" * 100_000, "\\boxed 5" * 100_000, "the answer is " * 50_000, "1" * 200_000 + "!"],
)
def test_extraction_and_the_exact_rules_stay_linear_on_hostile_text(text):
  start = time.monotonic()
  extract_answer(text)
  judge_answer(text[:100_000], "1", timeout=LIMIT_S)  # goes to math-verify when the exact rules cannot settle it
  assert time.monotonic() - start < 20.0  # 0.2-0.6 s alone on 2 cores, 5.0 s under a full suite; quadratic: hours
