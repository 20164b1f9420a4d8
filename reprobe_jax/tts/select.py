"""Choosing an answer from a search's candidates (docs/method.md §A7): trajectory scores, votes, pass@N, greedy,
budgets.

Host-side numpy over `PromptResult`s of any strategy. Scores are "higher = more likely incorrect" throughout:
a candidate's trajectory score aggregates its step scores (`SearchConfig.aggregation`), the best candidate has the
lowest, and a vote weighs each candidate by a decreasing function of it. Answers are each candidate's final answer
as its task parses it (`Task.parse_response`, through `tasks.formats.check_response`) and keys it for the vote
(`Task.normalize_answer`), so "12" and "12." are one answer where the task says so (the math task: '18' and '18.00',
'1,000' and '1000'); an unparseable answer is no answer and wins no vote. Correctness is the task's outcome label
(`Task.check_answer`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from reprobe_jax.eval.metrics import roc_auc

from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.tasks.base import Problem, Task, get_task
from reprobe_jax.tasks.formats import check_response
from reprobe_jax.tts.config import AGGREGATIONS
from reprobe_jax.tts.result import Candidate, PromptResult

# Scorers whose step scores are probabilities P(step incorrect) in [0, 1]: the probe, a PRM, and the random
# baseline's U(0, 1). The uncertainty baselines (maxprob, perplexity, entropies, self-certainty) are unbounded.
PROBABILITY_SCORERS = ("probe", "prm", "random")
SELECTIONS = ("first", "best", "majority", "weighted", "pass@n")


def is_probability_scorer(scorer) -> bool:
  """Whether a scorer (a StepScorer or its registry name) gives probabilities in [0, 1] (PROBABILITY_SCORERS)."""
  return (scorer if isinstance(scorer, str) else scorer.name) in PROBABILITY_SCORERS


def check_aggregation(aggregation: str, scorer) -> bool:
  """ConfigError naming SearchConfig.aggregation when it is unknown or 'product' over a scorer whose scores are not
  probabilities; returns whether the scorer's scores are probabilities. Strategies call it before any work."""
  if aggregation not in AGGREGATIONS:
    raise ConfigError(f"SearchConfig.aggregation: expected one of {AGGREGATIONS}, got {aggregation!r}")
  probabilities = is_probability_scorer(scorer)
  if aggregation == "product" and not probabilities:
    raise _product_error(f"scorer {scorer if isinstance(scorer, str) else scorer.name!r}")
  return probabilities


def _product_error(what: str) -> ConfigError:
  return ConfigError(
    f"SearchConfig.aggregation='product' is 1 - prod(1 - p) over P(step incorrect) and needs a "
    f"scorer whose scores are probabilities ({', '.join(PROBABILITY_SCORERS)}); {what} is "
    "unbounded: use 'min', 'mean' or 'last'"
  )


def trajectory_score(step_scores, aggregation: str, *, probabilities: bool) -> float:
  """One trajectory's score (higher = worse) from its step scores [S] (docs/method.md §A7). 'min': min over steps of
  P(correct), i.e. the worst step's score (max); 'mean'; 'last': the last scored step's; 'product':
  1 - prod(1 - p), probabilities only. NaN steps (no tokens) are skipped; no scored step gives +inf, the worst."""
  s = np.asarray(step_scores, np.float64).reshape(-1)  # [S]
  s = s[~np.isnan(s)]
  if aggregation == "product" and not probabilities:
    raise _product_error("this scorer")
  if probabilities and s.size and (s.min() < 0 or s.max() > 1):
    raise ConfigError(f"step scores {s.tolist()} are outside [0, 1]; the scorer is not a probability scorer")
  if not s.size:
    return math.inf
  if aggregation == "min":
    return float(s.max())
  if aggregation == "mean":
    return float(s.mean())
  if aggregation == "last":
    return float(s[-1])
  if aggregation == "product":
    return float(-np.expm1(np.sum(np.log1p(-s))))  # 1 - prod(1 - p), exact near 0
  raise ConfigError(f"SearchConfig.aggregation: expected one of {AGGREGATIONS}, got {aggregation!r}")


