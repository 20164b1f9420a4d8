"""What every test-time-scaling strategy returns per prompt: its finished candidates with their step scores.

Both records check themselves when made (ConfigError naming the record, the field and what was found), so a
candidate built by hand, or by a rescoring, cannot hold a step without a score or a span outside its response."""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np
from jaxtyping import Float64

from reprobe_jax.errors import ConfigError
from reprobe_jax.io.readers import shown

FINISH_REASONS = ("eos", "length", "cache_full", "max_steps", "answer")


def _count(v) -> bool:
  return isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 0


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One finished trajectory: its response token ids (EOS dropped), its steps as half-open token spans
  [start, end) into them, each step's score (higher = more likely incorrect; NaN = a step with no tokens), and why
  it ended ('eos', 'length', 'cache_full', 'max_steps', or 'answer': a step search's row that wrote its answer line)."""

  response_ids: tuple[int, ...]
  steps: tuple[tuple[int, int], ...]
  step_scores: tuple[float, ...]
  finish_reason: str

  def __post_init__(self):
    for name in ("response_ids", "steps", "step_scores"):
      if not isinstance(getattr(self, name), tuple):
        raise ConfigError(f"Candidate.{name}: expected a tuple, got {shown(getattr(self, name))}")
    if len(self.steps) != len(self.step_scores):
      raise ConfigError(
        f"Candidate: {len(self.steps)} steps but {len(self.step_scores)} step scores (Candidate.steps and "
        "Candidate.step_scores need one entry per step)"
      )
    bad = next((i for i, t in enumerate(self.response_ids) if not _count(t)), None)
    if bad is not None:
      raise ConfigError(f"Candidate.response_ids[{bad}]: expected a token id >= 0, got {shown(self.response_ids[bad])}")
    n = len(self.response_ids)
    for k, span in enumerate(self.steps):
      if not (isinstance(span, tuple) and len(span) == 2 and all(map(_count, span)) and span[0] <= span[1] <= n):
        raise ConfigError(
          f"Candidate.steps[{k}]: expected a span (start, end) with 0 <= start <= end <= {n}, got {span!r}"
        )
    for k, x in enumerate(self.step_scores):
      if isinstance(x, bool) or not isinstance(x, numbers.Real) or math.isinf(x):
        raise ConfigError(f"Candidate.step_scores[{k}]: expected a finite number or NaN (no tokens), got {shown(x)}")
    if self.finish_reason not in FINISH_REASONS:
      raise ConfigError(f"Candidate.finish_reason: expected one of {FINISH_REASONS}, got {self.finish_reason!r}")

  @property
  def scores(self) -> Float64[np.ndarray, " steps"]:
    return np.asarray(self.step_scores, np.float64)


@dataclasses.dataclass(frozen=True)
class PromptResult:
  """One prompt's search: its candidates (best_of_n: the N trajectories; beam: the B beams it kept, best first;
  dvts: the best trajectory of each of its B subtrees) and what the search cost it: every step it sampled
  (discarded candidates and lookahead steps included) and every token it generated."""

  candidates: tuple[Candidate, ...]
  sampled_steps: int
  generated_tokens: int

  def __post_init__(self):
    if not isinstance(self.candidates, tuple) or not all(isinstance(c, Candidate) for c in self.candidates):
      raise ConfigError(f"PromptResult.candidates: expected a tuple of Candidates, got {shown(self.candidates)}")
    for name in ("sampled_steps", "generated_tokens"):
      if not _count(getattr(self, name)):
        raise ConfigError(f"PromptResult.{name}: expected an int >= 0, got {shown(getattr(self, name))}")
