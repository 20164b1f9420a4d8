"""The on-device step-level search that beam search and DVTS share (docs/method.md §A7), batched across prompts.

Per prompt, G groups each keep W rows. Every round each kept row samples N candidate next steps (to the step
boundary), only the newest step of each candidate is scored (after an optional greedy lookahead of k steps, whose
last step is scored instead; the candidate is kept, not the lookahead), and each group keeps its top W of its W x N
candidates (lowest score first: scores are "higher = more likely incorrect"). Beam search is G = 1, W = B (`beam`);
DVTS is G = B, W = 1 (`dvts`). A prompt holds G * W * N = B * N decode rows throughout.

The whole search is one jitted program: `lax.while_loop` over rounds, each round = decode to the next boundary
(`decoding.decode`), lookahead, scoring (`scorer.score_newest` on `inputs_from_state`: the features captured while
decoding, no second forward, no host round-trip), selection, `take` of the survivors (each repeated N times) and a
re-key of every row. Shapes are static (prompt, batch and budget buckets; B, N, k; the step buffer); seeds,
temperature, top_p and max_steps are traced, so a second search in the same buckets compiles nothing.

Randomness: row j of prompt p draws from fold_in(key(seed), prompt_seeds[p]) folded with j (round 0, the prefill's
`row_keys`) or with the round r and then j (`round_keys`), so a prompt gets the same result in any batch. The
scorer is applied per prompt (vmapped over prompts), so its row index, too, is the row's index within its prompt.
The scorer's inputs hold each row's response tokens and its prompt (left-padded [R, Tp], the prefill's bucket).

A stateful scorer (`StepScorer.stateful`, a PRM with its own KV cache) is not vmapped: its carry for all R rows
rides in the loop next to the decode state and the book, built once after the prefill (`init_carry` on every
row's prompt, room = response buffer + one token per step slot and lookahead step). Each round `advance` scores
every live row's candidate step at once (the others get an empty span: NaN, carry kept) and the carry after the
candidate step is the one that survives; a lookahead advances a copy of it step by step (the score of the last
lookahead step replaces the candidate's, as for a stateless scorer) and drops the copy; at selection the
survivors' carries are gathered with their decode rows (`take_carry`).

The scorer's output is checked where it enters (`scorers.checked_scores`: a float array of one score per row, while
traced), and a live row's step with tokens scored NaN or +-inf is counted in the book, ends the loop and is refused
on the host (ConfigError naming the scorer) instead of being ranked last (NaN) or first (-inf).

What the loop carries, how a row finishes and what the search hands back: `search_state`.
"""

from __future__ import annotations

import functools
from typing import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from jaxtyping import Array, Float, Int

from reprobe_jax.errors import ConfigError, shape_errors
from reprobe_jax.features import FeatureSpec, union_capture
from reprobe_jax.models import CaptureSpec, LanguageModel
from reprobe_jax.models import decoding
import reprobe_jax.models.decode_state as decode_state
from reprobe_jax.models.decode_state import FINISH_LENGTH, FINISH_STOP, DecodeState
from reprobe_jax.models.sampling import bucket
from reprobe_jax.models.sharding import constrain_rows
from reprobe_jax.models.xla_options import decode_jit
from reprobe_jax.scorers import (
  StepScorer,
  bad_scores,
  checked_scores,
  inputs_from_state,
  nonfinite_error,
  prompt_rows,
  take_carry,
)
from reprobe_jax.steps import ANSWER_PREFIX, STEP_MODE, StepBoundary, answer_lines, answer_table
from reprobe_jax.tts.checks import prompt_seeds_for, scorer_spec
from reprobe_jax.tts.config import SearchConfig
from reprobe_jax.tts.result import PromptResult
from reprobe_jax.tts.search_state import (
  FINISH_ANSWER,
  FINISH_MAX_STEPS,
  GOES_ON,
  FinalRows,
  Lookahead,
  SearchBook,
  SearchEnv,
  SearchLoop,
  SearchPlan,
  results,
  round_keys,
)


def _decode(plan: SearchPlan, env: SearchEnv, state: DecodeState, *, greedy: bool) -> DecodeState:
  return decoding.decode_in_jit(
    plan.graph,
    env.params,
    state,
    env.rule,
    env.eos_mask,
    env.temperature,
    env.top_p,
    jnp.int32(state.buffer_len),
    greedy=greedy,
    top_k=plan.top_k,
    filtered=plan.filtered,
    capture=plan.capture,
    shard=plan.shard,
  )


