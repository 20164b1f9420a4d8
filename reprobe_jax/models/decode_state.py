"""The decode state of the open sampler (`decoding`) and the pure operations on its rows that search and RL compose.

    state = take(state, keep_rows)            # branch samples or keep beam survivors
    state = resume(state, rows)               # let paused rows go on; their newest step starts here
    state = share(state, n=4, suffix_size=s)  # n continuations of every row over its cache as a shared prefix
    state = rekey(state, row_keys(prompt_keys(seed, prompt_seeds), n))   # each row its own random stream
    spans = newest_step_spans(state)          # [B, 2] the newest step of every paused row, for a step scorer

Finish codes: FINISH_LENGTH (the row's token budget), FINISH_EOS, FINISH_STOP (a step boundary: the row is paused
and may be resumed), FINISH_CACHE_FULL (the cache has no slot left for the row's next token: never a silent stop).
A stop rule is data: `StopRule` here, or a step boundary compiled for the tokenizer by `reprobe_jax.steps`, each
with `advance(state [B], tok [B]) -> (state [B], ends [B])` and the end codes ENDS_BEFORE / ENDS_AFTER.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Float, Int, Key

from reprobe_jax.errors import ConfigError
from reprobe_jax.models.capture import TokenFeatures
from reprobe_jax.models.kv_cache import KVCache

FINISH_LENGTH, FINISH_EOS, FINISH_STOP, FINISH_CACHE_FULL = 0, 1, 2, 3
FINISH_NAMES = {FINISH_LENGTH: "length", FINISH_EOS: "eos", FINISH_STOP: "stop", FINISH_CACHE_FULL: "cache_full"}


ENDS_BEFORE, ENDS_AFTER = (
  1,
  2,
)  # a stop rule's codes: the step ended before / after the token (reprobe_jax.steps.boundary)


@struct.dataclass
class StopRule:
  """The plain rule "a token whose own text ends with a delimiter ends a step" (`LanguageModel.stop_token_mask`).
  Exact multi-token boundaries (a '.' and a '\n\n' in two tokens, sentence ends seen only at the next word) are
  `reprobe_jax.steps.boundary.StepBoundary(...).compile(tokenizer)`, a `StopTable` with the same `advance` interface:
  (state [B] int32, tok [B] int32) -> (state [B], ends [B] int32 of ENDS_BEFORE | ENDS_AFTER)."""

  fires: Bool[Array, " vocab"]

  @classmethod
  def from_mask(cls, mask) -> "StopRule":
    return cls(fires=jnp.asarray(mask, bool))

  @property
  def vocab_size(self) -> int:
    return self.fires.shape[-1]

  def advance(self, state, tok):
    return state, jnp.where(self.fires[tok], ENDS_AFTER, 0).astype(jnp.int32)


@struct.dataclass
class DecodeState:
  """Rows of a batch being decoded. N = response buffer length; features hold `capture`'s per-token values."""

  cache: KVCache
  logits: Float[Array, "batch vocab"]  # the next-token logits of each row
  pending: TokenFeatures  # the captured values [B, ...] of the positions that produced `logits` (hidden, attn)
  tokens: Int[Array, "batch n"]  # pad after each row's length
  logprobs: Float[Array, "batch n"]  # log p(token) at temperature 1, 0 past the length
  features: TokenFeatures  # [B, N, ...] per response token (hidden states, attention window, top-K, entropy,
  #                          self-certainty, as `capture` asks), zero past the length
  slots: Int[Array, "batch n"]  # the cache slot holding response token i's keys (-1 until it is fed)
  lengths: Int[Array, " batch"]  # response tokens so far
  step_start: Int[Array, " batch"]  # the newest step is tokens [step_start, step_end) once the row paused/ended
  step_end: Int[Array, " batch"]  # (a step that ended *before* the last token leaves that token to the next step)
  again: Bool[Array, " batch"]  # the last token also closed a step of its own; resume pauses once more for it
  budget: Int[Array, " batch"]  # the most response tokens a row may have
  done: Bool[Array, " batch"]
  finish: Int[Array, " batch"]  # finish code (meaningful where done)
  stop_state: Int[Array, " batch"]  # state of the stop automaton
  rng: Key[Array, ""] | Key[Array, " batch"]  # one key for the batch, or one stream per row (`rekey`, `row_keys`)

  @property
  def batch(self) -> int:
    return self.lengths.shape[0]

  @property
  def buffer_len(self) -> int:
    return self.tokens.shape[1]