def log_vote_weight(scores, *, probabilities: bool) -> np.ndarray:
  """log of each candidate's vote weight [N] from its trajectory score [N], a decreasing function of it:
  P(correct) = 1 - s for probability scorers; exp(-s) for unbounded ones (for maxprob with 'min', the probability
  of the worst step's tokens; for perplexity, their geometric-mean probability). Candidates with no scored step
  (s = +inf) weigh 0. In log space so that exp(-s) cannot overflow for scores below 0 (self-certainty)."""
  s = np.asarray(scores, np.float64)  # [N]
  with np.errstate(divide="ignore"):
    return np.where(np.isinf(s), -np.inf, np.log1p(-np.minimum(s, 1.0)) if probabilities else -s)


@dataclasses.dataclass(frozen=True)
class Choice:
  """One selection's pick: the normalised answer (None: no candidate had one), whether it is the true answer, and
  the candidate it came from (for a vote: the best-scored candidate with the winning answer; None if none)."""

  answer: str | None
  correct: bool
  candidate: int | None


@dataclasses.dataclass(frozen=True)
class Outcome:
  """One prompt's answer under every selection (SELECTIONS) and what its search cost."""

  problem_id: str
  first: Choice  # the first candidate: greedy when the search was greedy with N = 1
  best: Choice  # the lowest trajectory score (ties: the lowest candidate index)
  majority: Choice  # the most frequent answer (ties: the better best trajectory score, then the first seen)
  weighted: Choice  # the largest summed vote weight (same ties)
  pass_at_n: Choice  # a correct candidate if any: the upper bound
  n: int
  sampled_steps: int
  generated_tokens: int
  scores: tuple[float, ...] = ()  # each candidate's trajectory score (higher = worse)
  correct: tuple[bool, ...] = ()  # each candidate's answer checked

  def choice(self, selection: str) -> Choice:
    if selection not in SELECTIONS:
      raise ConfigError(f"unknown selection {selection!r}; known: {SELECTIONS}")
    return getattr(self, "pass_at_n" if selection == "pass@n" else selection)


def answer_checker(problem: Problem, where: str = "") -> Task:
  """The task that reads, keys and checks `problem`'s answers; ConfigError naming the problem if its domain names
  no registered task."""
  try:
    return get_task(problem.domain)
  except ConfigError as e:
    raise ConfigError(f"{where}problem {problem.id!r}: no answer checker for domain {problem.domain!r} ({e})") from None


def candidate_answers(problem: Problem, result: PromptResult, tokenizer, mode: str) -> list[tuple[str | None, bool]]:
  """(voting key or None, correct) per candidate: its decoded response parsed and checked by the problem's task, its
  answer keyed by `Task.normalize_answer`."""
  task = answer_checker(problem)
  out = []
  for c in result.candidates:
    checked = check_response(problem, tokenizer.decode(list(c.response_ids)), mode)
    answer = None if checked.answer is None else task.normalize_answer(checked.answer)
    out.append((answer, bool(checked.correct) and answer is not None))
  return out


def _vote(answers: Sequence[str | None], totals_of, scores: np.ndarray) -> int | None:
  """The candidate that represents the winning answer: the largest total (`totals_of(indices)`), ties broken by
  the better best trajectory score, then the answer seen first; None when no candidate has an answer."""
  groups: dict[str, list[int]] = {}
  for i, a in enumerate(answers):
    if a is not None:
      groups.setdefault(a, []).append(i)
  if not groups:
    return None
  # Each group's representative: its best-scored candidate (lowest score, then lowest index).
  reps = {a: min(idx, key=lambda i: (scores[i], i)) for a, idx in groups.items()}
  winner = min(groups, key=lambda a: (-totals_of(groups[a]), scores[reps[a]], groups[a][0]))
  return reps[winner]


def choose(answers: Sequence[str | None], correct: Sequence[bool], scores, *, probabilities: bool) -> dict[str, Choice]:
  """Every selection (SELECTIONS) over N candidates: their normalised answers (None = none), correctness and
  trajectory scores [N] (higher = worse). docs/method.md §A7: best-of-N, majority vote, score-weighted vote, pass@N,
  first."""
  scores = np.asarray(scores, np.float64)  # [N]
  n = len(answers)
  if n == 0 or len(correct) != n or scores.shape != (n,) or np.isnan(scores).any():
    raise DataFormatError(
      f"choose: need one answer, correctness and score per candidate (no NaN: a trajectory "
      f"with no scored step scores +inf); got {n} answers, {len(correct)} flags and scores "
      f"{scores.tolist()}"
    )
  pick = lambda i: Choice(None, False, None) if i is None else Choice(answers[i], bool(correct[i]), int(i))
  logw = log_vote_weight(scores, probabilities=probabilities)
  weighted = _vote(answers, lambda idx: float(np.logaddexp.reduce(logw[idx])), scores)
  right = [i for i in range(n) if correct[i]]
  return {
    "first": pick(0),
    "best": pick(int(np.argmin(scores))),  # argmin: the first of equal scores
    "majority": pick(_vote(answers, len, scores)),
    "weighted": pick(weighted),
    "pass@n": pick(right[0] if right else None),
  }