def _per_prompt(x, p: int):
  return x.reshape((p, -1) + x.shape[1:])


def _score(plan: SearchPlan, env: SearchEnv, state: DecodeState, spans, p: int) -> Float[Array, " r"]:
  """[R] scores of each row's step spans [R, 2], the scorer vmapped over prompts (row index = index in its prompt)."""
  inputs = inputs_from_state(state, plan.spec, plan.num_layers, env.prompts)
  split = jax.tree.map(lambda x: _per_prompt(x, p), inputs)
  rows = spans.shape[0] // p
  one = lambda i, sp: checked_scores(env.scorer, env.scorer.score_newest(i, sp), (rows,), "score_newest")
  out = jax.vmap(one)(split, _per_prompt(spans, p))  # [P, rows], checked while traced
  return constrain_rows(out.reshape(-1).astype(jnp.float32), plan.shard)


def _advance(plan: SearchPlan, env: SearchEnv, carry, state: DecodeState, spans, rows):
  """A stateful scorer over all R rows at once: (scores [R] float32, carry) of the step spans [R, 2] of the rows
  `rows` [R] bool; every other row gets an empty span (NaN, its carry kept)."""
  out, carry = env.scorer.advance(
    carry, inputs_from_state(state, plan.spec, plan.num_layers, env.prompts), jnp.where(rows[:, None], spans, 0)
  )
  return checked_scores(env.scorer, out, rows.shape, "advance").astype(jnp.float32), carry


def _reason(env: SearchEnv, state: DecodeState, spans, steps) -> Int[Array, " r"]:
  """[R] int32: why each row that just decoded is finished, or GOES_ON (paused at a boundary with room to go on)."""
  hit = answer_lines(env.answer, state.tokens, spans)
  paused = jnp.where(
    hit,
    FINISH_ANSWER,
    jnp.where(
      steps >= env.max_steps, FINISH_MAX_STEPS, jnp.where(state.lengths >= state.budget, FINISH_LENGTH, GOES_ON)
    ),
  )
  return jnp.where(state.finish == FINISH_STOP, paused, state.finish).astype(jnp.int32)


def _lookahead(plan: SearchPlan, env: SearchEnv, state: DecodeState, go, spans, carry) -> Lookahead:
  """Extends the rows `go` [R] by up to plan.lookahead greedy steps on a copy of the state. A stateful scorer
  advances on every lookahead step from `carry` (the candidates'; the copy is dropped) and scores the last one."""
  steps = jnp.zeros(go.shape, jnp.int32)
  tokens = jnp.zeros(go.shape, jnp.int32)
  last = jnp.full(go.shape, jnp.nan, jnp.float32)
  for _ in range(plan.lookahead):
    state = decode_state.resume(state, go)
    before = state.lengths
    state = _decode(plan, env, state, greedy=True)
    newest = decode_state.newest_step_spans(state)
    new = go & (newest[:, 1] > newest[:, 0])  # a resumed row spent at its budget gets no step
    spans = jnp.where(new[:, None], newest, spans)
    if env.scorer.stateful:
      out, carry = _advance(plan, env, carry, state, newest, new)
      last = jnp.where(new, out, last)
    steps += new
    tokens += state.lengths - before
    go = (
      new
      & (state.finish == FINISH_STOP)
      & ~answer_lines(env.answer, state.tokens, newest)
      & (state.lengths < state.budget)
    )
  return Lookahead(state=state, spans=spans, steps=steps, tokens=tokens, score=last)


