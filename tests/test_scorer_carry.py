"""Stateful step scorers: a scorer that keeps per-row state across a search's rounds (a PRM's own
KV cache) through `init_carry` / `advance`. Held to its own stateless `score` on the whole row: advancing a row's
steps one by one, beam search and DVTS (the survivors' carries gathered, a lookahead's copy dropped), Best-of-N;
the same search with the scorer's stateless twin (today's vmapped path); a broken carry fails before decoding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from reprobe_jax.errors import ConfigError
from reprobe_jax.models import SamplingParams
from reprobe_jax.scorers import (
  ScoreInputs,
  StepScorer,
  get_scorer,
  inputs_from_state,
  prompt_rows,
  score,
  step_token_mask,
  take_carry,
)
from reprobe_jax.tts import SearchConfig
from reprobe_jax.tts.beam import beam_search
from reprobe_jax.tts.best_of_n import best_of_n
from reprobe_jax.tts.dvts import dvts

from test_tts_search import PROMPTS, lm  # noqa: F401 (the tiny word-level model of the search tests)

MOD = 31


def _weights(ids, mask):
  """[B, T] int32 token weights: the token id, 0 for pad, BOS and EOS (ids < 3) and for masked entries."""
  return jnp.where(mask.astype(bool) & (ids >= 3), ids, 0).astype(jnp.int32)


def _value(p, q, v):
  """The toy step score in [0, 1): of the prompt's weight p, the weight q of the response before the step, and v of
  the step's own tokens (exact: integer arithmetic, one float division)."""
  return ((3 * p + 5 * q + 7 * v) % MOD).astype(jnp.float32) / MOD


@struct.dataclass
class PrefixScorer(StepScorer):
  """A toy stateful scorer: a step's score reads its own tokens, its prompt and every response token before it (not
  computable from the newest step alone). Its carry is each row's prompt weight and a buffer of `room` slots into
  which every step appends its tokens' weights and one separator slot (as a PRM's cache holds a step and its
  separator); `score` computes the same from the whole row. A step that does not fit the room scores 2 (outside
  [0, 1)), so a search that sizes the carry too small is seen."""

  name = "prefix"
  stateful = True

  def score(self, inputs, spans):
    mask = inputs.token_mask
    w = _weights(inputs.get("tokens", self.name), mask)[:, None, :]  # [B, 1, T]
    in_step = step_token_mask(spans, mask)  # [B, S, T]
    before = (jnp.arange(mask.shape[1]) < spans[..., 0:1]) & mask.astype(bool)[:, None, :]
    v = jnp.sum(jnp.where(in_step, w, 0), axis=-1)
    q = jnp.sum(jnp.where(before, w, 0), axis=-1)
    p = self._prompt(inputs)[:, None]
    return jnp.where(jnp.sum(in_step, axis=-1) > 0, _value(p, q, v), jnp.nan)

  def _prompt(self, inputs):
    return jnp.sum(_weights(inputs.get("prompt_ids", self.name), inputs.get("prompt_mask", self.name)), axis=-1)

  def init_carry(self, inputs, room):
    b = inputs.token_mask.shape[0]
    return {"prompt": self._prompt(inputs), "buf": jnp.zeros((b, room), jnp.int32), "fill": jnp.zeros((b,), jnp.int32)}

  def advance(self, carry, inputs, span):
    mask = inputs.token_mask
    in_step = step_token_mask(span[:, None, :], mask)[:, 0]  # [B, T]
    w = jnp.where(in_step, _weights(inputs.get("tokens", self.name), mask), 0)
    n = jnp.sum(in_step, axis=-1)
    buf = carry["buf"]
    room = buf.shape[1]
    # The step's tokens go to slots fill .. fill + n - 1 (the span's real tokens are contiguous), then a separator.
    slot = jnp.where(in_step, carry["fill"][:, None] + jnp.arange(mask.shape[1])[None] - span[:, :1], room)
    buf = buf.at[jnp.arange(buf.shape[0])[:, None], slot].set(w, mode="drop")
    out = _value(carry["prompt"], jnp.sum(carry["buf"], axis=-1), jnp.sum(w, axis=-1))
    out = jnp.where(n > 0, jnp.where(carry["fill"] + n + 1 > room, 2.0, out), jnp.nan)
    return out, {"prompt": carry["prompt"], "buf": buf, "fill": carry["fill"] + jnp.where(n > 0, n + 1, 0)}


@struct.dataclass
class StatelessPrefix(PrefixScorer):
  """The same scores through the stateless path (its newest-step score reads the whole row)."""

  stateful = False


# ------------------------------------------------------------------------------------------------ the contract


