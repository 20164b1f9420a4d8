"""The open sampler (docs/decoding.md): decode to step boundaries and resume, forced text, take, shared-prefix rows,
forks at step boundaries, cache_full; every captured value held to a fresh full forward of the same tokens."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import require_cpu_kernels

from reprobe_jax.errors import ConfigError
from reprobe_jax.models import CaptureSpec, SamplingParams, load_pretrained
from reprobe_jax.models import decoding
import reprobe_jax.models.decode_state as decode_state
from reprobe_jax.models.capture import TokenFeatures
from reprobe_jax.models.decode_state import StopRule
from reprobe_jax.models.kv_cache import KVCache

CAPTURE = CaptureSpec(hidden_layers=(0, -1), attn_window=5, top_k_probs=4, token_stats=True)
PROMPTS = [[1, 10, 11, 12, 13, 14, 15], [1, 20, 21, 22], [1, 30, 31, 32, 33]]


@pytest.fixture(scope="module")
def lm(tiny_llama_dir):
  return load_pretrained(tiny_llama_dir)


def assert_matches_forward(lm, context, row, *, atol=1e-4):
  """A row read back from a decode state equals a full forward of context + its response (docs/method.md §A3 alignment:
  response token i's values come from position len(context) - 1 + i)."""
  n = len(row.tokens)
  ref = lm.forward(np.asarray(list(context) + row.tokens)[None], capture=CAPTURE)
  at = slice(len(context) - 1, len(context) - 1 + n)
  L = lm.config.num_layers
  np.testing.assert_allclose(row.logprobs, np.asarray(ref.token_logprobs)[0, at], atol=atol)
  np.testing.assert_allclose(row.features["hidden_0"], np.asarray(ref.hidden_states[0])[0, at], atol=1e-5)
  np.testing.assert_allclose(row.features[f"hidden_{L}"], np.asarray(ref.hidden_states[L])[0, at], atol=atol)
  np.testing.assert_allclose(row.features["attn_window"], np.asarray(ref.attn_window)[0, at], atol=1e-5)
  np.testing.assert_allclose(row.features["top_probs"], np.asarray(ref.top_probs)[0, at], atol=1e-5)
  np.testing.assert_allclose(row.features["token_entropy"], np.asarray(ref.token_entropy)[0, at], atol=atol)


def _stop_rule(lm):
  return StopRule.from_mask(lm.stop_token_mask([".\n", "\n\n"]))


def test_features_are_typed_and_hold_what_the_capture_asks_for(lm):
  """A decode state's features are a TokenFeatures: one field per captured value (None where the capture asks for
  none), shown to the feature files under the names `FeatureSpec.assemble` reads; a row read back keeps the type."""
  L = lm.config.num_layers
  smp = lm.sampler(SamplingParams(1.0), capture=CAPTURE)
  state = smp.decode(smp.prefill(PROMPTS[:1], max_new_tokens=4, seed=0))
  f = state.features
  assert isinstance(f, TokenFeatures) and isinstance(state.pending, TokenFeatures)
  b, n = state.tokens.shape
  assert sorted(f.hidden) == [0, L] and f.top_ids is None
  assert f.hidden[L].shape == (b, n, lm.config.hidden_size) and f.attn_window.shape[:3] == (b, n, L)
  assert f.top_probs.shape == (b, n, 4) and f.token_entropy.shape == f.token_self_certainty.shape == (b, n)
  assert sorted(f) == sorted(
    ["hidden_0", f"hidden_{L}", "attn_window", "top_probs", "token_entropy", "token_self_certainty"]
  )
  assert f["token_entropy"] is f.token_entropy and dict(f)[f"hidden_{L}"] is f.hidden[L]
  row = smp.read(state, [0])[0]
  assert isinstance(row.features, TokenFeatures) and row.features.token_entropy.shape == (len(row.tokens),)
  bare = lm.sampler(SamplingParams(1.0)).prefill(PROMPTS[:1], max_new_tokens=4)
  assert len(bare.features) == 0 and not bare.features.hidden  # CaptureSpec(): nothing captured


@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_decode_to_boundaries_resume_and_features_equal_forward(lm):
  """Rows pause at every step boundary while others go on (holes in the lockstep cache), then resume: tokens,
  log-probs and features still equal a fresh forward, and each newest-step span ends at a boundary token."""
  smp = lm.sampler(SamplingParams(2.0), capture=CAPTURE, stop=_stop_rule(lm))
  state = smp.prefill(PROMPTS, max_new_tokens=30, n=2, seed=4)
  stops = set(np.flatnonzero(lm.stop_token_mask([".\n", "\n\n"])))
  paused = 0
  for _ in range(12):
    state = smp.decode(state)
    for r, row in enumerate(smp.read(state)[:6]):
      if row.finish_reason == "stop":
        paused += 1
        assert row.tokens[-1] in stops
        start, end = np.asarray(decode_state.newest_step_spans(state))[r]
        assert end == len(row.tokens) and 0 <= start < end
        assert not stops.intersection(row.tokens[start : end - 1]), "a step ran past a boundary"
    if not np.any(np.asarray(state.finish)[:6] == decode_state.FINISH_STOP):
      break  # every row ended on EOS or its budget
    state = smp.resume(state)
  assert paused >= 3, "the test drew too few step boundaries to mean anything"
  for r, row in enumerate(smp.read(state)[:6]):
    assert_matches_forward(lm, PROMPTS[r // 2], row)
  assert all(r.finish_reason is not None for r in smp.read(state)[6:])  # batch padding rows start finished


def test_force_appends_text_with_teacher_forced_logprobs(lm):
  smp = lm.sampler(SamplingParams(1.0), capture=CAPTURE)
  state = smp.prefill(PROMPTS, max_new_tokens=12, seed=1, extra_slots=4)
  state = smp.decode(state, max_steps=3)
  forced = [[94, 95, 96], None, [97]] + [None]  # rows 1 and 3 (padding) get nothing
  state = smp.force(state, forced)
  rows = smp.read(state)
  assert rows[0].tokens[3:] == [94, 95, 96] and len(rows[1].tokens) == 3 and rows[2].tokens[3:] == [97]
  state = smp.decode(smp.resume(state))  # and sampling goes on after the forced text
  for r, row in enumerate(smp.read(state)[:3]):
    assert_matches_forward(lm, PROMPTS[r], row)


def test_shared_prefix_rows_equal_copied_rows(lm):
  """n rows reading their prompt's cache as a shared prefix give what n copies of the prompt's cache give."""
  smp = lm.sampler(SamplingParams(0.0), capture=CAPTURE)
  shared = smp.read(smp.decode(smp.prefill(PROMPTS, max_new_tokens=10, n=4, share=True)))
  copied = smp.read(smp.decode(smp.prefill(PROMPTS, max_new_tokens=10, n=4, share=False)))
  for a, b in zip(shared[:12], copied[:12]):
    assert a.tokens == b.tokens
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    for k in a.features:
      np.testing.assert_allclose(a.features[k], b.features[k], atol=1e-5, err_msg=k)


def test_take_keeps_survivors_and_they_go_on_exactly(lm):
  smp = lm.sampler(SamplingParams(1.5), capture=CAPTURE)
  state = smp.prefill(PROMPTS[:2], max_new_tokens=16, n=3, seed=2)
  state = smp.decode(state, max_steps=5)
  keep = [2, 2, 0, 4, 3, 3]  # within each prompt's block of 3 rows
  with pytest.raises(Exception, match="keep to their prefix"):
    smp.take(state, [3, 0, 0, 4, 3, 3])
  before = smp.read(state)
  state = smp.decode(smp.take(state, keep))
  rows = smp.read(state)
  for r, src in enumerate(keep):
    assert rows[r].tokens[:5] == before[src].tokens
    assert_matches_forward(lm, PROMPTS[r // 3], rows[r])


def test_a_full_cache_finishes_its_rows_with_their_own_reason(lm):
  cache = KVCache.zeros(lm.config, 2, 16 + 4)
  ids = np.zeros((2, 16), np.int32)
  mask = np.zeros((2, 16), np.int32)
  ids[:, -3:], mask[:, -3:] = [1, 5, 6], 1
  state = decoding.prefill(
    lm.static_graph, lm.params, cache, ids, mask, np.array([8, 8]), jax.random.key(0), buffer_len=8
  )
  smp = lm.sampler(SamplingParams(1.0))
  rows = smp.read(smp.decode(state))
  for row in rows:
    if row.finish_reason != "eos":
      assert row.finish_reason == "cache_full" and len(row.tokens) == 5  # 4 slots fed, the 5th token had none


@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_fork_at_step_boundaries_equals_a_fresh_context(lm):
  """SPAE's probes: rows forked at several cuts of one trajectory (no copy of its context) and given a forced
  suffix score that suffix exactly as a fresh forward of context[:cut + 1] + suffix does."""
  smp = lm.sampler(SamplingParams(1.0), capture=CAPTURE)
  state = smp.decode(smp.prefill(PROMPTS[:2], max_new_tokens=12, seed=3, extra_slots=8))
  traj = smp.read(state)
  cuts = np.array([[1, 4], [2, 6]] + [[0, 0]] * (state.batch - 2), np.int32)
  forks = decoding.fork(lm.static_graph, lm.params, state, jnp.asarray(cuts), n=2, suffix_size=8, capture=CAPTURE)
  suffix = [95, 96, 97]
  forks = smp.force(forks, suffix)
  rows = smp.read(forks)
  for b in range(2):
    for c in range(2):
      for s in range(2):
        row = rows[(b * 2 + c) * 2 + s]
        context = PROMPTS[b] + traj[b].tokens[: cuts[b, c] + 1]
        assert row.tokens == suffix
        assert_matches_forward(lm, context, row)


def test_new_prompts_and_new_boundaries_in_the_same_buckets_compile_nothing(lm, compile_counter):
  rng = np.random.RandomState(0)

  def run(stop_words, seed):
    smp = lm.sampler(
      SamplingParams(1.0, 20, 0.9), capture=CAPTURE, stop=StopRule.from_mask(lm.stop_token_mask(stop_words))
    )
    prompts = [rng.randint(3, 90, rng.randint(3, 14)).tolist() for _ in range(2)]
    state = smp.decode(smp.prefill(prompts, max_new_tokens=12, n=2, seed=seed, extra_slots=4))
    state = smp.force(smp.resume(state), [94, 95])
    state = smp.take(state, [1, 0, 3, 3] + list(range(4, state.batch)))
    return smp.read(smp.decode(state, max_steps=4))

  run([".\n"], 0)
  before = compile_counter.count
  run(["\n\n", "a.\n"], 1)
  assert compile_counter.count == before, f"{compile_counter.count - before} compilations on a same-bucket round"


def test_rows_fill_their_caches_only_with_their_own_tokens(lm):
  """A row that waits (finished, paused) while others decode takes no cache slots: each row writes at its own
  slot, so a cache sized for the longest row's budget holds every row to its budget."""
  smp = lm.sampler(SamplingParams(1.0))
  plen = 16
  cache = KVCache.zeros(lm.config, 2, plen + 12)
  ids = np.zeros((2, plen), np.int32)
  mask = np.zeros((2, plen), np.int32)
  ids[:, -3:], mask[:, -3:] = [1, 5, 6], 1
  state = decoding.prefill(
    lm.static_graph, lm.params, cache, ids, mask, np.array([2, 12]), jax.random.key(1), buffer_len=16
  )
  state = smp.decode(state)
  rows = smp.read(state)
  assert [len(r.tokens) for r in rows] == [2, 12] or "eos" in [r.finish_reason for r in rows]
  assert "cache_full" not in [r.finish_reason for r in rows]
  held = np.asarray(state.cache.index)
  for r, row in enumerate(rows):  # the prompt block, then one slot per fed token (the last token is never fed)
    assert held[r] == plen + len(row.tokens) - 1


def test_flatten_copies_the_shared_prefix_and_changes_nothing(lm):
  """`flatten` (what `fork` needs when rows already share a prefix) gives the rows their own copy of the prefix;
  decoding on from it equals decoding on from the shared state, and a fork of it matches a fresh forward."""
  smp = lm.sampler(SamplingParams(0.0), capture=CAPTURE)
  state = smp.decode(smp.prefill(PROMPTS[:2], max_new_tokens=12, n=2, extra_slots=8), max_steps=4)
  flat = decode_state.flatten(state)
  assert flat.cache.prefix is None and flat.cache.size == state.cache.prefix.size + state.cache.size
  a = smp.read(smp.decode(state))
  b = smp.read(smp.decode(flat))
  for x, y in zip(a[:4], b[:4]):
    assert x.tokens == y.tokens
    np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
  state = smp.decode(smp.prefill(PROMPTS[:2], max_new_tokens=12, n=2, extra_slots=8))
  traj = smp.read(state)
  forks = decoding.fork(
    lm.static_graph,
    lm.params,
    decode_state.flatten(state),
    jnp.asarray([[3]] * state.batch, jnp.int32),
    n=1,
    suffix_size=8,
    capture=CAPTURE,
  )
  rows = smp.read(smp.force(forks, [95, 96]))
  for r in range(4):
    assert_matches_forward(lm, PROMPTS[r // 2] + traj[r].tokens[:4], rows[r])


# The scalar-key path's tokens, recorded from the code before per-row keys existed (main 814a1a7): one key for the
# batch must keep drawing exactly what it drew.
_PINNED_SCALAR_KEY = [
  [84, 80, 98, 52, 45, 52, 27, 71],
  [91, 7, 82, 21, 78, 70, 1, 62],
  [38, 97, 20, 70, 1, 38, 40, 97],
  [21, 97, 20, 75, 91, 32, 67, 8],
  [1, 32, 49, 90, 90, 94, 13, 21],
  [1, 40, 80, 95, 8, 6, 26, 20],
]


def test_one_key_for_the_batch_draws_what_it_drew_before_per_row_keys(lm):
  smp = lm.sampler(SamplingParams(1.0, 20, 0.9))
  state = smp.decode(smp.prefill(PROMPTS, max_new_tokens=8, n=2, seed=5))
  assert state.rng.shape == ()
  assert [r.tokens for r in smp.read(state)][:6] == _PINNED_SCALAR_KEY


@pytest.mark.parametrize("n", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_per_row_keys_give_a_prompt_the_same_samples_in_any_batch(lm, n):
  """With prompt_seeds, a prompt in a batch of 3 (padded to 4) draws what it draws alone (batch bucket 1), through
  step pauses, take, resume and a re-key of its rows; without them the batch's one key does not."""
  smp = lm.sampler(SamplingParams(1.5, 30), stop=_stop_rule(lm))
  seeds = [7, 11, 13]

  def run(prompts, prompt_seeds):
    state = smp.prefill(prompts, max_new_tokens=14, n=n, seed=2, prompt_seeds=prompt_seeds)
    state = smp.decode(state)
    rows = np.arange(state.batch).reshape(-1, n)[:, ::-1].reshape(-1)  # reverse each prompt's rows
    state = smp.take(state, rows)
    fresh = decode_state.row_keys(
      jax.vmap(lambda k: jax.random.fold_in(k, 1))(
        decode_state.prompt_keys(2, list(prompt_seeds) + [0] * (state.batch // n - len(prompt_seeds)))
      ),
      n,
    )
    state = smp.decode(smp.resume(decode_state.rekey(state, fresh)))
    return [r.tokens for r in smp.read(state)]

  batched = run(PROMPTS, seeds)
  assert len(batched) == 4 * n
  for p in range(3):
    alone = run([PROMPTS[p]], [seeds[p]])
    assert len(alone) == n
    assert batched[p * n : (p + 1) * n] == alone
  if n == 3:
    assert len({tuple(t) for t in batched[:3]}) == 3, "a prompt's rows must draw distinct streams"
  # the second prompt alone with the batch's one key draws something else than at its place in the batch
  one_key = lambda prompts: [
    r.tokens for r in smp.read(smp.decode(smp.prefill(prompts, max_new_tokens=14, n=n, seed=2)))
  ]
  assert one_key(PROMPTS)[n : 2 * n] != one_key([PROMPTS[1]])


def test_per_row_key_arguments_are_checked(lm):
  smp = lm.sampler(SamplingParams(1.0))
  with pytest.raises(ConfigError, match="one seed per prompt"):
    smp.prefill(PROMPTS, max_new_tokens=4, prompt_seeds=[1, 2])
  with pytest.raises(ConfigError, match=r"prompt_seeds\[1\]"):
    smp.prefill(PROMPTS, max_new_tokens=4, prompt_seeds=[1, -2, 3])
  state = smp.prefill(PROMPTS, max_new_tokens=4)
  with pytest.raises(ConfigError, match="rekey: need \\[4\\] typed PRNG keys"):
    decode_state.rekey(state, decode_state.row_keys(decode_state.prompt_keys(0, [1, 2]), 1))


def test_misshapen_arrays_at_the_api_boundary_are_config_errors(lm):
  """Shapes handed in are checked (chex) before any work, and a bad one is the ConfigError every bad input is."""
  state = lm.sampler(SamplingParams(1.0)).prefill(PROMPTS, max_new_tokens=4)
  with pytest.raises(ConfigError, match=r"resume: rows must be \[4\] bool"):
    lm.sampler(SamplingParams(1.0)).resume(state, [True, False])
  cache = lm.new_cache(2, 16)
  with pytest.raises(ConfigError, match="extend: input_ids and attention_mask must be one"):
    lm.extend(cache, np.ones((2, 3), np.int32), np.ones((2, 4), np.int32))
  with pytest.raises(ConfigError, match="the cache's 2"):
    lm.extend(cache, np.ones((3, 3), np.int32))
  with pytest.raises(ConfigError, match="position_ids: one per input id"):
    lm.forward(np.ones((1, 3), np.int32), position_ids=np.zeros((1, 4), np.int32))


# ------------------------------------------------------------------------------------------ the cache write


def _cache_copies(lm, batch: int) -> list[str]:
  """The compiled decode loop's copy instructions of a whole layer's K or V cache, for `batch` prompts."""
  smp = lm.sampler(SamplingParams(temperature=0))
  state = smp.prefill([[1, 5, 6, 7]] * batch, max_new_tokens=6)
  p = smp.params
  text = (
    decoding.decode.lower(
      *lm.decode_view(),
      state,
      smp.stop,
      smp._eos,
      jnp.float32(p.temperature),
      jnp.float32(p.top_p),
      jnp.int32(6),
      greedy=p.greedy,
      top_k=p.top_k,
      filtered=p.filtered,
      capture=smp.capture,
      shard=lm.shard,
    )
    .compile()
    .as_text()
  )
  k = state.cache.k[0]
  shape = "f32[" + ",".join(map(str, k.shape)) + "]"
  return [line for line in text.splitlines() if f"= {shape}" in line and " copy(" in line]


@pytest.mark.parametrize("packed", [False, True])
def test_batch_one_decode_copies_no_cache(lm, packed):
  """With the CPU attention kernels reading the cache reshaped to [B * KV, S, Dh], XLA:CPU duplicated each layer's
  one-row cache write into a second fusion for the reshape and copied every layer's K and V cache on every step
  (and again where the step's cond joined); the kernels now take [B, KV, S, Dh] as it is and the compiled loop has
  none of those copies, with XLA's products or the kernels (docs/kernels.md, the batch-1 bandwidth)."""
  if packed:
    require_cpu_kernels()
  from reprobe_jax.models import LanguageModel

  m = LanguageModel(lm.config, lm.graphdef, lm.params, lm.tokenizer)
  m.packed_decode = packed
  assert _cache_copies(m, 1) == []
