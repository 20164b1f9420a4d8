"""Answer selection (docs/method.md §A7) on worked examples: every aggregation, both votes with their tie rules, pass@N,
NaN steps, 'product' refusing unbounded scores, the family's answer normalisation, budget sub-sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest

from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.tasks import Problem, make_problems
from reprobe_jax.tts import Candidate, PromptResult
from reprobe_jax.tts.select import (
  Choice,
  Outcome,
  answer_checker,
  check_aggregation,
  choose,
  first_k,
  log_vote_weight,
  select,
  selection_auroc,
  summarize,
  trajectory_score,
)

STEPS = [0.2, math.nan, 0.5, 0.1]  # P(step incorrect); the NaN step had no tokens


@pytest.mark.parametrize(
  "aggregation, expected",
  [
    ("min", 0.5),  # min over steps of P(correct) = 1 - 0.5: the worst step's score
    ("mean", (0.2 + 0.5 + 0.1) / 3),
    ("last", 0.1),  # the last scored step (the NaN one is skipped)
    ("product", 1 - 0.8 * 0.5 * 0.9),  # 1 - P(every step correct) = 0.64
  ],
)
def test_each_aggregation_on_a_worked_example(aggregation, expected):
  assert trajectory_score(STEPS, aggregation, probabilities=True) == pytest.approx(expected, abs=1e-12)


def test_unbounded_scores_aggregate_and_refuse_product():
  nll = [3.0, 7.5, math.nan, 1.0]  # maxprob: -sum log p of each step
  assert trajectory_score(nll, "min", probabilities=False) == 7.5
  assert trajectory_score(nll, "mean", probabilities=False) == pytest.approx(11.5 / 3)
  assert trajectory_score(nll, "last", probabilities=False) == 1.0
  with pytest.raises(ConfigError, match="aggregation='product'.*probabilities"):
    trajectory_score(nll, "product", probabilities=False)
  with pytest.raises(ConfigError, match="aggregation='product'.*'maxprob' is unbounded"):
    check_aggregation("product", "maxprob")
  assert check_aggregation("product", "probe") is True and check_aggregation("min", "perplexity") is False
  with pytest.raises(ConfigError, match="SearchConfig.aggregation: expected one of"):
    check_aggregation("median", "probe")
  with pytest.raises(ConfigError, match=r"outside \[0, 1\]"):  # a probability scorer that is not one
    trajectory_score([0.2, 1.5], "min", probabilities=True)


def test_a_trajectory_with_no_scored_step_gets_the_worst_score():
  for agg in ("min", "mean", "last", "product"):
    assert trajectory_score([math.nan, math.nan], agg, probabilities=True) == math.inf
    assert trajectory_score([], agg, probabilities=True) == math.inf
  # ... weighs nothing in a vote, and loses best-of-N to any scored one.
  np.testing.assert_array_equal(log_vote_weight([math.inf, 0.25], probabilities=True), [-np.inf, np.log(0.75)])
  picks = choose(["a", "b"], [True, False], [math.inf, 0.9], probabilities=True)
  assert picks["best"] == Choice("b", False, 1) and picks["weighted"].answer == "b"
  assert picks["majority"].answer == "b"  # 1 vote each; 'b' has the better best score


def test_every_selection_on_a_worked_example():
  # Truth is 12. Trajectory scores (probabilities): weights P(correct) = 1 - s.
  answers = ["12", "7", "12", None, "7", "7"]
  correct = [True, False, True, False, False, False]
  scores = [0.30, 0.10, 0.20, 0.05, 0.70, 0.80]
  picks = choose(answers, correct, scores, probabilities=True)
  assert picks["first"] == Choice("12", True, 0)
  assert picks["best"] == Choice(None, False, 3)  # the lowest score, though it has no answer
  assert picks["majority"] == Choice("7", False, 1)  # 3 votes against 2; its best-scored candidate is 1
  # weighted: '12' 0.7 + 0.8 = 1.5 against '7' 0.9 + 0.3 + 0.2 = 1.4
  assert picks["weighted"] == Choice("12", True, 2)
  assert picks["pass@n"] == Choice("12", True, 0)
  none_right = choose(["7", None], [False, False], [0.1, 0.2], probabilities=True)
  assert none_right["pass@n"] == Choice(None, False, None)


def test_vote_ties_go_to_the_better_best_score_then_the_first_seen():
  # 2 votes each; '9' holds the best score (0.3 < 0.35)
  assert choose(["5", "9", "9", "5"], [False] * 4, [0.4, 0.3, 0.5, 0.35], probabilities=True)["majority"] == Choice(
    "9", False, 1
  )
  # equal counts, equal best scores: the answer seen first; equal scores for best-of-N: the lowest index
  tie = choose(["5", "9"], [False, True], [0.3, 0.3], probabilities=True)
  assert tie["majority"] == Choice("5", False, 0) and tie["weighted"] == Choice("5", False, 0)
  assert tie["best"] == Choice("5", False, 0)
  assert choose(["a", "b", "c"], [False] * 3, [0.4, 0.2, 0.2], probabilities=True)["best"].candidate == 1


def test_no_answer_never_wins_a_vote_unless_nothing_else_exists():
  picks = choose([None, None, None, "3"], [False, False, False, True], [0.01, 0.02, 0.03, 0.9], probabilities=True)
  assert picks["majority"] == Choice("3", True, 3) and picks["weighted"] == Choice("3", True, 3)
  empty = choose([None, None], [False, False], [0.1, 0.2], probabilities=True)
  assert empty["majority"] == empty["weighted"] == Choice(None, False, None)


def test_weighted_vote_over_unbounded_scores():
  # maxprob trajectory scores: weights exp(-s): 'x' e^-1 + e^-2 = 0.503 against 'y' e^-0.5 = 0.607
  picks = choose(["x", "y", "x"], [True, False, True], [1.0, 0.5, 2.0], probabilities=False)
  assert picks["weighted"] == Choice("y", False, 1) and picks["majority"] == Choice("x", True, 0)
  # self-certainty scores are negative: exp(-s) would overflow; the vote still counts (log space)
  picks = choose(["a", "b", "b"], [False] * 3, [-800.0, -799.0, -799.5], probabilities=False)
  assert picks["weighted"].answer == "a"  # e^800 > e^799 + e^799.5
  with pytest.raises(DataFormatError, match="no NaN"):
    choose(["a"], [False], [math.nan], probabilities=False)


class _Pieces:
  """A tokenizer whose token i decodes to TEXTS[i]."""

  def __init__(self, texts):
    self.texts = texts

  def decode(self, ids):
    return "".join(self.texts[i] for i in ids)


def _candidate(i, scores, finish="eos"):
  return Candidate(
    response_ids=(i,), steps=tuple((0, 1) for _ in scores), step_scores=tuple(scores), finish_reason=finish
  )


def test_select_votes_on_the_familys_normalised_answers():
  problem = make_problems("arithmetic", 1, 0, 1)[0]
  a, b = problem.answer, str(int(problem.answer) + 1)
  texts = [
    f"- Step 1: x\n<Answer>: {a}",
    f"<Answer>:  {a}.",
    f"<Answer>: {b}",
    f"<Answer>: {b}",
    f"<Answer>: {a},",
    "no answer line",
  ]
  scores = [[0.6], [0.5], [0.1], [0.2], [0.4], [0.0]]
  result = PromptResult(tuple(_candidate(i, s) for i, s in enumerate(scores)), sampled_steps=6, generated_tokens=12)
  out = select(problem, result, _Pieces(texts), mode="line", aggregation="min", probabilities=True)
  # Three spellings of one answer: 3 votes for it against 2 for b (as raw strings b would win 2 to 1).
  assert out.majority == Choice(a, True, 4)  # the best-scored of candidates 0, 1, 4
  assert out.weighted == Choice(b, False, 2)  # but weighs 0.4 + 0.5 + 0.6 = 1.5 against b's 0.9 + 0.8 = 1.7
  assert out.best == Choice(None, False, 5) and out.first == Choice(a, True, 0)
  assert out.pass_at_n == Choice(a, True, 0)
  assert (out.n, out.sampled_steps, out.generated_tokens) == (6, 6, 12)


def test_summarize_and_unknown_families():
  right, wrong = Choice("1", True, 0), Choice("2", False, 0)
  # p1's scores rank its wrong candidates (1, 3) above its right ones: 3 of the 4 (wrong, right) pairs in order and
  # one tie -> AUROC 3.5 / 4; p2's all-right candidates say nothing about ranking and are left out.
  o1 = Outcome(
    "p1", right, wrong, right, wrong, right, 4, 10, 100, scores=(0.1, 0.9, 0.5, 0.5), correct=(True, False, True, False)
  )
  o2 = Outcome(
    "p2", wrong, wrong, right, right, right, 4, 20, 300, scores=(0.1, 0.2, 0.3, 0.4), correct=(True, True, True, True)
  )
  s = summarize([o1, o2])
  assert s == {
    "first": 0.5,
    "best": 0.0,
    "majority": 1.0,
    "weighted": 0.5,
    "pass@n": 1.0,
    "sampled_steps": 15.0,
    "generated_tokens": 200.0,
    "problems": 2,
    "selection_auroc": 0.875,
    "mixed_problems": 1,
  }
  assert selection_auroc([o2]) == (pytest.approx(float("nan"), nan_ok=True), 0)
  with pytest.raises(DataFormatError, match="no outcomes"):
    summarize([])
  with pytest.raises(ConfigError, match="problem 'x1': no answer checker for domain 'chess'"):
    answer_checker(Problem("x1", "chess", "Mate in 2?", "Qh7"))


def test_first_k_is_the_run_at_n_equal_k():
  cands = (
    _candidate(0, [0.1, 0.2]),
    _candidate(1, [0.3], "length"),
    _candidate(2, [0.5, 0.1, 0.2], "eos"),
    _candidate(3, [0.9]),
  )
  result = PromptResult(cands, sampled_steps=7, generated_tokens=4 + 3)
  two = first_k(result, 2)
  assert two.candidates == cands[:2]
  assert (two.sampled_steps, two.generated_tokens) == (3, 1 + 1 + 1)  # one token each, +1 for the EOS of cand 0
  full = first_k(result, 4)
  assert (full.sampled_steps, full.generated_tokens) == (7, 7)
  for k in (0, 5, 1.0, True):
    with pytest.raises(ConfigError, match=r"k must be an integer in \[1, 4\]"):
      first_k(result, k)