def _random_rows(rng, b=5, t=24, s=6, tp=7, vocab=60):
  """ScoreInputs of b random rows (lengths < t, left-padded prompts of 1..tp tokens) and each row's s steps: random
  cut points in [0, t], so consecutive spans that tile the row, some empty, some past its length."""
  lengths = rng.integers(1, t, b)
  prompts = [list(rng.integers(0, vocab, rng.integers(1, tp + 1))) for _ in range(b)]
  ids, pmask = prompt_rows(prompts, 1, b)
  inputs = ScoreInputs(
    token_mask=jnp.asarray(np.arange(t)[None] < lengths[:, None]),
    tokens=jnp.asarray(rng.integers(0, vocab, (b, t)), jnp.int32),
    prompt_ids=jnp.asarray(ids),
    prompt_mask=jnp.asarray(pmask),
  )
  cuts = np.sort(rng.integers(0, t + 1, (b, s - 1)), axis=1)
  cuts[:, 1] = cuts[:, 0]  # an empty step in every row
  edges = np.concatenate([np.zeros((b, 1), int), cuts, np.full((b, 1), t)], axis=1)
  return inputs, np.stack([edges[:, :-1], edges[:, 1:]], axis=-1).astype(np.int32), prompts


def test_advancing_steps_one_by_one_equals_score_on_the_whole_row():
  rng = np.random.default_rng(0)
  scorer = PrefixScorer()
  for _ in range(3):
    inputs, spans, prompts = _random_rows(rng)
    whole = np.asarray(score(scorer, inputs, jnp.asarray(spans)))  # [B, S]
    carry = scorer.init_carry(inputs, room=inputs.token_mask.shape[1] + spans.shape[1])
    steps = []
    for k in range(spans.shape[1]):
      out, after = jax.jit(scorer.advance)(carry, inputs, jnp.asarray(spans[:, k]))
      empty = spans[:, k, 1] <= spans[:, k, 0]
      for leaf, old in zip(jax.tree.leaves(after), jax.tree.leaves(carry)):  # an empty step keeps its row's carry
        np.testing.assert_array_equal(np.asarray(leaf)[empty], np.asarray(old)[empty])
      steps.append(np.asarray(out))
      carry = after
    np.testing.assert_array_equal(np.stack(steps, axis=1), whole)
    assert np.isnan(whole[:, 1]).all() and np.isfinite(whole[:, 0]).any()
    # the reference by hand: prompt weight, response weight before the step, the step's own
    for r, (p, sp) in enumerate(zip(prompts, spans)):
      n = int(np.asarray(inputs.token_mask[r]).sum())
      w = [int(x) if x >= 3 else 0 for x in np.asarray(inputs.tokens[r, :n])]
      pw = sum(int(x) for x in p if x >= 3)
      for k, (a, e) in enumerate(sp):
        want = np.nan if min(e, n) <= a else ((3 * pw + 5 * sum(w[:a]) + 7 * sum(w[a:e])) % MOD) / MOD
        np.testing.assert_allclose(whole[r, k], want, rtol=1e-6)


def test_take_carry_gathers_rows_of_every_leaf_and_stateless_scorers_keep_no_carry():
  carry = {"a": jnp.arange(4), "b": jnp.arange(12).reshape(4, 3)}
  got = take_carry(carry, jnp.asarray([2, 2, 0, 3]))
  np.testing.assert_array_equal(got["a"], [2, 2, 0, 3])
  np.testing.assert_array_equal(got["b"], np.arange(12).reshape(4, 3)[[2, 2, 0, 3]])
  ppl = get_scorer("perplexity")
  assert not ppl.stateful and PrefixScorer.stateful and not StatelessPrefix.stateful
  inputs = ScoreInputs(token_mask=jnp.ones((2, 5), bool), logprobs=-jnp.arange(10.0).reshape(2, 5))
  span = jnp.asarray([[0, 2], [1, 5]], jnp.int32)
  assert ppl.init_carry(inputs, 8) == ()
  out, kept = ppl.advance((), inputs, span)
  assert kept == ()
  np.testing.assert_array_equal(out, ppl.score_newest(inputs, span))


