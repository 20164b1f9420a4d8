"""The open sampler: jitted prefill, decode, force and fork over the decode state (`decode_state`), which search
and RL compose with the row operations there (take, resume, share, rekey, newest_step_spans).

    state = prefill(...)                      # prompts -> pending next-token logits, empty response buffers
    state = decode(..., state, stop_rule)     # until every live row hits EOS, a step boundary, its budget or the
                                              # cache end
    scores = scorer(inputs_from_state(state), newest_step_spans(state))   # on device, no second forward
    state = take(state, keep_rows)            # branch samples or keep beam survivors
    state = force(..., state, suffix_ids)     # append forced text (`</think>`, a probe suffix) to chosen rows
    state = resume(state, rows)               # let paused rows go on; their newest step starts here

Every response token i of row b has, in the state's buffers, its id, its log-probability at temperature 1 under
the model (sampled or forced alike), and the features of the state that predicted it (docs/method.md §A3: next-token
aligned), captured inside the compiled loop. Static (compile-time): the graph, the capture spec, the sharding,
buffer and cache sizes, greedy, top_k and whether top-p filtering is on. Traced: everything else (prompts, budgets,
temperature, top_p, EOS and stop tables, the step budget), so new prompts and new boundaries in the same buckets
compile nothing.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from reprobe_jax.models.capture import CaptureSpec, TokenFeatures
from reprobe_jax.models.decode_state import (
  ENDS_AFTER,
  ENDS_BEFORE,
  FINISH_CACHE_FULL,
  FINISH_EOS,
  FINISH_LENGTH,
  FINISH_STOP,
  DecodeState,
  StopRule,
  map_row_keys,
)
from reprobe_jax.models.forward import logit_stats
from reprobe_jax.models.kv_cache import KVCache
from reprobe_jax.models.sampling import extend_in_jit, sample_token
from reprobe_jax.models.sharding import ShardingCtx
from reprobe_jax.models.xla_options import decode_jit


def _features_of(logits, captured: TokenFeatures, capture: CaptureSpec) -> TokenFeatures:
  """The per-token values of positions [B, ...] from their logits [B, V] and captured values: what `features` holds
  (the token's own log-prob is recorded apart, in `logprobs`)."""
  stats = logit_stats(logits[:, None], jnp.zeros(logits.shape[:1] + (1,), jnp.int32), capture)
  return captured.with_stats({k: v[:, 0] for k, v in stats.items()})


def _at(captured: dict) -> TokenFeatures:
  """A decoder's captured output at every position: hidden states [B, T, D], attention window [B, T, L, H, W]."""
  return TokenFeatures.from_captured(captured)


def _last(captured: dict) -> TokenFeatures:
  """The same at the last position: [B, D], [B, L, H, W]."""
  return jax.tree.map(lambda x: x[:, -1], _at(captured))


def _feature_buffers(feats0: TokenFeatures, b: int, n: int) -> TokenFeatures:
  return jax.tree.map(lambda v: jnp.zeros((b, n) + v.shape[1:], v.dtype), feats0)


def _bmask(mask, x):
  """Broadcasts a [B] or [B, T] mask over the trailing axes of x."""
  return mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))


def _prefill_impl(
  graphdef,
  params,
  cache: KVCache,
  input_ids,
  attention_mask,
  budget,
  rng,
  *,
  buffer_len: int,
  capture: CaptureSpec = CaptureSpec(),
  shard: ShardingCtx | None = None,
) -> DecodeState:
  """Prompts [B, P] (left-padded: mask 0 = padding) written into an empty `cache` (donated; its free slots hold the
  response and forced text) -> a state whose rows wait for their first token.

  buffer_len: N, the response tokens a row can hold; budget [B]: per-row token budget (<= N; 0 makes a row start
  finished, e.g. batch padding).
  """
  logits, captured, cache = extend_in_jit(
    graphdef, params, cache, input_ids, attention_mask, capture=capture, shard=shard, lockstep=True, last_only=True
  )
  return _fresh_state(cache, logits[:, -1], _last(captured), budget, rng, buffer_len, capture)


prefill, prefill_in_jit = decode_jit(
  static_argnames=("graphdef", "capture", "shard", "buffer_len"), donate_argnames=("cache",)
)(_prefill_impl)