def _duplicates(state, key, live, rows_per_group: int):
  """[R] bool: the row's whole response equals that of a live row of its group ranked before it (lower key, ties
  by row order). Responses are compared by length and two 32-bit position-weighted hashes of their tokens."""
  pos = jnp.arange(state.buffer_len, dtype=jnp.uint32)
  mask = pos[None, :] < state.lengths[:, None].astype(jnp.uint32)
  tok = jnp.where(mask, state.tokens.astype(jnp.uint32) + 1, 0)
  u = lambda c: jnp.uint32(c)
  h1 = jnp.sum(tok * (pos * u(2654435761) + u(97531)), axis=1, dtype=jnp.uint32)  # wraps mod 2**32
  h2 = jnp.sum(tok * ((pos + u(1)) * u(40503) + u(1)) * (tok + u(7)), axis=1, dtype=jnp.uint32)
  g = lambda x: x.reshape(-1, rows_per_group)
  same = (
    (g(h1)[:, :, None] == g(h1)[:, None, :])
    & (g(h2)[:, :, None] == g(h2)[:, None, :])
    & (g(state.lengths)[:, :, None] == g(state.lengths)[:, None, :])
    & g(live)[:, None, :]
  )  # [G, i, j]
  idx = jnp.arange(rows_per_group)
  k = g(key)
  before = (k[:, None, :] < k[:, :, None]) | ((k[:, None, :] == k[:, :, None]) & (idx[None, :] < idx[:, None]))
  return jnp.any(same & before, axis=-1).reshape(-1)


def _take_by_group(state: DecodeState, local, rows_per_group: int) -> DecodeState:
  """`decode_state.take` of each group's survivors local [G, rows_per_group] (indices within the group), as one
  gather inside each group's block of rows (vmapped over groups; the shared prefix is not gathered). Sharded over
  the data axis, a group whose rows one device holds gathers on that device; a take over all rows would all-gather
  every row's KV cache onto every device each round."""
  prefix = state.cache.prefix
  own = state.replace(cache=state.cache.replace(prefix=None))
  blocks = jax.vmap(decode_state.take)(
    jax.tree.map(lambda x: x.reshape((-1, rows_per_group) + x.shape[1:]), own), local
  )
  out = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), blocks)
  return out.replace(cache=out.cache.replace(prefix=prefix))


def _round(plan: SearchPlan, env: SearchEnv, loop: SearchLoop) -> SearchLoop:
  """One search round over all R = P * B * N rows: decode, lookahead, score, select, take, re-key, resume."""
  state, book, carry = loop.state, loop.book, loop.carry
  r_rows = state.batch
  p = r_rows // plan.rows_per_prompt
  live = ~book.ended  # every copy of a live survivor samples a candidate
  before = state.lengths
  state = _decode(plan, env, state, greedy=plan.greedy)
  spans = decode_state.newest_step_spans(state)  # [R, 2] the candidates' steps
  reason = _reason(env, state, spans, book.n_steps + 1)
  scored, score_spans = state, spans
  la_steps = la_tokens = jnp.zeros((r_rows,), jnp.int32)
  stateful = env.scorer.stateful
  if stateful:  # the candidates' carry is the one that survives
    score, carry = _advance(plan, env, carry, state, spans, live)  # [R]
  if plan.lookahead:
    ahead = _lookahead(plan, env, state, live & (reason == GOES_ON), spans, carry)
    scored, score_spans, la_steps, la_tokens = ahead.state, ahead.spans, ahead.steps, ahead.tokens
    if stateful:
      score = jnp.where(la_steps > 0, ahead.score, score)
  if not stateful:
    score = _score(plan, env, scored, score_spans, p)  # [R]

  # Selection: per group, the rows finished before this round (first copies only) keep their slots, then the
  # candidates by score (NaN = no tokens: last), ties by row order; duplicate copies of finished rows never.
  rows_per_group = plan.width * plan.n
  cls = jnp.where(book.ended, jnp.where(book.primary, 0, 3), 1)
  key = jnp.where(book.ended, 0.0, jnp.where(jnp.isnan(score), jnp.inf, score))
  if plan.dedupe:  # a candidate equal to a better-ranked live one of its group goes after every distinct one
    cls = jnp.where(live & _duplicates(state, key, live, rows_per_group), 2, cls)
  order = jnp.lexsort((key.reshape(-1, rows_per_group), cls.reshape(-1, rows_per_group)), axis=-1)
  kept = order[:, : plan.width]  # [P * G, W]
  src = jnp.repeat((jnp.arange(kept.shape[0])[:, None] * rows_per_group + kept).reshape(-1), plan.n)  # [R]

  now = live & (reason != GOES_ON)
  slot = jnp.where(live, book.n_steps, plan.history)  # out of range = dropped
  rows = jnp.arange(r_rows)
  book = book.replace(
    ended=book.ended | now,
    reason=jnp.where(now, reason, book.reason),
    scores=book.scores.at[rows, slot].set(score, mode="drop"),
    spans=book.spans.at[rows, slot].set(spans, mode="drop"),
    n_steps=book.n_steps + live,
    last=jnp.where(live, score, book.last),
    sampled=book.sampled + jnp.sum(_per_prompt(live + la_steps, p), axis=1, dtype=jnp.int32),
    bad=book.bad + jnp.sum(_per_prompt(live & bad_scores(score, score_spans), p), axis=1, dtype=jnp.int32),
    generated=book.generated + jnp.sum(_per_prompt(state.lengths - before + la_tokens, p), axis=1, dtype=jnp.int32),
  )
  g = lambda x: jnp.take(x, src, axis=0)
  book = book.replace(
    ended=g(book.ended),
    reason=g(book.reason),
    n_steps=g(book.n_steps),
    scores=g(book.scores),
    spans=g(book.spans),
    last=g(book.last),
    primary=rows % plan.n == 0,
  )
  carry = take_carry(carry, src)
  state = _take_by_group(state, jnp.repeat(kept, plan.n, axis=1), rows_per_group)  # = decode_state.take(state, src)
  state = decode_state.rekey(state, round_keys(env.prompt_keys, loop.round + 1, plan.rows_per_prompt))
  state = decode_state.resume(state, ~book.ended)
  # The carry stays data-parallel: every row's cache, buffers and book entries on the device of its rows.
  state, book = constrain_rows((state, book), plan.shard)
  return SearchLoop(state=state, book=book, carry=carry, round=loop.round + 1)


