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

Finishing: a row is finished by EOS, its token budget ('length'), the cache ('cache_full'), an answer line (line
mode: a step with a line that starts with '<Answer>', 'answer'; the answer line is a step like the others, scored
when it is sampled) or its max_steps-th step ('max_steps'). A finished row is not expanded again: it keeps its slot
in its group to the end, and of its N copies only the first stands in later selections. The step that holds only a
final EOS token is not a step of the returned candidate (its response drops the EOS, as Best-of-N's does); a last
step that ended on EOS keeps the score it was selected by, which read the EOS token too.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int, Key

from reprobe_jax.errors import ConfigError, shape_errors
from reprobe_jax.features import FeatureSpec, union_capture
from reprobe_jax.models import CaptureSpec, LanguageModel
from reprobe_jax.models import decoding
import reprobe_jax.models.decode_state as decode_state
from reprobe_jax.models.decode_state import FINISH_CACHE_FULL, FINISH_EOS, FINISH_LENGTH, FINISH_STOP, DecodeState, StopRule
from reprobe_jax.models.forward import StaticGraph
from reprobe_jax.models.sampling import bucket
from reprobe_jax.models.sharding import ShardingCtx
from reprobe_jax.models.xla_options import decode_jit
from reprobe_jax.scorers import StepScorer, inputs_from_state, prompt_rows, take_carry
from reprobe_jax.steps import ANSWER_PREFIX, STEP_MODE, StepBoundary, answer_lines, answer_table
from reprobe_jax.tts.checks import prompt_seeds_for, scorer_spec
from reprobe_jax.tts.config import SearchConfig
from reprobe_jax.tts.result import Candidate, PromptResult

FINISH_ANSWER, FINISH_MAX_STEPS = 4, 5
REASONS = {FINISH_LENGTH: "length", FINISH_EOS: "eos", FINISH_CACHE_FULL: "cache_full", FINISH_ANSWER: "answer",
           FINISH_MAX_STEPS: "max_steps"}
GOES_ON = -1  # the reason of a row that is not finished
# ------------------------------------------------------------------------------------------------ keys


def round_keys(prompt_keys, round_, rows_per_prompt: int) -> jax.Array:
  """[P * rows] keys of the rows after round `round_` - 1's selection (round_ >= 1): row j of prompt p draws from
  fold_in(fold_in(prompt_keys[p], round_), j), so the N copies of a survivor sample distinct next steps and a prompt's
  streams do not depend on the batch. Round 0's keys are the prefill's `decode_state.row_keys(prompt_keys, rows)`."""
  folded = jax.vmap(lambda k: jax.random.fold_in(k, round_))(prompt_keys)
  return decode_state.row_keys(folded, rows_per_prompt)


# ------------------------------------------------------------------------------------------------ the device loop


@dataclasses.dataclass(frozen=True)
class _Plan:
  """Everything static about one search program (it keys the jit cache): the model's graph and sharding, the
  search's shape, what is captured and how tokens are picked."""

  graph: StaticGraph  # the model's graphdef (`LanguageModel.decode_view`)
  shard: ShardingCtx | None
  groups: int
  width: int
  n: int
  lookahead: int
  history: int  # step slots per row (max_steps, bucketed)
  spec: FeatureSpec | None
  num_layers: int
  capture: CaptureSpec
  greedy: bool
  top_k: int
  filtered: bool
  dedupe: bool = False

  @property
  def rows_per_prompt(self) -> int:
    return self.groups * self.width * self.n


@struct.dataclass
class _Env:
  """What every round reads that is traced and fixed for the whole search: new prompts, seeds, temperatures,
  step budgets and stop tables in the same buckets compile nothing."""

  params: Any  # the model's parameters (`LanguageModel.decode_view`)
  scorer: StepScorer
  rule: StopRule | Any  # the step boundary: a StopRule or a compiled StopTable (`advance`)
  answer: Int[Array, "states vocab"] | None  # the answer-line automaton (`answer_table`), None: no answer lines
  eos_mask: Bool[Array, " vocab"]
  temperature: Float[Array, ""]
  top_p: Float[Array, ""]
  max_steps: Int[Array, ""]
  prompt_keys: Key[Array, " p"]
  prompts: tuple[Int[Array, "r tp"], Bool[Array, "r tp"]]  # every row's prompt, left-padded (`prompt_rows`)


@struct.dataclass
class _Book:
  """Per-row search bookkeeping carried (and gathered) with the decode rows; R rows, H = history, P prompts."""

  ended: Bool[Array, " r"]  # finished (not expanded again)
  reason: Int[Array, " r"]  # REASONS code, GOES_ON while not ended
  primary: Bool[Array, " r"]  # the first copy of its source row (of a finished row only it stands)
  n_steps: Int[Array, " r"]  # steps selected so far
  scores: Float[Array, "r h"]  # each selected step's score
  spans: Int[Array, "r h 2"]  # each selected step's token span
  last: Float[Array, " r"]  # the newest selected step's score (the row's rank)
  sampled: Int[Array, " p"]  # steps sampled per prompt (discarded candidates and lookahead included)
  generated: Int[Array, " p"]  # tokens generated per prompt (lookahead included)


class _Loop(NamedTuple):
  """The rounds' `while_loop` carry."""

  state: DecodeState
  book: _Book
  carry: Any  # the scorer's carry for every row (`StepScorer.init_carry`); () unless it is stateful
  round: Int[Array, ""]


class _Lookahead(NamedTuple):
  """What a lookahead leaves: the state copy it decoded on, and per row [R] the span of its last step (the
  candidate's own where no lookahead step came), its lookahead steps and tokens, and the score of its last lookahead
  step (NaN where none came, or where the scorer is stateless: the caller scores `spans`)."""

  state: DecodeState
  spans: Int[Array, "r 2"]
  steps: Int[Array, " r"]
  tokens: Int[Array, " r"]
  score: Float[Array, " r"]


def _decode(plan: _Plan, env: _Env, state: DecodeState, *, greedy: bool) -> DecodeState:
  return decoding.decode_in_jit(plan.graph, env.params, state, env.rule, env.eos_mask, env.temperature, env.top_p,
                                jnp.int32(state.buffer_len), greedy=greedy, top_k=plan.top_k, filtered=plan.filtered,
                                capture=plan.capture, shard=plan.shard)


def _per_prompt(x, p: int):
  return x.reshape((p, -1) + x.shape[1:])


def _score(plan: _Plan, env: _Env, state: DecodeState, spans, p: int) -> Float[Array, " r"]:
  """[R] scores of each row's step spans [R, 2], the scorer vmapped over prompts (row index = index in its prompt)."""
  inputs = inputs_from_state(state, plan.spec, plan.num_layers, env.prompts)
  split = jax.tree.map(lambda x: _per_prompt(x, p), inputs)
  out = jax.vmap(env.scorer.score_newest)(split, _per_prompt(spans, p))  # [P, rows]
  return out.reshape(-1).astype(jnp.float32)


def _advance(plan: _Plan, env: _Env, carry, state: DecodeState, spans, rows):
  """A stateful scorer over all R rows at once: (scores [R] float32, carry) of the step spans [R, 2] of the rows
  `rows` [R] bool; every other row gets an empty span (NaN, its carry kept)."""
  out, carry = env.scorer.advance(carry, inputs_from_state(state, plan.spec, plan.num_layers, env.prompts),
                                  jnp.where(rows[:, None], spans, 0))
  return out.astype(jnp.float32), carry


def _reason(env: _Env, state: DecodeState, spans, steps) -> Int[Array, " r"]:
  """[R] int32: why each row that just decoded is finished, or GOES_ON (paused at a boundary with room to go on)."""
  hit = answer_lines(env.answer, state.tokens, spans)
  paused = jnp.where(hit, FINISH_ANSWER, jnp.where(steps >= env.max_steps, FINISH_MAX_STEPS,
                                                   jnp.where(state.lengths >= state.budget, FINISH_LENGTH, GOES_ON)))
  return jnp.where(state.finish == FINISH_STOP, paused, state.finish).astype(jnp.int32)


def _lookahead(plan: _Plan, env: _Env, state: DecodeState, go, spans, carry) -> _Lookahead:
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
    go = new & (state.finish == FINISH_STOP) & ~answer_lines(env.answer, state.tokens, newest) & (
        state.lengths < state.budget)
  return _Lookahead(state=state, spans=spans, steps=steps, tokens=tokens, score=last)


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
  same = ((g(h1)[:, :, None] == g(h1)[:, None, :]) & (g(h2)[:, :, None] == g(h2)[:, None, :])
          & (g(state.lengths)[:, :, None] == g(state.lengths)[:, None, :]) & g(live)[:, None, :])  # [G, i, j]
  idx = jnp.arange(rows_per_group)
  k = g(key)
  before = (k[:, None, :] < k[:, :, None]) | ((k[:, None, :] == k[:, :, None]) & (idx[None, :] < idx[:, None]))
  return jnp.any(same & before, axis=-1).reshape(-1)


def _round(plan: _Plan, env: _Env, loop: _Loop) -> _Loop:
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
  kept = order[:, :plan.width]  # [P * G, W]
  src = jnp.repeat((jnp.arange(kept.shape[0])[:, None] * rows_per_group + kept).reshape(-1), plan.n)  # [R]

  now = live & (reason != GOES_ON)
  slot = jnp.where(live, book.n_steps, plan.history)  # out of range = dropped
  rows = jnp.arange(r_rows)
  book = book.replace(
      ended=book.ended | now, reason=jnp.where(now, reason, book.reason),
      scores=book.scores.at[rows, slot].set(score, mode="drop"),
      spans=book.spans.at[rows, slot].set(spans, mode="drop"),
      n_steps=book.n_steps + live, last=jnp.where(live, score, book.last),
      sampled=book.sampled + jnp.sum(_per_prompt(live + la_steps, p), axis=1, dtype=jnp.int32),
      generated=book.generated + jnp.sum(_per_prompt(state.lengths - before + la_tokens, p), axis=1,
                                         dtype=jnp.int32))
  g = lambda x: jnp.take(x, src, axis=0)
  book = book.replace(ended=g(book.ended), reason=g(book.reason), n_steps=g(book.n_steps), scores=g(book.scores),
                      spans=g(book.spans), last=g(book.last), primary=rows % plan.n == 0)
  carry = take_carry(carry, src)
  state = decode_state.take(state, src)
  state = decode_state.rekey(state, round_keys(env.prompt_keys, loop.round + 1, plan.rows_per_prompt))
  state = decode_state.resume(state, ~book.ended)
  return _Loop(state=state, book=book, carry=carry, round=loop.round + 1)


def _search_impl(env: _Env, state: DecodeState, *, plan: _Plan) -> tuple[DecodeState, _Book]:
  """Rounds until every kept row is finished (at most env.max_steps, traced): (the final state, the rows' book).
  The state (donated) is returned so that the loop runs in its buffers."""
  r_rows = state.batch
  p = r_rows // plan.rows_per_prompt
  with shape_errors("search: every row's prompt [R, Tp] and one key per prompt"):  # at trace time, before the loop
    chex.assert_shape(env.prompts, (r_rows, None))
    chex.assert_equal_shape(env.prompts)
    chex.assert_shape(env.prompt_keys, (p,))
  book = _Book(ended=state.done, reason=jnp.where(state.done, FINISH_LENGTH, GOES_ON).astype(jnp.int32),
               primary=jnp.ones((r_rows,), bool), n_steps=jnp.zeros((r_rows,), jnp.int32),
               scores=jnp.full((r_rows, plan.history), jnp.nan, jnp.float32),
               spans=jnp.zeros((r_rows, plan.history, 2), jnp.int32), last=jnp.full((r_rows,), jnp.nan, jnp.float32),
               sampled=jnp.zeros((p,), jnp.int32), generated=jnp.zeros((p,), jnp.int32))
  carry = ()
  if env.scorer.stateful:  # room: the response buffer, one token per step slot and per lookahead step
    carry = env.scorer.init_carry(inputs_from_state(state, plan.spec, plan.num_layers, env.prompts),
                                  state.buffer_len + plan.history + plan.lookahead)
  body = functools.partial(_round, plan, env)
  cond = lambda loop: (loop.round < env.max_steps) & jnp.any(~loop.book.ended)
  out = jax.lax.while_loop(cond, body, _Loop(state=state, book=book, carry=carry, round=jnp.zeros((), jnp.int32)))
  return out.state, out.book


_search, _search_in_jit = decode_jit(static_argnames=("plan",), donate_argnames=("state",))(_search_impl)


# ------------------------------------------------------------------------------------------------ the host shell


def run_search(lm: LanguageModel, scorer: StepScorer, prompts, cfg: SearchConfig, *, groups: int, width: int,
               mode: str = "line", feature_spec: FeatureSpec | None = None,
               prompt_seeds: Sequence[int] | None = None) -> list[PromptResult]:
  """Runs the search of docs/method.md §A7 with `groups` groups of `width` rows per prompt (groups * width = cfg.beams) over
  all prompts (text or token ids) at once; one PromptResult per prompt: its groups' kept rows (each group's best
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
  smp = lm.sampler(cfg.sampling, capture=capture,
                   stop=StepBoundary(STEP_MODE[mode]).compile(lm.tokenizer, lm.config.vocab_size))
  rows = cfg.beams * cfg.n
  state = smp.prefill(ids, max_new_tokens=cfg.max_new_tokens, n=rows, seed=cfg.seed, prompt_seeds=seeds)
  prompt_arrays = tuple(jnp.asarray(a) for a in prompt_rows(ids, rows, state.batch, lm.pad_id()))
  padded = np.zeros(state.batch // rows, np.uint32)
  padded[:len(ids)] = seeds
  prefix = ANSWER_PREFIX[mode]
  answer = None if prefix is None else answer_table(lm.tokenizer, lm.config.vocab_size, prefix)
  p = cfg.sampling
  graph, params = lm.decode_view()
  plan = _Plan(graph=graph, shard=lm.shard, groups=groups, width=width, n=cfg.n, lookahead=cfg.lookahead,
               history=bucket(cfg.max_steps, 8), dedupe=cfg.dedupe, spec=spec, num_layers=lm.config.num_layers,
               capture=capture, greedy=p.greedy, top_k=p.top_k, filtered=p.filtered)
  env = _Env(params=params, scorer=scorer, rule=smp.stop, answer=answer, eos_mask=jnp.asarray(lm.eos_mask()),
             temperature=jnp.float32(p.temperature), top_p=jnp.float32(p.top_p), max_steps=jnp.int32(cfg.max_steps),
             prompt_keys=decode_state.prompt_keys(cfg.seed, padded), prompts=prompt_arrays)
  state, book = _search(env, state, plan=plan)
  out = _Rows(*jax.device_get((state.tokens, state.lengths, book)))
  return _results(out, len(ids), plan, lm.eos_mask())


class _Rows(NamedTuple):
  """The search's final rows on the host: their tokens [R, N], lengths [R] and book."""

  tokens: np.ndarray
  lengths: np.ndarray
  book: _Book


def _results(out: _Rows, n_prompts: int, plan: _Plan, eos: np.ndarray) -> list[PromptResult]:
  book = out.book
  results = []
  for p in range(n_prompts):
    cands = []
    for g in range(plan.groups):
      rows = [(p * plan.groups + g) * plan.width * plan.n + w * plan.n for w in range(plan.width)]
      last = book.last
      rows.sort(key=lambda r: (bool(np.isnan(last[r])), 0.0 if np.isnan(last[r]) else float(last[r])))
      cands += [_candidate(out, r, eos) for r in rows]
    results.append(PromptResult(candidates=tuple(cands), sampled_steps=int(book.sampled[p]),
                                generated_tokens=int(book.generated[p])))
  return results


def _candidate(out: _Rows, r: int, eos: np.ndarray) -> Candidate:
  book = out.book
  reason = int(book.reason[r])
  ids = [int(t) for t in out.tokens[r, :int(out.lengths[r])]]
  if reason == FINISH_EOS and ids and eos[ids[-1]]:
    ids = ids[:-1]
  steps, scores = [], []
  n = int(book.n_steps[r])
  for k in range(n):
    start, end = (int(v) for v in book.spans[r, k])
    end = min(end, len(ids))
    start = min(start, end)
    if k == n - 1 and start == end == len(ids) and reason == FINISH_EOS and n > 1:
      continue  # the step that held only the final EOS
    steps.append((start, end))
    scores.append(float(book.scores[r, k]))
  return Candidate(response_ids=tuple(ids), steps=tuple(steps), step_scores=tuple(scores),
                   finish_reason=REASONS[reason])
