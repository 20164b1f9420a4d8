"""Step-level uncertainty baselines (docs/method.md §A6) for one trajectory on the host: higher score = more likely
wrong.

A thin wrapper over the vectorised scorers of `reprobe_jax.scorers.uncertainty` (masked reductions on device);
score many trajectories at once with `reprobe_jax.scorers.score_rows` instead.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from reprobe_jax.errors import ConfigError
from reprobe_jax.scorers.batching import score_rows
from reprobe_jax.scorers.uncertainty import BASELINES, UncertaintyScorer

__all__ = ["BASELINES", "step_scores"]


def step_scores(
  name: str, logprobs, entropy, self_certainty, spans: Sequence[tuple[int, int]], rng: np.random.Generator | None = None
) -> np.ndarray:
  """Scores [S] of one trajectory's steps; spans index the per-token arrays [T] (next-token aligned: entry j is
  about token j). Empty spans get NaN.

  maxprob: -sum log p(token); perplexity: -mean log p; max_entropy / mean_entropy over the step's tokens;
  self_certainty: -mean KL(U || p) (Kang et al., 2025; negated so higher = less sure); random: U(0, 1), one draw
  from `rng` (default: seed 0) per non-empty step in order, so host-side reports keep their numpy stream.
  """
  if name not in BASELINES:
    raise ConfigError(f"unknown baseline {name!r}; known: {BASELINES}")
  spans = np.asarray(spans, np.int32).reshape(-1, 2)
  if name == "random":
    out = np.full(len(spans), np.nan)
    nonempty = spans[:, 1] > spans[:, 0]
    out[nonempty] = (rng or np.random.default_rng(0)).random(int(nonempty.sum()))
    return out
  row = {
    "logprobs": np.asarray(logprobs, np.float32),
    "entropy": np.asarray(entropy, np.float32),
    "self_certainty": np.asarray(self_certainty, np.float32),
  }
  return score_rows(UncertaintyScorer.create(name), [row], [spans], batch_size=1)[0].astype(np.float64)