def _search_impl(env: SearchEnv, state: DecodeState, *, plan: SearchPlan) -> tuple[DecodeState, SearchBook]:
  """Rounds until every kept row is finished (at most env.max_steps, traced): (the final state, the rows' book).
  The state (donated) is returned so that the loop runs in its buffers."""
  r_rows = state.batch
  p = r_rows // plan.rows_per_prompt
  with shape_errors("search: every row's prompt [R, Tp] and one key per prompt"):  # at trace time, before the loop
    chex.assert_shape(env.prompts, (r_rows, None))
    chex.assert_equal_shape(env.prompts)
    chex.assert_shape(env.prompt_keys, (p,))
  state = constrain_rows(state, plan.shard)
  book = SearchBook(
    ended=state.done,
    reason=jnp.where(state.done, FINISH_LENGTH, GOES_ON).astype(jnp.int32),
    primary=jnp.ones((r_rows,), bool),
    n_steps=jnp.zeros((r_rows,), jnp.int32),
    scores=jnp.full((r_rows, plan.history), jnp.nan, jnp.float32),
    spans=jnp.zeros((r_rows, plan.history, 2), jnp.int32),
    last=jnp.full((r_rows,), jnp.nan, jnp.float32),
    sampled=jnp.zeros((p,), jnp.int32),
    generated=jnp.zeros((p,), jnp.int32),
    bad=jnp.zeros((p,), jnp.int32),
  )
  book = constrain_rows(book, plan.shard)
  carry = ()
  if env.scorer.stateful:  # room: the response buffer, one token per step slot and per lookahead step
    carry = env.scorer.init_carry(
      inputs_from_state(state, plan.spec, plan.num_layers, env.prompts),
      state.buffer_len + plan.history + plan.lookahead,
    )
  body = functools.partial(_round, plan, env)
  # A non-finite score of a step with tokens ends the search: the host refuses the scorer (`run_search`).
  cond = lambda loop: (loop.round < env.max_steps) & jnp.any(~loop.book.ended) & ~jnp.any(loop.book.bad > 0)
  out = jax.lax.while_loop(cond, body, SearchLoop(state=state, book=book, carry=carry, round=jnp.zeros((), jnp.int32)))
  return out.state, out.book


_search, _search_in_jit = decode_jit(static_argnames=("plan",), donate_argnames=("state",))(_search_impl)


# ------------------------------------------------------------------------------------------------ the host shell


