"""What every test-time-scaling strategy returns per prompt: its finished candidates with their step scores."""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxtyping import Float64


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
    if len(self.steps) != len(self.step_scores):
      raise ValueError(f"Candidate: {len(self.steps)} steps but {len(self.step_scores)} step scores")

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