def test_score_inputs_check_the_prompt_and_token_fields():
  inputs = ScoreInputs(
    token_mask=jnp.ones((2, 5), bool),
    tokens=jnp.zeros((2, 4), jnp.int32),
    prompt_ids=jnp.zeros((2, 3), jnp.int32),
    prompt_mask=jnp.ones((2, 3), bool),
  )
  assert inputs.get("prompt_ids", "x").shape == (2, 3) and inputs.get("prompt_mask", "x").shape == (2, 3)
  with pytest.raises(ConfigError, match=r"ScoreInputs.tokens has shape \(2, 4\); token_mask is \(2, 5\)"):
    inputs.get("tokens", "x")
  with pytest.raises(ConfigError, match="ScoreInputs.prompt_ids has shape .* both must be \\[B, Tp\\] with B = 2"):
    inputs.replace(prompt_mask=jnp.ones((2, 4), bool)).get("prompt_ids", "x")
  with pytest.raises(ConfigError, match="ScoreInputs.prompt_mask has shape \\(3, 3\\)"):
    inputs.replace(prompt_ids=jnp.zeros((3, 3), jnp.int32), prompt_mask=jnp.ones((3, 3), bool)).get("prompt_mask", "x")
  with pytest.raises(ConfigError, match="scorer 'x' reads ScoreInputs.prompt_ids, whose prompt_mask is None"):
    inputs.replace(prompt_mask=None).get("prompt_ids", "x")
  ids, mask = prompt_rows([[1, 2, 3], [4]], 2, 6, pad_id=9)  # left-padded, repeated per row, padding rows empty
  assert ids.shape == mask.shape == (6, 16)
  np.testing.assert_array_equal(ids[:, -3:], [[1, 2, 3], [1, 2, 3], [9, 9, 4], [9, 9, 4], [9, 9, 9], [9, 9, 9]])
  assert mask.sum(axis=1).tolist() == [3, 3, 1, 1, 0, 0] and (ids[:, :-3] == 9).all()
  with pytest.raises(ConfigError, match="2 prompts x 2 rows do not fit a batch of 3"):
    prompt_rows([[1], [2]], 2, 3)


def test_inputs_from_state_fill_the_tokens_and_the_prompts(lm):  # noqa: F811
  smp = lm.sampler()
  state = smp.decode(smp.prefill(PROMPTS[:2], max_new_tokens=6, n=2, seed=0))
  prompts = prompt_rows(PROMPTS[:2], 2, state.batch)
  inputs = inputs_from_state(state, prompts=tuple(map(jnp.asarray, prompts)))
  np.testing.assert_array_equal(inputs.tokens, state.tokens)
  np.testing.assert_array_equal(inputs.prompt_ids, prompts[0])
  assert inputs_from_state(state).prompt_ids is None
  with pytest.raises(ConfigError, match="prompts must be \\(ids, mask\\) of one"):
    inputs_from_state(state, prompts=(jnp.zeros((3, 16), jnp.int32), jnp.zeros((3, 16), bool)))


# ------------------------------------------------------------------------------------------------ in a search


def _own_scores(scorer, prompt, cand):
  """The scorer's `score` on one candidate alone: its prompt, its response (EOS weighs nothing), its steps."""
  ids = list(cand.response_ids) or [0]
  spans = np.asarray(cand.steps, np.int32).reshape(1, -1, 2)
  pids, pmask = prompt_rows([prompt], 1, 1)
  inputs = ScoreInputs(
    token_mask=jnp.asarray([[True] * len(cand.response_ids) + [False] * (len(ids) - len(cand.response_ids))]),
    tokens=jnp.asarray([ids], jnp.int32),
    prompt_ids=jnp.asarray(pids),
    prompt_mask=jnp.asarray(pmask),
  )
  return np.asarray(score(scorer, inputs, jnp.asarray(spans)))[0]


# The budget fills the response buffer (bucket 32), so a row that spends it needs the room of one token per step too.
CFG = dict(n=3, max_steps=8, max_new_tokens=32, sampling=SamplingParams(1.0, top_k=0, top_p=1.0), seed=2)


@pytest.mark.parametrize(
  "strategy,lookahead",
  [
    pytest.param("beam", 0, marks=pytest.mark.slow),
    ("dvts", 0),
    pytest.param("beam", 1, marks=pytest.mark.slow),
    pytest.param("dvts", 1, marks=pytest.mark.slow),
  ],
)
def test_search_with_a_stateful_scorer_scores_every_kept_step_on_its_own_row(lm, strategy, lookahead):  # noqa: F811
  """Each kept candidate's step scores are the scorer's on that candidate's prompt and steps alone (with a lookahead:
  its last step, scored without one); the whole result equals the same search with the stateless twin."""
  cfg = SearchConfig(strategy, beams=2, lookahead=lookahead, **CFG)
  run = beam_search if strategy == "beam" else dvts
  seeds = [4, 5, 6]
  got = run(lm, PrefixScorer(), PROMPTS, cfg, prompt_seeds=seeds)
  assert got == run(lm, StatelessPrefix(), PROMPTS, cfg, prompt_seeds=seeds)
  checked = multi = 0
  assert "length" in {c.finish_reason for r in got for c in r.candidates}
  for prompt, res in zip(PROMPTS, got):
    for cand in res.candidates:
      own = _own_scores(PrefixScorer(), prompt, cand)
      if lookahead == 0:
        np.testing.assert_array_equal(cand.step_scores, own)
        checked += len(own)
      elif cand.finish_reason != "eos":  # a last step that was not followed by a dropped EOS-only step
        np.testing.assert_array_equal(cand.step_scores[-1], own[-1])
        checked += 1
      multi += len(cand.steps) > 1
  assert checked >= 4 and multi >= 3, (checked, multi)
  if lookahead:  # the lookahead's scores are not the candidates' own: some earlier step differs
    assert any(
      c.step_scores[:-1] != tuple(_own_scores(PrefixScorer(), p, c))[:-1]
      for p, r in zip(PROMPTS, got)
      for c in r.candidates
    )


