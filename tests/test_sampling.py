"""The jitted sampler: no recompiles in a bucket, features equal to the full forward, stops, filters, branching."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reprobe_jax.errors import CacheFullError
from reprobe_jax.models import CaptureSpec, SamplingParams, load_pretrained
from reprobe_jax.models.sampling import argmax_first, extend, sample_token

CAPTURE = CaptureSpec(hidden_layers=(0, -1), attn_window=5, top_k_probs=4, token_stats=True)


@pytest.fixture(scope="module")
def lm(tiny_llama_dir):
  return load_pretrained(tiny_llama_dir)


def test_second_generate_in_same_bucket_compiles_nothing(lm, compile_counter):
  _COUNTER = compile_counter
  rng = np.random.RandomState(0)
  kwargs = dict(max_new_tokens=12, stop_strings=(".\n",), capture=CAPTURE)
  first = _COUNTER.count
  lm.generate(
    [rng.randint(3, 90, 9).tolist(), rng.randint(3, 90, 5).tolist()], SamplingParams(1.0, 20, 0.9), seed=0, **kwargs
  )
  before = _COUNTER.count
  assert before > first, "the counter saw no compilation of the first call"
  # New prompts (same 16-token bucket, same batch bucket), new seed, temperature, top_p and max_new_tokens.
  g = lm.generate(
    [rng.randint(3, 90, 13).tolist(), rng.randint(3, 90, 3).tolist()],
    SamplingParams(0.7, 20, 0.5),
    seed=1,
    **{**kwargs, "max_new_tokens": 10},
  )
  assert _COUNTER.count == before, f"{_COUNTER.count - before} compilations on a same-bucket call"
  assert g.tokens.shape == (2, 10)
  # A different stop-string set is a traced mask too.
  lm.generate(
    [rng.randint(3, 90, 7).tolist()] * 2, SamplingParams(0.7, 20, 0.5), seed=2, **{**kwargs, "stop_strings": ("\n\n",)}
  )
  assert _COUNTER.count == before


def test_generated_features_equal_full_forward(lm):
  """Token i's features come from the state that predicted it: position prompt_len - 1 + i of the full sequence."""
  prompts = [[1, 10, 11, 12, 13, 14, 15], [1, 20, 21, 22]]
  g = lm.generate(prompts, SamplingParams(1.0), max_new_tokens=9, seed=3, n=2, capture=CAPTURE)
  assert g.tokens.shape == (4, 9) and list(g.prompt_index) == [0, 0, 1, 1]
  for row in range(4):
    prompt = prompts[g.prompt_index[row]]
    n = int(g.lengths[row])
    seq = np.asarray(prompt + g.token_ids(row))[None]
    ref = lm.forward(seq, capture=CAPTURE)
    at = slice(len(prompt) - 1, len(prompt) - 1 + n)
    L = lm.config.num_layers
    np.testing.assert_allclose(g.features["hidden_0"][row, :n], np.asarray(ref.hidden_states[0])[0, at], atol=1e-5)
    np.testing.assert_allclose(g.features[f"hidden_{L}"][row, :n], np.asarray(ref.hidden_states[L])[0, at], atol=1e-4)
    np.testing.assert_allclose(g.features["attn_window"][row, :n], np.asarray(ref.attn_window)[0, at], atol=1e-5)
    np.testing.assert_allclose(g.features["top_probs"][row, :n], np.asarray(ref.top_probs)[0, at], atol=1e-5)
    np.testing.assert_allclose(
      g.features["token_self_certainty"][row, :n], np.asarray(ref.token_self_certainty)[0, at], atol=1e-4
    )
    np.testing.assert_allclose(g.features["token_entropy"][row, :n], np.asarray(ref.token_entropy)[0, at], atol=1e-4)
    # Log-prob of each sampled token = the full forward's log p(next token).
    np.testing.assert_allclose(g.logprobs[row, :n], np.asarray(ref.token_logprobs)[0, at], atol=1e-4)
    assert np.all(g.features["top_probs"][row, n:] == 0) and np.all(g.logprobs[row, n:] == 0)


def test_stop_strings_and_eos(lm):
  mask = lm.stop_token_mask([".\n"])
  assert set(np.flatnonzero(mask)) == {
    lm.tokenizer.convert_tokens_to_ids(".\n"),
    lm.tokenizer.convert_tokens_to_ids("a.\n"),
  }
  g = lm.generate([[1, 5, 6]], SamplingParams(2.0), max_new_tokens=40, n=16, seed=0, stop_strings=(".\n",))
  stops = set(np.flatnonzero(mask))
  seen = set()
  for row in range(16):
    toks = g.token_ids(row)
    seen.add(g.finish_reason[row])
    assert not stops.intersection(toks[:-1]) and 2 not in toks[:-1], "generation ran past a stop"
    if g.finish_reason[row] == "stop":
      assert toks[-1] in stops
    elif g.finish_reason[row] == "eos":
      assert toks[-1] == 2
    else:
      assert len(toks) == 40
    assert np.all(g.tokens[row, len(toks) :] == lm.pad_id())
  assert "stop" in seen  # at T=2 over 16 x 40 draws a stop token shows up


