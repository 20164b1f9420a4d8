"""The step-scorer interface: the probe scorer batched vs one row at a time, newest-step scoring, use inside a
jitted loop, one compile per configuration and shape, and the registry."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from reprobe_jax.errors import ConfigError
from reprobe_jax.features import FeatureSpec
from reprobe_jax.probe import Probe, ProbeBundle, ProbeConfig, save_probe
from reprobe_jax.scorers import (
  SCORERS,
  ProbeScorer,
  ScoreInputs,
  get_scorer,
  pad_rows,
  register_scorer,
  score,
  score_newest,
  score_rows,
)

F = 6
CFG = ProbeConfig(feature_dim=F, d_model=16, n_layers=2, n_heads=2, ff_dim=32)


def _scorer(seed=0) -> ProbeScorer:
  _, params = nnx.split(Probe(CFG, rngs=nnx.Rngs(seed)))
  return get_scorer("probe", bundle=ProbeBundle.create(CFG, params, FeatureSpec(), "fp0"))


def _rows(lengths, seed=0):
  """Rows of the given lengths, each split into 1..4 steps (the first may start after token 0)."""
  rng = np.random.default_rng(seed)
  rows, spans = [], []
  for t in lengths:
    k = int(rng.integers(1, min(t, 4) + 1))
    cut = np.sort(rng.choice(np.arange(1, t), k - 1, replace=False)) if k > 1 else np.zeros(0, int)
    b = np.r_[int(rng.integers(0, 2)), cut, t]
    rows.append({"features": rng.normal(size=(t, F)).astype(np.float32)})
    spans.append(np.stack([b[:-1], b[1:]], 1).astype(np.int32))
  return rows, spans


def test_probe_scorer_batched_equals_one_row_at_a_time():
  rows, spans = _rows([3, 40, 17, 9, 64], seed=1)
  scorer = _scorer()
  batched = score_rows(scorer, rows, spans, batch_size=8)  # T bucket 64, every row padded to it
  for row, sp, b in zip(rows, spans, batched):
    alone = score_rows(scorer, [row], [sp], batch_size=1)[0]  # T bucket 16 or 64, no other rows
    assert alone.shape == (len(sp),)
    np.testing.assert_allclose(b, alone, atol=2e-6)
    empty = sp[:, 1] <= sp[:, 0]
    assert np.all(np.isnan(b[empty])) and np.all((b[~empty] > 0) & (b[~empty] < 1))


def test_probe_scorer_newest_step_equals_the_last_column():
  rows, spans = _rows([12, 30, 7, 25], seed=2)
  inputs, padded = pad_rows(rows, spans)
  n_steps = np.array([len(s) for s in spans])
  assert len(set(n_steps)) > 1
  scorer = _scorer()
  full = np.asarray(score(scorer, inputs, jnp.asarray(padded)))
  newest = np.asarray(score_newest(scorer, inputs, jnp.asarray(padded[np.arange(4), n_steps - 1])))
  np.testing.assert_allclose(newest, full[np.arange(4), n_steps - 1], atol=2e-6)
  assert np.all(np.isnan(full[np.arange(full.shape[1])[None] >= n_steps[:, None]]))  # padding steps are NaN


def test_scorer_runs_inside_a_jitted_while_loop():
  """The search-loop pattern: the scorer is an argument of the outer jit; its pure `score_newest` runs per step."""
  rows, spans = _rows([20, 20, 20], seed=3)
  inputs, padded = pad_rows(rows, spans)
  scorer = _scorer()

  @jax.jit
  def newest_each_round(scorer, inputs, spans):  # round k scores step k of every row
    def body(carry):
      k, out = carry
      return k + 1, out.at[:, k].set(scorer.score_newest(inputs, spans[:, k]))

    _, out = jax.lax.while_loop(lambda c: c[0] < spans.shape[1], body, (0, jnp.zeros(spans.shape[:2], jnp.float32)))
    return out

  looped = np.asarray(newest_each_round(scorer, inputs, jnp.asarray(padded)))
  np.testing.assert_allclose(looped, np.asarray(score(scorer, inputs, jnp.asarray(padded))), atol=2e-6)


def test_one_compile_per_configuration_and_shape(tmp_path):
  rows, spans = _rows([10, 14], seed=4)
  inputs, padded = pad_rows(rows, spans)
  padded = jnp.asarray(padded)
  a, b = _scorer(0), _scorer(1)
  first = score(a, inputs, padded)
  size = score._cache_size()
  save_probe(b.bundle, str(tmp_path / "b"))
  loaded = get_scorer("probe", path=str(tmp_path / "b"), model_fingerprint="fp0")  # other params, same config
  np.testing.assert_array_equal(np.asarray(score(loaded, inputs, padded)), np.asarray(score(b, inputs, padded)))
  assert score._cache_size() == size
  assert not np.allclose(np.asarray(first), np.asarray(score(b, inputs, padded)))
  for seed in (0, 1):  # the random baseline's key is traced: a new seed compiles nothing either
    score(get_scorer("random", seed=seed), inputs, padded)
  assert score._cache_size() == size + 1


def test_probe_scorer_checks_its_features():
  scorer = _scorer()
  spans = jnp.asarray([[[0, 2]]], jnp.int32)
  with pytest.raises(ConfigError, match="ScoreInputs.features"):
    score(scorer, ScoreInputs(token_mask=jnp.ones((1, 4), bool), logprobs=jnp.zeros((1, 4))), spans)
  with pytest.raises(ConfigError, match="has 5 dims, the probe expects 6"):
    score(scorer, ScoreInputs(token_mask=jnp.ones((1, 4), bool), features=jnp.zeros((1, 4, 5))), spans)


def test_registry():
  assert {"maxprob", "perplexity", "max_entropy", "mean_entropy", "self_certainty", "random", "probe"} <= set(SCORERS)
  assert get_scorer("maxprob").name == "maxprob" and _scorer().name == "probe"
  with pytest.raises(ConfigError, match="unknown step scorer 'oracle'"):
    get_scorer("oracle")
  with pytest.raises(ConfigError, match="already registered"):
    register_scorer("maxprob", lambda: None)
  with pytest.raises(ConfigError, match="exactly one of bundle= or path="):
    get_scorer("probe")


def test_pad_rows_names_the_row_that_does_not_fit():
  from reprobe_jax.errors import DataFormatError

  good = {"logprobs": np.zeros(4), "entropy": np.zeros(4)}
  inputs, spans = pad_rows([good], [np.array([[0, 4]])], batch_size=2)
  assert inputs.logprobs.shape == (2, 16) and spans.shape == (2, 4, 2) and inputs.token_mask.sum() == 4
  cases = [
    ([good, {"logprobs": np.zeros(4)}], [np.array([[0, 4]])] * 2, "row 1 has fields"),
    ([{"logprobs": np.zeros(4), "entropy": np.zeros(3)}], [np.array([[0, 3]])], "row 0: entropy has 3 tokens"),
    ([good], [np.array([[2, 5]])], r"row 0: a step span leaves the row's 4 tokens"),
    ([good], [], "one spans array per row"),
    ([{"logits": np.zeros(4)}], [np.array([[0, 1]])], "expected some of"),
  ]
  for rows, spans, match in cases:
    with pytest.raises(DataFormatError, match=match):
      pad_rows(rows, spans)