def _fresh_state(cache, logits, pending, budget, rng, buffer_len, capture):
  b = logits.shape[0]
  feats0 = _features_of(logits, pending, capture)
  budget = jnp.minimum(jnp.asarray(budget, jnp.int32), buffer_len)
  return DecodeState(
    cache=cache,
    logits=logits,
    pending=pending,
    tokens=jnp.zeros((b, buffer_len), jnp.int32),
    logprobs=jnp.zeros((b, buffer_len), jnp.float32),
    features=_feature_buffers(feats0, b, buffer_len),
    slots=jnp.full((b, buffer_len), -1, jnp.int32),
    lengths=jnp.zeros((b,), jnp.int32),
    step_start=jnp.zeros((b,), jnp.int32),
    step_end=jnp.zeros((b,), jnp.int32),
    again=jnp.zeros((b,), bool),
    budget=budget,
    done=budget <= 0,
    finish=jnp.full((b,), FINISH_LENGTH, jnp.int32),
    stop_state=jnp.zeros((b,), jnp.int32),
    rng=rng,
  )


def start_rule(state: DecodeState) -> DecodeState:
  """Puts every row's stop automaton in its initial state (0, for every rule): the start of a response."""
  return state.replace(stop_state=jnp.zeros_like(state.stop_state))


def _write(buf, rows_pos, value, ok):
  """buf [B, N, ...] <- value [B, ...] at (b, rows_pos[b]) where ok[b]; other rows untouched (dropped writes)."""
  b, n = buf.shape[:2]
  pos = jnp.where(ok, rows_pos, n)  # out of range = dropped
  return buf.at[jnp.arange(b), pos].set(value.astype(buf.dtype), mode="drop")


class _DecodeLoop(NamedTuple):
  """The decode loop's carry: the state and the loop iterations run so far."""

  state: DecodeState
  steps: Int[Array, ""]


def _decode_impl(
  graphdef,
  params,
  state: DecodeState,
  rule: StopRule,
  eos_mask,
  temperature,
  top_p,
  max_steps,
  *,
  greedy: bool,
  top_k: int,
  filtered: bool = True,
  capture: CaptureSpec = CaptureSpec(),
  shard: ShardingCtx | None = None,
) -> DecodeState:
  """Samples tokens for every live row until each is done (EOS, step boundary, budget, cache end) or `max_steps`
  (traced) loop iterations have run. eos_mask [V] bool. `filtered` (static): whether top-p is applied (top_p < 1);
  top_k 0 = off. Token log-probs and entropies are of the unfiltered distribution at temperature 1."""

  def cond(c: _DecodeLoop):
    return (c.steps < max_steps) & jnp.any(~c.state.done)

  def body(c: _DecodeLoop) -> _DecodeLoop:
    s = c.state
    if s.rng.ndim == 0:  # one key for the batch: a row's draws depend on the batch it sits in
      rng, sub = jax.random.split(s.rng)
      tok = sample_token(s.logits, sub, temperature, top_p, greedy=greedy, top_k=top_k, filtered=filtered)  # [B]
    else:  # [B] keys: each row splits its own key per token and draws alone, whatever the batch
      pair = jax.vmap(jax.random.split)(s.rng)  # [B, 2]
      rng = pair[:, 0]
      draw = lambda lg, k: sample_token(lg[None], k, temperature, top_p, greedy=greedy, top_k=top_k, filtered=filtered)[
        0
      ]
      tok = jax.vmap(draw)(s.logits, pair[:, 1])  # [B]
    live = ~s.done
    z = s.logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(z, axis=-1)
    tok_logp = jnp.take_along_axis(z, tok[:, None], axis=-1)[:, 0] - lse
    feats = _features_of(s.logits, s.pending, capture)
    tokens = _write(s.tokens, s.lengths, tok, live)
    logprobs = _write(s.logprobs, s.lengths, tok_logp, live)
    bufs = jax.tree.map(lambda buf, v: _write(buf, s.lengths, v, live), s.features, feats)
    lengths = s.lengths + live.astype(jnp.int32)
    new_q, ends = rule.advance(s.stop_state, tok)
    stop_state = jnp.where(live, new_q, s.stop_state)
    is_eos = live & eos_mask[tok]
    is_stop = live & ~is_eos & (ends != 0)
    is_len = live & ~is_eos & ~is_stop & (lengths >= s.budget)
    still = live & ~is_eos & ~is_stop & ~is_len
    room = s.cache.index < s.cache.size
    # A row that paused at a boundary still reads its boundary token into the cache, so it can resume exactly.
    feed = (still | is_stop) & room
    finish = jnp.where(is_eos, FINISH_EOS, jnp.where(is_stop, FINISH_STOP, s.finish))
    finish = jnp.where(is_len, FINISH_LENGTH, finish)
    finish = jnp.where((still | is_stop) & ~room, FINISH_CACHE_FULL, finish)
    done = s.done | ~still | ~room
    ended = live & done
    # Where the newest step ends: after this token, or before it (the token opens the next step); a row that ends
    # on EOS, its budget or the cache closes its step at its length.
    before = is_stop & ((ends & ENDS_BEFORE) != 0)
    step_end = jnp.where(ended, jnp.where(before, s.lengths, lengths), s.step_end)
    again = jnp.where(ended, before & ((ends & ENDS_AFTER) != 0), s.again)

    def step(cache):
      lg, capt, cache = extend_in_jit(
        graphdef, params, cache, tok[:, None], feed[:, None], capture=capture, shard=shard
      )
      return lg[:, -1], _last(capt), cache

    slots = _write(s.slots, s.lengths, s.cache.index, feed)
    new_logits, new_pending, cache = jax.lax.cond(jnp.any(feed), step, lambda c: (s.logits, s.pending, c), s.cache)
    # Rows that fed no token keep their pending logits.
    keep = lambda new, old: jnp.where(_bmask(feed, new), new, old)
    new_logits = keep(new_logits, s.logits)
    new_pending = jax.tree.map(keep, new_pending, s.pending)
    return _DecodeLoop(
      s.replace(
        cache=cache,
        logits=new_logits,
        pending=new_pending,
        tokens=tokens,
        logprobs=logprobs,
        features=bufs,
        slots=slots,
        lengths=lengths,
        done=done,
        finish=finish,
        stop_state=stop_state,
        step_end=step_end,
        again=again,
        rng=rng,
      ),
      c.steps + 1,
    )

  return jax.lax.while_loop(cond, body, _DecodeLoop(state, jnp.zeros((), jnp.int32))).state


