"""The probe module of METHOD A4: size, batched scoring, masking."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from reprobe_jax.probe import Probe, ProbeConfig, count_params, score_steps


def test_paper_probe_has_fewer_than_10m_parameters():
  probe = nnx.eval_shape(lambda: Probe(ProbeConfig(feature_dim=4096), rngs=nnx.Rngs(0)))
  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(probe, nnx.Param)))
  # Linear(4096,1024)+LN+Linear(1024,512)+LN, marker (2,512), 1 post-LN layer (attn 4x512^2, FFN 2x512x2048),
  # classifier Linear(512,512)+LN+Linear(512,1): about 8.1M.
  expected = (4096 * 1024 + 1024 + 2 * 1024 + 1024 * 512 + 512 + 2 * 512 + 2 * 512
              + 4 * (512 * 512 + 512) + 2 * 512 + 512 * 2048 + 2048 + 2048 * 512 + 512 + 2 * 512
              + 512 * 512 + 512 + 2 * 512 + 512 + 1)
  assert n == expected
  assert n < 10_000_000


def _setup(seed=0):
  cfg = ProbeConfig(feature_dim=12, d_model=32, n_layers=2, n_heads=4, ff_dim=64, dropout=0.1)
  probe = Probe(cfg, rngs=nnx.Rngs(seed))
  graphdef, params = nnx.split(probe)
  rng = np.random.RandomState(seed)
  feats = jnp.asarray(rng.randn(2, 20, 12), jnp.float32)
  mask = jnp.asarray(np.arange(20)[None] < np.array([[20], [15]]))
  spans = jnp.asarray([[[1, 6], [6, 12], [12, 20]], [[1, 5], [5, 15], [0, 0]]], jnp.int32)
  return probe, graphdef, params, feats, mask, spans


def test_batched_scores_equal_one_step_at_a_time():
  _, graphdef, params, feats, mask, spans = _setup()
  all_steps = np.asarray(score_steps(graphdef, params, feats, mask, spans))
  for b in range(2):
    for s in range(2):
      one = score_steps(graphdef, params, feats[b:b + 1], mask[b:b + 1], spans[b:b + 1, s:s + 1])
      np.testing.assert_allclose(all_steps[b, s], np.asarray(one)[0, 0], atol=1e-5)
  assert np.all((all_steps > 0) & (all_steps < 1))


def test_a_step_does_not_see_what_follows_it_or_padding():
  _, graphdef, params, feats, mask, spans = _setup()
  base = np.asarray(score_steps(graphdef, params, feats, mask, spans))
  changed = feats.at[:, 12:].set(99.0)  # after the second step of row 0, and padding of row 1 past 15
  after = np.asarray(score_steps(graphdef, params, changed, mask, spans))
  np.testing.assert_allclose(after[0, :2], base[0, :2], atol=1e-5)
  assert not np.allclose(after[0, 2], base[0, 2])  # the third step contains those tokens
  padded = feats.at[1, 15:].set(-50.0)
  np.testing.assert_allclose(np.asarray(score_steps(graphdef, params, padded, mask, spans))[1, :2], base[1, :2],
                             atol=1e-5)


def test_dropout_only_in_training():
  probe, _, _, feats, mask, spans = _setup()
  a = probe(feats, mask, spans, deterministic=True)
  b = probe(feats, mask, spans, deterministic=True)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  c = probe(feats, mask, spans, deterministic=False)
  assert not np.allclose(np.asarray(a), np.asarray(c))
  assert count_params(probe) > 0