def test_a_second_stateful_search_in_the_same_buckets_compiles_nothing(lm, compile_counter):  # noqa: F811
  cfg = SearchConfig("beam", beams=2, **CFG)
  first = beam_search(lm, PrefixScorer(), PROMPTS, cfg, prompt_seeds=[4, 5, 6])
  before = compile_counter.count
  again = beam_search(
    lm,
    PrefixScorer(),
    [[1, 30, 31], [1, 32, 33, 34, 35, 36], [1, 37]],
    SearchConfig("beam", beams=2, **{**CFG, "max_steps": 5, "seed": 7}),
    prompt_seeds=[1, 2, 3],
  )
  assert compile_counter.count == before, f"{compile_counter.count - before} compilations in a same-bucket search"
  assert again != first


def test_best_of_n_scores_a_prompt_reading_scorer_on_each_row(lm):  # noqa: F811
  cfg = SearchConfig("best_of_n", n=3, max_steps=4, max_new_tokens=24, sampling=SamplingParams(1.0, top_k=0, top_p=1.0))
  results = best_of_n(lm, PrefixScorer(), PROMPTS, cfg, prompt_seeds=[1, 2, 3])
  steps = 0
  for prompt, res in zip(PROMPTS, results):
    for cand in res.candidates:
      np.testing.assert_array_equal(cand.step_scores, _own_scores(PrefixScorer(), prompt, cand))
      steps += len(cand.steps)
  assert steps >= 9


# ------------------------------------------------------------------------------------------------ broken carries


@struct.dataclass
class NoRows(PrefixScorer):
  """init_carry returns a leaf without the rows' leading dim."""

  def init_carry(self, inputs, room):
    return {**super().init_carry(inputs, room), "total": jnp.zeros((), jnp.int32)}


@struct.dataclass
class Misfit(PrefixScorer):
  """init_carry adds arrays that do not broadcast (a shape error while tracing)."""

  def init_carry(self, inputs, room):
    return {**super().init_carry(inputs, room), "bad": inputs.tokens + jnp.zeros((3,), jnp.int32)}


@struct.dataclass
class Grows(PrefixScorer):
  """advance returns a carry one slot longer than init_carry's."""

  def advance(self, carry, inputs, span):
    out, carry = super().advance(carry, inputs, span)
    return out, {**carry, "buf": jnp.pad(carry["buf"], ((0, 0), (0, 1)))}


@struct.dataclass
class ReadsFeatures(PrefixScorer):
  """init_carry reads features the search was given no spec for."""

  def init_carry(self, inputs, room):
    return {**super().init_carry(inputs, room), "f": inputs.get("features", self.name)[:, 0, 0]}


@pytest.mark.parametrize(
  "broken,match",
  [
    (NoRows(), r"scorer 'prefix' cannot score.*init_carry must return leaves of leading dim B = 2.*\[\(\)\]"),
    (Misfit(), r"scorer 'prefix' cannot score.*(shapes|broadcast)"),
    (Grows(), r"scorer 'prefix' cannot score.*advance must return a carry of init_carry's structure"),
    (ReadsFeatures(), r"scorer 'prefix' cannot score.*reads ScoreInputs.features, which is None"),
  ],
)
def test_a_broken_stateful_scorer_fails_before_any_decoding(lm, compile_counter, broken, match):  # noqa: F811
  cfg = SearchConfig("beam", beams=2, **CFG)
  beam_search(lm, PrefixScorer(), PROMPTS[:1], cfg)  # the tables a search builds once per model
  before = compile_counter.count
  with pytest.raises(ConfigError, match=match):
    beam_search(lm, broken, PROMPTS, cfg)
  with pytest.raises(ConfigError, match=match):
    dvts(lm, broken, PROMPTS, SearchConfig("dvts", beams=2, **CFG))
  with pytest.raises(ConfigError, match=match):
    best_of_n(lm, broken, PROMPTS, SearchConfig("best_of_n", n=2, max_new_tokens=8))
  assert compile_counter.count == before, "a broken carry was found only after work had started"