def test_sample_token_filters():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 4000))
  keys = jax.random.key(0)
  k2 = sample_token(logits, keys, 1.0, 1.0, greedy=False, top_k=2)
  assert set(np.unique(k2)) == {0, 1}
  np.testing.assert_allclose(np.mean(np.asarray(k2) == 0), 0.5 / 0.8, atol=0.03)
  p = sample_token(logits, keys, 1.0, 0.7, greedy=False, top_k=0)  # HF TopP keeps {0, 1}: 0.5 < 0.7 <= 0.8
  assert set(np.unique(p)) == {0, 1}
  full = sample_token(logits, keys, 1.0, 1.0, greedy=False, top_k=0)
  np.testing.assert_allclose(np.bincount(np.asarray(full), minlength=4) / 4000, [0.5, 0.3, 0.15, 0.05], atol=0.03)
  cold = sample_token(logits, keys, 0.05, 1.0, greedy=False, top_k=0)
  assert np.mean(np.asarray(cold) == 0) > 0.99
  assert np.all(np.asarray(sample_token(logits, keys, 0.0, 1.0, greedy=True, top_k=0)) == 0)


def test_seeds_and_greedy_branches(lm):
  prompts = [[1, 30, 31, 32]]
  a = lm.generate(prompts, SamplingParams(1.0), max_new_tokens=16, seed=5, n=3)
  b = lm.generate(prompts, SamplingParams(1.0), max_new_tokens=16, seed=5, n=3)
  c = lm.generate(prompts, SamplingParams(1.0), max_new_tokens=16, seed=6, n=3)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert not np.array_equal(a.tokens, c.tokens)
  assert len({tuple(a.token_ids(r)) for r in range(3)}) > 1  # the n samples of one prompt differ
  g = lm.generate(prompts, SamplingParams(0.0), max_new_tokens=16, n=2)
  np.testing.assert_array_equal(g.tokens[0], g.tokens[1])
  one = lm.generate(prompts, SamplingParams(1.0, top_k=1), max_new_tokens=16, seed=9)
  np.testing.assert_array_equal(one.tokens[0], g.tokens[0])


def test_branching_a_prefilled_cache(lm):
  """A prefix prefilled once and branched with `take` continues exactly like a fresh prefill of each row."""
  prefix = np.array([[1, 40, 41, 42, 43]])
  cache = lm.new_cache(1, 16)
  _, _, cache = lm.extend(cache, prefix)
  branched = cache.take(jnp.array([0, 0, 0]))
  steps = np.array([[50, 51], [60, 61], [70, 71]])
  logits, _, _ = lm.extend(branched, steps)
  for r in range(3):
    full = lm.forward(np.concatenate([prefix[0], steps[r]])[None]).logits
    np.testing.assert_allclose(np.asarray(logits)[r], np.asarray(full)[0, -2:], atol=1e-4)
  with pytest.raises(CacheFullError, match="cannot append"):
    lm.extend(lm.new_cache(1, 4), prefix)


def test_argmax_first_is_jnp_argmax_with_ties_infs_and_nans():
  nan, inf = float("nan"), float("inf")
  logits = jnp.array(
    [
      [1.0, 3.0, 3.0, 2.0],  # tie: the first of the two 3s, index 1
      [-inf, -inf, -inf, -inf],  # all -inf: every entry is the max, index 0
      [0.0, nan, 5.0, nan],  # a NaN wins (numpy/jnp argmax), the first one: index 1
      [-2.0, -1.0, inf, inf],
    ]
  )  # the first +inf: index 2
  got = np.asarray(argmax_first(logits))
  np.testing.assert_array_equal(got, [1, 0, 1, 2])
  np.testing.assert_array_equal(got, np.asarray(jnp.argmax(logits, axis=-1)))
  rand = jax.random.normal(jax.random.key(0), (8, 1000)).round(1)  # rounded: many ties
  np.testing.assert_array_equal(np.asarray(argmax_first(rand)), np.asarray(jnp.argmax(rand, axis=-1)))
  assert argmax_first(rand).dtype == jnp.int32


def test_last_only_logits_are_the_last_position_of_all_logits(lm):
  """The prefill's last-position-only vocabulary projection gives the full extend's last logits and state."""
  ids = jnp.asarray(np.random.RandomState(3).randint(3, 90, (2, 7)), jnp.int32)
  mask = jnp.asarray([[0, 0, 1, 1, 1, 1, 1], [1] * 7], jnp.int32)  # left padding in row 0
  spec = CaptureSpec(hidden_layers=(-1,))
  full, cap_full, c_full = extend(
    lm.static_graph, lm.params, lm.new_cache(2, 16), ids, mask, capture=spec, lockstep=True
  )
  last, cap_last, c_last = extend(
    lm.static_graph, lm.params, lm.new_cache(2, 16), ids, mask, capture=spec, lockstep=True, last_only=True
  )
  assert last.shape == (2, 1, full.shape[-1])
  np.testing.assert_allclose(np.asarray(last[:, 0]), np.asarray(full[:, -1]), rtol=1e-6, atol=1e-6)
  layer = max(cap_full["hidden_states"])
  np.testing.assert_allclose(
    np.asarray(cap_last["hidden_states"][layer][:, -1]),
    np.asarray(cap_full["hidden_states"][layer][:, -1]),
    rtol=1e-6,
    atol=1e-6,
  )
  np.testing.assert_array_equal(np.asarray(c_last.k[0]), np.asarray(c_full.k[0]))