@jax.jit
def resume(state: DecodeState, rows) -> DecodeState:
  """Lets rows [B] bool that paused at a step boundary go on; their next step starts where the newest one ended.
  A row whose last token also closed a step of its own pauses once more at once (that one-token step is then the
  newest). Rows that ended otherwise (EOS, budget, cache) stay done."""
  paused = rows & state.done & (state.finish == FINISH_STOP)
  go = paused & ~state.again & (state.lengths < state.budget)
  spent = paused & ~state.again & ~go  # its step ended on its last budgeted token: nothing more to decode
  return state.replace(
    done=state.done & ~go,
    step_start=jnp.where(paused, state.step_end, state.step_start),
    finish=jnp.where(spent, FINISH_LENGTH, state.finish),
    step_end=jnp.where(paused & state.again, state.lengths, state.step_end),
    again=state.again & ~paused,
  )


# Every per-row field of DecodeState but the cache (which has its own take / share).
_ROW_FIELDS = (
  "logits",
  "pending",
  "tokens",
  "logprobs",
  "features",
  "slots",
  "lengths",
  "step_start",
  "step_end",
  "again",
  "budget",
  "done",
  "finish",
  "stop_state",
)


def map_row_keys(rng, f):
  """f applied to per-row keys [B]; one key for the batch is kept as is."""
  return rng if rng.ndim == 0 else f(rng)


@jax.jit
def take(state: DecodeState, rows) -> DecodeState:
  """Gathers rows [B'] of the state (branch N samples, keep beam survivors). One key for the batch is kept as is;
  per-row keys go with their rows (the copies of a row then draw the same stream until they are `rekey`ed)."""
  g = lambda x: jnp.take(x, rows, axis=0)
  fields = {f: jax.tree.map(g, getattr(state, f)) for f in _ROW_FIELDS}
  return state.replace(cache=state.cache.take(rows), rng=map_row_keys(state.rng, g), **fields)


@functools.partial(jax.jit, static_argnames=("n", "suffix_size"))
def share(state: DecodeState, *, n: int, suffix_size: int) -> DecodeState:
  """n continuations of every row that read the row's cache as a shared read-only prefix (no copy) and write into
  their own `suffix_size` slots. Rows p * n .. p * n + n - 1 continue row p (and repeat its key, if it has one)."""
  rep = lambda x: jnp.repeat(x, n, axis=0)
  fields = {f: jax.tree.map(rep, getattr(state, f)) for f in _ROW_FIELDS}
  return state.replace(cache=state.cache.share(n, suffix_size), rng=map_row_keys(state.rng, rep), **fields)


def prompt_keys(seed: int, prompt_seeds) -> jax.Array:
  """[P] PRNG keys fold_in(key(seed), prompt_seeds[p]): each prompt's randomness from its own seed, so a prompt
  draws the same in any batch."""
  seeds = jnp.asarray(prompt_seeds, jnp.uint32)  # [P]
  return jax.vmap(lambda s: jax.random.fold_in(jax.random.key(seed), s))(seeds)


def row_keys(keys, n: int) -> jax.Array:
  """[P * n] keys: row p * n + s draws from fold_in(keys[p], s) (keys [P], e.g. `prompt_keys`, or those folded
  with a search round: every copy of a row gets its own stream, the same in any batch)."""
  return jax.vmap(lambda k: jax.vmap(lambda s: jax.random.fold_in(k, s))(jnp.arange(n, dtype=jnp.uint32)))(
    keys
  ).reshape(-1)


def rekey(state: DecodeState, keys) -> DecodeState:
  """The same rows with per-row PRNG keys [B] (a typed key array, e.g. `row_keys`): from here each row samples
  from its own stream, independent of the batch it sits in."""
  if not jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key) or keys.shape != (state.batch,):
    raise ConfigError(f"rekey: need [{state.batch}] typed PRNG keys (jax.random.key), got {keys.dtype}{keys.shape}")
  return state.replace(rng=keys)


def newest_step_spans(state: DecodeState):
  """[B, 2] int32 response-token span [start, end) of each paused or finished row's newest step."""
  return jnp.stack([state.step_start, state.step_end], axis=1)


@jax.jit
def flatten(state: DecodeState) -> DecodeState:
  """The same rows with their shared prefix copied into their own caches (prefix slots first): what `fork` needs
  to branch rows that already read a prefix. One copy per row."""
  c = state.cache
  if c.prefix is None:
    return state
  layers, seen = c.prefix_view()
  rep = c.batch // c.prefix.batch
  cat = lambda p, own: jnp.concatenate([jnp.repeat(p, rep, axis=0), own], axis=2)
  cache = KVCache(
    k=tuple(cat(pk, k) for (pk, _), k in zip(layers, c.k)),
    v=tuple(cat(pv, v) for (_, pv), v in zip(layers, c.v)),
    valid=jnp.concatenate([seen, c.valid], axis=1),
    positions=c.positions,
    index=c.index + c.prefix.size,
  )
  return state.replace(cache=cache, slots=jnp.where(state.slots >= 0, state.slots + c.prefix.size, -1))