def run_search(
  lm: LanguageModel,
  scorer: StepScorer,
  prompts,
  cfg: SearchConfig,
  *,
  groups: int,
  width: int,
  mode: str = "line",
  feature_spec: FeatureSpec | None = None,
  prompt_seeds: Sequence[int] | None = None,
) -> list[PromptResult]:
  """Runs the search of docs/method.md §A7 with `groups` groups of `width` rows per prompt (groups * width = cfg.beams)
  over all prompts (text or token ids) at once; one PromptResult per prompt: its groups' kept rows (each group's best
  first) with every selected step's span and score, and the steps and tokens it sampled. mode: 'line' (a step is a
  line; the '<Answer>' line ends a row) or 'thinking' (paragraph steps; EOS ends a row). prompt_seeds: one integer
  in [0, 2**32) per prompt (default: from its token ids); a prompt's result depends on it, not on the batch."""
  if not isinstance(cfg, SearchConfig):
    raise ConfigError(f"cfg must be a SearchConfig, got {type(cfg).__name__}")
  if groups * width != cfg.beams:
    raise ConfigError(f"{groups} groups of width {width} do not make SearchConfig.beams={cfg.beams}")
  if mode not in STEP_MODE:
    raise ConfigError(f"mode must be one of {sorted(STEP_MODE)}, got {mode!r}")
  if lm.tokenizer is None:
    raise ConfigError("a step search needs the model's tokenizer (its step boundary is compiled from it)")
  spec = scorer_spec(lm, scorer, feature_spec)
  ids = lm.encode(prompts)
  if not ids:
    raise ConfigError("no prompts to search")
  seeds = prompt_seeds_for(ids, prompt_seeds)
  capture = union_capture([spec]) if spec is not None else CaptureSpec(token_stats=True)
  smp = lm.sampler(
    cfg.sampling, capture=capture, stop=StepBoundary(STEP_MODE[mode]).compile(lm.tokenizer, lm.config.vocab_size)
  )
  rows = cfg.beams * cfg.n
  state = smp.prefill(ids, max_new_tokens=cfg.max_new_tokens, n=rows, seed=cfg.seed, prompt_seeds=seeds)
  # The rows (decode state, prompts) start on the devices of the mesh's data axis; parameters stay as the model has
  # them (docs/scale.md, "What runs data-parallel").
  state = constrain_rows(state, lm.shard, put=True)
  if lm.shard is not None:  # the scorer's arrays whole on every device, once (those already on a mesh stay there)
    whole = NamedSharding(lm.shard.mesh, PartitionSpec())
    on_mesh = lambda x: isinstance(getattr(x, "sharding", None), NamedSharding)
    scorer = jax.tree.map(lambda x: x if on_mesh(x) else jax.device_put(x, whole), scorer)
  prompt_arrays = tuple(jnp.asarray(a) for a in prompt_rows(ids, rows, state.batch, lm.pad_id()))
  prompt_arrays = constrain_rows(prompt_arrays, lm.shard, put=True)
  padded = np.zeros(state.batch // rows, np.uint32)
  padded[: len(ids)] = seeds
  prefix = ANSWER_PREFIX[mode]
  answer = None if prefix is None else answer_table(lm.tokenizer, lm.config.vocab_size, prefix)
  p = cfg.sampling
  graph, params = lm.decode_view()
  plan = SearchPlan(
    graph=graph,
    shard=lm.shard,
    groups=groups,
    width=width,
    n=cfg.n,
    lookahead=cfg.lookahead,
    history=bucket(cfg.max_steps, 8),
    dedupe=cfg.dedupe,
    spec=spec,
    num_layers=lm.config.num_layers,
    capture=capture,
    greedy=p.greedy,
    top_k=p.top_k,
    filtered=p.filtered,
  )
  env = SearchEnv(
    params=params,
    scorer=scorer,
    rule=smp.stop,
    answer=answer,
    eos_mask=jnp.asarray(lm.eos_mask()),
    temperature=jnp.float32(p.temperature),
    top_p=jnp.float32(p.top_p),
    max_steps=jnp.int32(cfg.max_steps),
    prompt_keys=decode_state.prompt_keys(cfg.seed, padded),
    prompts=prompt_arrays,
  )
  state, book = _search(env, state, plan=plan)
  out = FinalRows(*jax.device_get((state.tokens, state.lengths, book)))
  if out.book.bad.any():
    where = f"{cfg.strategy}, in {int((out.book.bad > 0).sum())} prompt(s)"
    raise nonfinite_error(scorer, int(out.book.bad.sum()), where)
  return results(out, len(ids), plan, lm.eos_mask())
