"""PR-AUC and ROC-AUC held to scikit-learn on random inputs, ties and NaN labels included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, roc_auc_score

from reprobe_jax.errors import ConfigError
from reprobe_jax.eval.metrics import pr_auc, pr_curve, roc_auc


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 300), st.integers(0, 10_000), st.booleans(), st.floats(0.05, 0.95))
def test_matches_sklearn(n, seed, ties, rate):
  rng = np.random.default_rng(seed)
  y = (rng.random(n) < rate).astype(float)
  s = rng.integers(0, 5, n).astype(float) if ties else rng.random(n)
  if 0 < y.sum() < n:
    assert pr_auc(y, s) == pytest.approx(average_precision_score(y, s), abs=1e-12)
    assert roc_auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_nan_labels_are_skipped():
  rng = np.random.default_rng(0)
  y = (rng.random(100) < 0.3).astype(float)
  s = rng.random(100)
  y_nan = y.copy()
  y_nan[::7] = np.nan
  keep = ~np.isnan(y_nan)
  assert pr_auc(y_nan, s) == pytest.approx(average_precision_score(y[keep], s[keep]))
  assert roc_auc(y_nan, s) == pytest.approx(roc_auc_score(y[keep], s[keep]))


def test_worked_example_and_edges():
  # scores 0.9 (pos), 0.8 (neg), 0.7 (pos), 0.1 (neg): AP = 0.5 * 1 + 0.5 * 2/3
  assert pr_auc([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1]) == pytest.approx(0.5 + 1 / 3)
  assert roc_auc([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1]) == pytest.approx(0.75)
  assert np.isnan(pr_auc([0, 0], [0.1, 0.2])) and np.isnan(roc_auc([1, 1], [0.1, 0.2]))
  recall, precision = pr_curve([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1])
  assert recall[0] == 0 and recall[-1] == 1 and precision[1] == 1
  with pytest.raises(ConfigError, match="differ in length"):
    pr_auc([1, 0], [0.5])
  with pytest.raises(ConfigError, match="NaN"):
    pr_auc([1, 0], [np.nan, 0.2])
  with pytest.raises(ConfigError, match="labels must be"):
    roc_auc([2, 0], [0.1, 0.2])


def test_bootstrap_weights_equal_sklearn_on_the_repeated_sample():
  """One sort serves every resample: integer weights give exactly sklearn's AP of the sample with repeats."""
  from reprobe_jax.eval.metrics import _weighted_ap

  rng = np.random.default_rng(0)
  y = (rng.random(80) < 0.3).astype(float)
  s = np.round(rng.random(80), 1)  # many ties
  w = rng.integers(0, 4, size=(6, 80)).astype(float)
  got = _weighted_ap(y, s, w)
  for b in range(6):
    idx = np.repeat(np.arange(80), w[b].astype(int))
    np.testing.assert_allclose(got[b], average_precision_score(y[idx], s[idx]), rtol=1e-12)


def test_bootstrap_interval_covers_the_estimate_and_narrows_with_data():
  from reprobe_jax.eval.metrics import bootstrap_pr_auc

  rng = np.random.default_rng(1)

  def draw(n):
    y = (rng.random(n) < 0.3).astype(float)
    return y, y * 0.8 + rng.random(n), np.arange(n) // 4  # 4 steps per problem

  y, s, g = draw(200)
  lo, hi = bootstrap_pr_auc(y, s, g, samples=400)
  assert lo < pr_auc(y, s) < hi
  y2, s2, g2 = draw(3000)
  lo2, hi2 = bootstrap_pr_auc(y2, s2, g2, samples=400)
  assert hi2 - lo2 < 0.6 * (hi - lo)
  assert bootstrap_pr_auc(y, s, g, samples=400) == (lo, hi)  # seeded


def test_bootstrap_resamples_groups_not_steps():
  """Steps of one problem move together: a problem-level effect widens the interval against step resampling."""
  from reprobe_jax.eval.metrics import bootstrap_pr_auc

  rng = np.random.default_rng(2)
  g = np.repeat(np.arange(40), 10)
  y = np.repeat((rng.random(40) < 0.4).astype(float), 10)  # whole problems right or wrong
  s = y * 0.3 + np.repeat(rng.random(40), 10)
  lo_g, hi_g = bootstrap_pr_auc(y, s, g, samples=400)
  lo_s, hi_s = bootstrap_pr_auc(y, s, np.arange(400), samples=400)
  assert hi_g - lo_g > 1.5 * (hi_s - lo_s)


def test_bootstrap_refuses_bad_arguments():
  from reprobe_jax.eval.metrics import bootstrap_pr_auc

  with pytest.raises(ConfigError, match="groups"):
    bootstrap_pr_auc([0, 1], [0.1, 0.2], [0])
  with pytest.raises(ConfigError, match="level"):
    bootstrap_pr_auc([0, 1], [0.1, 0.2], [0, 1], level=1.5)