decode, decode_in_jit = decode_jit(
  static_argnames=("graphdef", "capture", "shard", "greedy", "top_k", "filtered"), donate_argnames=("state",)
)(_decode_impl)


def _force_impl(
  graphdef,
  params,
  state: DecodeState,
  rule: StopRule,
  forced_ids,
  forced_mask,
  *,
  capture: CaptureSpec = CaptureSpec(),
  shard: ShardingCtx | None = None,
) -> DecodeState:
  """Appends forced tokens [B, K] (left-padded per row: mask 0 = none; a row with no forced token is untouched) to
  the response of each row, through the model, recording their log-probs (teacher-forced, docs/method.md §B1's Acc) and
  features like sampled tokens. Forced tokens move the stop automaton but never end a step. A row whose tokens do
  not fit its buffer or the cache finishes with 'length' / 'cache_full' and gets none of them."""
  k = forced_ids.shape[1]
  m = forced_mask.astype(bool)
  count = jnp.sum(m, axis=1, dtype=jnp.int32)  # [B]
  fits_cache = state.cache.index + count <= state.cache.size
  fits_buf = state.lengths + count <= state.buffer_len
  chosen = (count > 0) & fits_buf & fits_cache
  full = (count > 0) & ~chosen
  finish = jnp.where(full & ~fits_cache, FINISH_CACHE_FULL, jnp.where(full, FINISH_LENGTH, state.finish))
  m = m & chosen[:, None]

  def run(cache):
    lg, capt, cache = extend_in_jit(graphdef, params, cache, forced_ids, m, capture=capture, shard=shard)
    return lg, _at(capt), cache

  def skip(cache):
    b = forced_ids.shape[0]
    v = state.logits.shape[-1]
    at = jax.tree.map(lambda x: jnp.zeros((b, k) + x.shape[1:], x.dtype), state.pending)
    return jnp.zeros((b, k, v), state.logits.dtype), at, cache

  logits, at, cache = jax.lax.cond(jnp.any(chosen), run, skip, state.cache)
  first = k - count  # [B] index of each row's first forced token in the block
  pos = jnp.arange(k)[None, :]
  is_first = pos == first[:, None]  # [B, K]
  # The state that predicted forced token j: the row's pending state for the first, position j - 1 otherwise.
  prev_logits = jnp.concatenate([state.logits[:, None], logits[:, :-1]], axis=1)  # [B, K, V]
  src_logits = jnp.where(is_first[..., None], state.logits[:, None], prev_logits)
  src_capt = jax.tree.map(
    lambda p, a: jnp.where(_bmask(is_first, a), p[:, None], jnp.concatenate([p[:, None], a[:, :-1]], axis=1)),
    state.pending,
    at,
  )
  z = src_logits.astype(jnp.float32)
  tok_logp = jnp.take_along_axis(z, forced_ids[..., None], axis=-1)[..., 0] - jax.nn.logsumexp(z, axis=-1)
  feats = src_capt.with_stats(logit_stats(z, forced_ids, capture))  # [B, K, ...]
  slot = state.lengths[:, None] + pos - first[:, None]  # [B, K] response index of each forced token
  b, n = state.tokens.shape
  where = jnp.where(m, slot, n)
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], where.shape)
  put = lambda buf, val: buf.at[rows, where].set(val.astype(buf.dtype), mode="drop")
  tokens = put(state.tokens, forced_ids)
  logprobs = put(state.logprobs, tok_logp)
  bufs = jax.tree.map(put, state.features, feats)
  slots = put(state.slots, state.cache.index[:, None] + pos - first[:, None])

  def adv(q, j):
    nq, _ = rule.advance(q, forced_ids[:, j])
    return jnp.where(m[:, j], nq, q), None

  stop_state, _ = jax.lax.scan(adv, state.stop_state, jnp.arange(k))
  last = lambda new, old: jnp.where(_bmask(chosen, old), new[:, -1], old)
  return state.replace(
    cache=cache,
    logits=last(logits, state.logits),
    pending=jax.tree.map(last, at, state.pending),
    tokens=tokens,
    logprobs=logprobs,
    features=bufs,
    slots=slots,
    lengths=state.lengths + jnp.where(chosen, count, 0),
    done=state.done | full,
    finish=finish,
    stop_state=stop_state,
  )


