"""sequence_logprobs: held to log_softmax of the full forward's logits, to its gradients, and to token_logprobs."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reprobe_jax.models import CaptureSpec, LanguageModel, ModelConfig
from reprobe_jax.models.forward import positions_from_mask, run_decoder
from reprobe_jax.models.logprob import masked_mean_nll, sequence_logprobs

LENGTHS = (9, 4, 12, 1)
T = 12
_fast = jax.jit(sequence_logprobs, static_argnames="graphdef")  # one compile shared by the tests


@pytest.fixture(scope="module")
def lm():
  cfg = ModelConfig(
    family="llama",
    vocab_size=61,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
  )
  return LanguageModel.random(cfg, seed=3)


def _batch(side: str):
  """Rows of LENGTHS real tokens (the same ids whichever side is padded), padded to T with id 0."""
  rng = np.random.default_rng(0)
  rows = [rng.integers(1, 61, n) for n in LENGTHS]
  tokens = np.zeros((len(rows), T), np.int32)
  mask = np.zeros((len(rows), T), np.int32)
  for i, r in enumerate(rows):
    sl = slice(0, len(r)) if side == "right" else slice(T - len(r), T)
    tokens[i, sl], mask[i, sl] = r, 1
  return jnp.asarray(tokens), jnp.asarray(mask)


def _has_context(mask):
  """[B, T] bool: a real token with a real token before it, the positions that get a log-probability."""
  m = np.asarray(mask, bool)
  return np.concatenate([np.zeros_like(m[:, :1]), m[:, 1:] & m[:, :-1]], axis=1)


def _naive(graphdef, params, tokens, mask):
  """log_softmax over the whole [B, T, V] and a gather: the obvious form the fast one must equal."""
  logits, _, _ = run_decoder(
    graphdef, params, tokens, positions_from_mask(mask), mask.astype(bool), capture=CaptureSpec(), shard=None
  )
  lp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1], axis=-1), tokens[:, 1:, None], axis=-1)[..., 0]
  lp = jnp.concatenate([jnp.zeros_like(lp[:, :1]), lp], axis=1)
  m = mask.astype(bool)
  return jnp.where(jnp.concatenate([jnp.zeros_like(m[:, :1]), m[:, 1:] & m[:, :-1]], axis=1), lp, 0.0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_equals_log_softmax_of_forward_logits(lm, side):
  tokens, mask = _batch(side)
  fast = _fast(lm.static_graph, lm.params, tokens, mask)
  logits = np.asarray(lm.forward(tokens, mask).logits, np.float64)
  ref = np.zeros(tokens.shape)
  ctx = _has_context(mask)
  for b, t in zip(*np.nonzero(ctx)):
    z = logits[b, t - 1]
    ref[b, t] = z[tokens[b, t]] - (z.max() + np.log(np.exp(z - z.max()).sum()))
  assert fast.shape == tokens.shape and fast.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(fast), ref, atol=1e-5)
  assert np.all(np.asarray(fast)[~ctx] == 0.0)  # t = 0, padding, and a row's first real token
  assert np.all(np.asarray(fast)[ctx] < 0)


def test_left_and_right_padding_give_a_row_the_same_values(lm):
  (lt, lmask), (rt, rmask) = _batch("left"), _batch("right")
  left = np.asarray(_fast(lm.static_graph, lm.params, lt, lmask))
  right = np.asarray(_fast(lm.static_graph, lm.params, rt, rmask))
  for i, n in enumerate(LENGTHS):
    np.testing.assert_allclose(left[i, T - n :], right[i, :n], atol=1e-5)


def test_equals_forward_token_logprobs_shifted(lm):
  """ForwardOutput.token_logprobs[t] = log p(x_{t+1} | x_<=t) is this [t + 1] wherever both have context."""
  for side in ("left", "right"):
    tokens, mask = _batch(side)
    out = lm.forward(tokens, mask, capture=CaptureSpec(token_stats=True))
    fast = np.asarray(_fast(lm.static_graph, lm.params, tokens, mask))
    ctx = _has_context(mask)[:, 1:]
    np.testing.assert_allclose(fast[:, 1:][ctx], np.asarray(out.token_logprobs)[:, :-1][ctx], atol=1e-5)


@functools.partial(jax.jit, static_argnames=("fn", "graphdef"))
def _grad(fn, graphdef, params, tokens, mask, w):
  return jax.grad(lambda p: jnp.sum(w * fn(graphdef, p, tokens, mask)))(params)


@pytest.mark.parametrize("side", ["left", "right"])
def test_gradients_equal_the_naive_form(lm, side):
  tokens, mask = _batch(side)
  w = jnp.asarray(np.random.default_rng(1).random(tokens.shape), jnp.float32)
  fast = _grad(sequence_logprobs, lm.static_graph, lm.params, tokens, mask, w)
  naive = _grad(_naive, lm.static_graph, lm.params, tokens, mask, w)
  for a, b in zip(jax.tree.leaves(fast), jax.tree.leaves(naive)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
  assert max(float(jnp.abs(a).max()) for a in jax.tree.leaves(fast)) > 1e-3  # the gradient is not trivially zero


def test_explicit_positions_are_used(lm):
  tokens, mask = _batch("right")
  default = _fast(lm.static_graph, lm.params, tokens, mask)
  same = _fast(lm.static_graph, lm.params, tokens, mask, positions_from_mask(mask))
  np.testing.assert_array_equal(np.asarray(default), np.asarray(same))
  # RoPE sees only differences of positions: a shift changes nothing, a stretch changes the values.
  shifted = _fast(lm.static_graph, lm.params, tokens, mask, positions_from_mask(mask) + 5)
  stretched = _fast(lm.static_graph, lm.params, tokens, mask, positions_from_mask(mask) * 3)
  np.testing.assert_allclose(np.asarray(shifted), np.asarray(default), atol=1e-5)
  assert not np.allclose(np.asarray(stretched), np.asarray(default), atol=1e-4)


def test_masked_mean_nll_worked_example():
  lp = jnp.array([[0.0, -1.0, -2.0], [0.0, -3.0, -4.0]])
  w = jnp.array([[1.0, 1.0, 0.5], [0.0, 0.0, 1.0]])  # weight at t = 0 is ignored: nothing predicts token 0
  assert float(masked_mean_nll(lp, w)) == pytest.approx((1.0 + 0.5 * 2.0 + 4.0) / 2.5)
  assert float(masked_mean_nll(lp, jnp.zeros_like(w))) == 0.0
