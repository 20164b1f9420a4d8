"""Uncertainty baselines (docs/method.md §A6): a worked example, and the vectorised scorers against a per-step loop."""

import jax.numpy as jnp
import numpy as np
import pytest

from reprobe_jax.eval.baselines import BASELINES, step_scores
from reprobe_jax.errors import ConfigError
from reprobe_jax.scorers import ScoreInputs, UncertaintyScorer, get_scorer, pad_rows, score, score_newest, score_rows


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
  with pytest.raises(ConfigError, match="unknown baseline"):
    step_scores("oracle", logp, ent, sc, spans)


def _loop_reference(name, logprobs, entropy, self_certainty, spans):
  """The per-step loop the vectorised scorers replace (float64, one step at a time)."""
  out = np.full(len(spans), np.nan)
  for k, (a, b) in enumerate(spans):
    if b > a:
      out[k] = {
        "maxprob": lambda: -np.sum(logprobs[a:b]),
        "perplexity": lambda: -np.mean(logprobs[a:b]),
        "max_entropy": lambda: np.max(entropy[a:b]),
        "mean_entropy": lambda: np.mean(entropy[a:b]),
        "self_certainty": lambda: -np.mean(self_certainty[a:b]),
      }[name]()
  return out


def _random_rows(n, seed):
  """Rows of 1..40 tokens split into 1..6 contiguous steps, some of them empty."""
  rng = np.random.default_rng(seed)
  rows, spans = [], []
  for _ in range(n):
    t = int(rng.integers(1, 41))
    cuts = np.sort(rng.integers(0, t + 1, int(rng.integers(0, 6))))
    bounds = np.r_[0, cuts, t]
    spans.append(np.stack([bounds[:-1], bounds[1:]], 1).astype(np.int32))
    rows.append(
      {
        "logprobs": np.log(rng.uniform(0.01, 1.0, t)),
        "entropy": rng.uniform(0, 3, t),
        "self_certainty": rng.uniform(0, 5, t),
      }
    )
  return rows, spans


def test_vectorised_baselines_equal_the_per_step_loop():
  rows, spans = _random_rows(23, 0)
  assert any(np.any(s[:, 1] == s[:, 0]) for s in spans)  # empty steps are in the data
  for name in BASELINES[:-1]:
    got = score_rows(get_scorer(name), rows, spans, batch_size=8)
    for row, sp, g in zip(rows, spans, got):
      ref = _loop_reference(name, row["logprobs"], row["entropy"], row["self_certainty"], sp)
      np.testing.assert_allclose(g, ref, rtol=2e-6, atol=1e-5)  # float32 on device vs float64
      one = step_scores(name, row["logprobs"], row["entropy"], row["self_certainty"], sp)
      np.testing.assert_allclose(one, g, rtol=1e-6, atol=1e-6)


def test_newest_step_equals_the_last_column_of_the_full_score():
  rows, spans = _random_rows(6, 1)
  inputs, padded = pad_rows(rows, spans)
  n_steps = np.array([len(s) for s in spans])
  assert len(set(n_steps)) > 1  # rows differ in their number of steps
  newest = padded[np.arange(len(rows)), n_steps - 1]  # [B, 2]
  for name in BASELINES:
    scorer = get_scorer(name, seed=3)
    full = np.asarray(score(scorer, inputs, jnp.asarray(padded)))
    last = np.asarray(score_newest(scorer, inputs, jnp.asarray(newest)))
    np.testing.assert_array_equal(last, full[np.arange(len(rows)), n_steps - 1])


def test_random_baseline_is_uniform_keyed_and_nan_on_empty_steps():
  rows, spans = _random_rows(40, 2)
  inputs, padded = pad_rows(rows, spans)
  a = np.asarray(score(get_scorer("random", seed=0), inputs, jnp.asarray(padded)))
  b = np.asarray(score(get_scorer("random", seed=0), inputs, jnp.asarray(padded)))
  c = np.asarray(score(get_scorer("random", seed=1), inputs, jnp.asarray(padded)))
  real = padded[..., 1] > padded[..., 0]
  np.testing.assert_array_equal(a, b)
  assert np.all(np.isnan(a[~real])) and np.all((a[real] >= 0) & (a[real] < 1))
  assert len(np.unique(a[real])) == real.sum()  # no ties, also between rows with equal spans
  assert not np.allclose(a[real], c[real])
  assert 0.4 < a[real].mean() < 0.6


def test_step_scores_random_keeps_the_numpy_stream():
  spans = [(0, 2), (2, 2), (2, 5)]
  got = step_scores("random", np.zeros(5), np.zeros(5), np.zeros(5), spans, np.random.default_rng(7))
  ref = np.random.default_rng(7)
  np.testing.assert_array_equal(got[[0, 2]], [ref.random(), ref.random()])
  assert np.isnan(got[1])


def test_a_baseline_without_its_input_names_the_field():
  inputs = ScoreInputs(token_mask=jnp.ones((1, 4), bool), logprobs=jnp.zeros((1, 4)))
  spans = jnp.asarray([[[0, 2]]], jnp.int32)
  assert np.isfinite(np.asarray(score(get_scorer("maxprob"), inputs, spans))).all()
  with pytest.raises(ConfigError, match="ScoreInputs.entropy"):
    score(get_scorer("max_entropy"), inputs, spans)
  with pytest.raises(ConfigError, match="unknown baseline"):
    UncertaintyScorer.create("oracle")
  with pytest.raises(ConfigError, match=r"spans must be \[B, S, 2\]"):
    score(get_scorer("maxprob"), inputs, jnp.zeros((1, 2), jnp.int32))
