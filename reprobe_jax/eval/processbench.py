"""ProcessBench's metric (Zheng et al., 2024, "ProcessBench: Identifying Process Errors in Mathematical Reasoning"):
how well a step scorer finds the first wrong step of a solution, or says that there is none.

A scorer gives every step an error score (higher = more likely wrong, as every scorer of docs/method.md §A6 does).
Its predicted first error is the first step whose score exceeds a threshold tau (None when no step does). On the
solutions with a labelled error the prediction is right when it is that step; on the correct solutions when it is
None. ProcessBench reports the two accuracies and their harmonic mean, F1. The paper turns a PRM into such a
predictor with a threshold on its step scores; here tau is chosen on a validation split (the tau of the highest F1
there, over the distinct validation scores, and one below all of them: every first step flagged) and reported on
test (`evaluate`).

A solution's labelled first error is its first step labelled 1 (incorrect); steps labelled NaN (unknown, as
ProcessBench leaves the steps after the first error) are skipped, so a solution without a step labelled 1 is a
correct one. Pure numpy, like `eval.metrics`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from reprobe_jax.errors import ConfigError


def labelled_first_error(labels) -> int | None:
  """The index of the first step labelled 1 (incorrect), None when there is none (NaN labels are unknown)."""
  hits = np.flatnonzero(np.asarray(labels, np.float64) == 1.0)
  return int(hits[0]) if hits.size else None


def predicted_first_error(scores, tau: float) -> int | None:
  """The index of the first step whose error score exceeds `tau`, None when none does (a NaN score, a step without
  tokens, is never flagged)."""
  hits = np.flatnonzero(np.asarray(scores, np.float64) > tau)
  return int(hits[0]) if hits.size else None


@dataclasses.dataclass(frozen=True)
class FirstErrorScore:
  """ProcessBench's numbers at one threshold: `error_acc` over the `n_error` solutions with a labelled error (NaN
  when there is none), `correct_acc` over the `n_correct` others, `f1` their harmonic mean (0 when either is 0, NaN
  when either is NaN)."""

  tau: float
  error_acc: float
  correct_acc: float
  f1: float
  n_error: int
  n_correct: int

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


def score(labels: Sequence, scores: Sequence, tau: float) -> FirstErrorScore:
  """ProcessBench's accuracies and F1 at threshold `tau`. labels, scores: one array [num_steps] per solution."""
  _check(labels, scores)
  truth = [labelled_first_error(y) for y in labels]
  pred = [predicted_first_error(s, tau) for s in scores]
  wrong = [p == t for t, p in zip(truth, pred) if t is not None]
  right = [p is None for t, p in zip(truth, pred) if t is None]
  error_acc = float(np.mean(wrong)) if wrong else math.nan
  correct_acc = float(np.mean(right)) if right else math.nan
  return FirstErrorScore(float(tau), error_acc, correct_acc, _harmonic(error_acc, correct_acc), len(wrong), len(right))


def _harmonic(a: float, b: float) -> float:
  if math.isnan(a) or math.isnan(b):
    return math.nan
  return 0.0 if a + b == 0 else 2 * a * b / (a + b)


def _check(labels: Sequence, scores: Sequence) -> None:
  if len(labels) != len(scores):
    raise ConfigError(f"ProcessBench metric: {len(labels)} label arrays but {len(scores)} score arrays")
  for k, (y, s) in enumerate(zip(labels, scores)):
    if np.shape(y) != np.shape(s):
      raise ConfigError(f"ProcessBench metric: solution {k} has {np.size(y)} labels but {np.size(s)} scores")


def candidate_taus(scores: Sequence) -> np.ndarray:
  """The thresholds worth trying: one below every score (each solution's first step flagged), then each distinct
  score (steps strictly above it flagged; at the highest, none), ascending."""
  flat = np.concatenate([np.asarray(s, np.float64).ravel() for s in scores] + [np.zeros(0)])
  return np.r_[-np.inf, np.unique(flat[~np.isnan(flat)])]


def choose_tau(labels: Sequence, scores: Sequence) -> FirstErrorScore:
  """The threshold of the highest F1 on these (validation) solutions, among `candidate_taus`; ties go to the lowest
  tau. Every prediction changes only at a distinct score, so no other threshold can do better."""
  _check(labels, scores)
  best = None
  for tau in candidate_taus(scores):
    s = score(labels, scores, tau)
    f1 = -1.0 if math.isnan(s.f1) else s.f1
    if best is None or f1 > best[0]:
      best = (f1, s)
  return best[1]


def evaluate(val_labels: Sequence, val_scores: Sequence, test_labels: Sequence, test_scores: Sequence) -> dict:
  """tau chosen on validation (`choose_tau`), then ProcessBench's numbers on test at that tau: {'tau', 'val_f1',
  'error_acc', 'correct_acc', 'f1', 'n_error', 'n_correct'} (test numbers), JSON-ready (NaN stays NaN)."""
  chosen = choose_tau(val_labels, val_scores)
  test = score(test_labels, test_scores, chosen.tau)
  return {**test.to_json(), "val_f1": chosen.f1}