force, force_in_jit = decode_jit(static_argnames=("graphdef", "capture", "shard"), donate_argnames=("state",))(
  _force_impl
)


def _fork_impl(
  graphdef,
  params,
  state: DecodeState,
  cut_token,
  *,
  n: int,
  suffix_size: int,
  capture: CaptureSpec = CaptureSpec(),
  shard: ShardingCtx | None = None,
  buffer_len: int | None = None,
) -> DecodeState:
  """n new rows per cut of every row, each continuing the row's context up to and including its response token
  cut_token[b, c] (cut_token [B, C] >= 0; C * n rows per row, in (row, cut, sample) order), with empty responses.

  The new rows read the row's cache as a shared prefix cut before that token's slot (no copy; exact for causal
  attention: the slots before the cut hold what a fresh forward of the context would), and the token itself is
  fed again into their own suffix caches, which yields the next-token distribution after it. This is how SPAE
  probes every step boundary of a trajectory at once (docs/method.md §B1). The state must have no shared prefix itself
  (`flatten` it first). Call `start_rule` before decoding the new rows with a stop rule. buffer_len: the new rows'
  response buffer (default the state's; probes that write a few tokens need far less).
  """
  if state.cache.prefix is not None:
    raise ValueError("fork needs a state without a shared prefix; call flatten(state) first")
  b, c = cut_token.shape
  per = c * n
  rows = jnp.repeat(jnp.arange(b), per)  # [B * C * n]
  tok = jnp.repeat(cut_token.reshape(-1), n)  # [B * C * n]
  slot = state.slots[rows, tok]
  cache = state.cache.share(per, suffix_size, cut=slot)
  ids = state.tokens[rows, tok][:, None]
  logits, captured, cache = extend_in_jit(
    graphdef, params, cache, ids, jnp.ones_like(ids), capture=capture, shard=shard
  )
  bn, nbuf = rows.shape[0], state.buffer_len if buffer_len is None else buffer_len
  rng = map_row_keys(state.rng, lambda r: r[rows])  # per-row keys: each new row starts from its source row's key
  return _fresh_state(cache, logits[:, -1], _last(captured), jnp.full((bn,), nbuf, jnp.int32), rng, nbuf, capture)


fork, fork_in_jit = decode_jit(static_argnames=("graphdef", "capture", "shard", "n", "suffix_size", "buffer_len"))(
  _fork_impl
)
