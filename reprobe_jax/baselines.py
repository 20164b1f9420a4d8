"""Step-level uncertainty baselines (METHOD A6): higher score = more likely wrong.

Each reads per-token statistics that the sampler or a captured forward already holds (log-probability of the
token, entropy and self-certainty of the distribution that produced it), aggregated over a step's token span.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

BASELINES = ("maxprob", "perplexity", "max_entropy", "mean_entropy", "self_certainty", "random")


def step_scores(name: str, logprobs, entropy, self_certainty, spans: Sequence[tuple[int, int]],
                rng: np.random.Generator | None = None) -> np.ndarray:
  """Scores [S] of one trajectory's steps; spans index the per-token arrays [T] (next-token aligned: entry j is
  about token j). Empty spans get NaN.

  maxprob: -sum log p(token); perplexity: -mean log p; max_entropy / mean_entropy over the step's tokens;
  self_certainty: -mean KL(U || p) (Kang et al., 2025; negated so higher = less sure); random: U(0, 1).
  """
  out = np.full(len(spans), np.nan)
  for k, (a, b) in enumerate(spans):
    if b <= a:
      continue
    if name == "maxprob":
      out[k] = -np.sum(logprobs[a:b])
    elif name == "perplexity":
      out[k] = -np.mean(logprobs[a:b])
    elif name == "max_entropy":
      out[k] = np.max(entropy[a:b])
    elif name == "mean_entropy":
      out[k] = np.mean(entropy[a:b])
    elif name == "self_certainty":
      out[k] = -np.mean(self_certainty[a:b])
    elif name == "random":
      out[k] = (rng or np.random.default_rng(0)).random()
    else:
      raise ValueError(f"unknown baseline {name!r}; known: {BASELINES}")
  return out
