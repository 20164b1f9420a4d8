"""Uncertainty baselines (METHOD A6) on a worked example."""

import numpy as np
import pytest

from reprobe_jax.baselines import BASELINES, step_scores


def test_worked_example():
  logp = np.log(np.array([0.5, 0.25, 1.0, 0.1, 0.2]))
  ent = np.array([0.1, 0.7, 0.0, 1.5, 0.3])
  sc = np.array([2.0, 1.0, 3.0, 0.5, 1.5])
  spans = [(0, 2), (2, 5), (5, 5)]
  assert step_scores("maxprob", logp, ent, sc, spans)[:2] == pytest.approx([np.log(8), np.log(50)])
  assert step_scores("perplexity", logp, ent, sc, spans)[:2] == pytest.approx([np.log(8) / 2, np.log(50) / 3])
  assert step_scores("max_entropy", logp, ent, sc, spans)[:2] == pytest.approx([0.7, 1.5])
  assert step_scores("mean_entropy", logp, ent, sc, spans)[:2] == pytest.approx([0.4, 0.6])
  assert step_scores("self_certainty", logp, ent, sc, spans)[:2] == pytest.approx([-1.5, -5 / 3])
  for name in BASELINES:
    assert np.isnan(step_scores(name, logp, ent, sc, spans)[2])
  r = step_scores("random", logp, ent, sc, spans, np.random.default_rng(1))
  assert 0 <= r[0] <= 1 and r[0] != r[1]
  with pytest.raises(ValueError, match="unknown baseline"):
    step_scores("oracle", logp, ent, sc, spans)