def select(
  problem: Problem, result: PromptResult, tokenizer, *, mode: str, aggregation: str, probabilities: bool
) -> Outcome:
  """One prompt's Outcome: candidates' answers checked by their task, trajectory scores by `aggregation`, every
  selection. `probabilities`: whether the scorer's scores are probabilities (`is_probability_scorer`)."""
  if not result.candidates:
    raise DataFormatError(f"problem {problem.id!r}: the search returned no candidates")
  checked = candidate_answers(problem, result, tokenizer, mode)
  scores = [trajectory_score(c.scores, aggregation, probabilities=probabilities) for c in result.candidates]
  picks = choose([a for a, _ in checked], [ok for _, ok in checked], scores, probabilities=probabilities)
  return Outcome(
    problem_id=problem.id,
    first=picks["first"],
    best=picks["best"],
    majority=picks["majority"],
    weighted=picks["weighted"],
    pass_at_n=picks["pass@n"],
    n=len(result.candidates),
    sampled_steps=result.sampled_steps,
    generated_tokens=result.generated_tokens,
    scores=tuple(float(x) for x in scores),
    correct=tuple(ok for _, ok in checked),
  )


def selection_auroc(outcomes: Sequence[Outcome]) -> tuple[float, int]:
  """How well trajectory scores rank a prompt's own candidates: the mean over prompts with both right and wrong
  candidates of ROC-AUC(wrong answer, trajectory score), and the number of such prompts (NaN, 0 if none). 0.5 is
  chance; this is what picking among candidates needs, unlike a ranking across problems, which an easy-vs-hard
  signal already wins."""
  aucs = [
    roc_auc([not c for c in o.correct], o.scores)
    for o in outcomes
    if len(o.correct) == len(o.scores) and 0 < sum(o.correct) < len(o.correct)
  ]
  return (float(np.mean(aucs)), len(aucs)) if aucs else (math.nan, 0)


def summarize(outcomes: Sequence[Outcome]) -> dict[str, float]:
  """Accuracy of every selection over the prompts, their mean sampled steps and generated tokens, and how well
  the scores rank each prompt's own candidates (`selection_auroc`)."""
  if not outcomes:
    raise DataFormatError("summarize: no outcomes")
  out = {s: float(np.mean([o.choice(s).correct for o in outcomes])) for s in SELECTIONS}
  out["selection_auroc"], out["mixed_problems"] = selection_auroc(outcomes)
  out["sampled_steps"] = float(np.mean([o.sampled_steps for o in outcomes]))
  out["generated_tokens"] = float(np.mean([o.generated_tokens for o in outcomes]))
  out["problems"] = len(outcomes)
  return out


def candidate_cost(c: Candidate) -> tuple[int, int]:
  """(steps, generated tokens) of one independently sampled trajectory: its steps and its tokens, EOS included."""
  return len(c.steps), len(c.response_ids) + (c.finish_reason == "eos")


def first_k(result: PromptResult, k: int) -> PromptResult:
  """A Best-of-N result cut to its first k candidates, with their cost: the result of the same run at N = k. The N
  trajectories are independent draws (each row its own PRNG key), so the first k are a uniformly random k-subset
  and accuracy at k is unbiased; every k reads the same run, so the budget curve is nested (docs/method.md)."""
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= len(result.candidates):
    raise ConfigError(f"first_k: k must be an integer in [1, {len(result.candidates)}] (the run's N), got {k!r}")
  kept = result.candidates[:k]
  costs = [candidate_cost(c) for c in kept]
  return PromptResult(
    candidates=kept, sampled_steps=sum(s for s, _ in costs), generated_tokens=sum(t for _, t in costs)
  )
