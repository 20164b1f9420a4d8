"""`Sampler`: the host-side shell over `decoding`'s pure operations (validation, bucketing, reading rows back).

    sampler = lm.sampler(SamplingParams(1.0, 50, 0.95), capture=spec.capture(), stop=rule)
    state = sampler.prefill(prompts, max_new_tokens=256, n=4, seed=0)   # 4 rows per prompt share its prefill
    state = sampler.decode(state)                                        # to the first step boundary of each row
    spans = decode_state.newest_step_spans(state)                            # [B, 2], for a step scorer, on device
    state = sampler.take(state, keep)                                    # keep the best rows
    state = sampler.resume(state)                                        # and go on
    rows = sampler.read(state)                                           # host records

Shapes are bucketed (prompt length, response length, batch to powers of two), so new prompts and new boundaries
in the same buckets compile nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Protocol, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np

import reprobe_jax.models.decoding as decoding
import reprobe_jax.models.decode_state as decode_state
from reprobe_jax.errors import CacheFullError, ConfigError, shape_errors
from reprobe_jax.fields import check_seed, check_seeds
from reprobe_jax.models.capture import CaptureSpec, TokenFeatures
from reprobe_jax.models.config import ModelConfig
from reprobe_jax.models.decode_state import DecodeState, StopRule
from reprobe_jax.models.kv_cache import KVCache
from reprobe_jax.models.sampling import SamplingParams, bucket
from reprobe_jax.models.sharding import ShardingCtx, constrain_rows, to_host


class DecodingModel(Protocol):
  """What a `Sampler` uses of its model (`LanguageModel` is one): the config, the token checks and the decode view."""

  config: ModelConfig
  tokenizer: Any
  shard: ShardingCtx | None
  dtype: Any

  def decode_view(self) -> tuple[Any, Any]: ...

  def encode(self, prompts) -> list[list[int]]: ...

  def check_ids(self, ids, what: str = "input_ids") -> None: ...

  def eos_mask(self) -> np.ndarray: ...

  def pad_id(self) -> int: ...


@dataclasses.dataclass
class Row:
  """One row of a decode state read back to the host: its response so far and what was captured for it."""

  tokens: list[int]
  logprobs: np.ndarray  # [n]
  features: TokenFeatures  # each value [n, ...]
  finish_reason: str | None  # None while the row is still live
  step_start: int  # the newest step is tokens [step_start, step_end) (once the row paused or ended)
  step_end: int


@dataclasses.dataclass
class Sampler:
  """Binds a model to static sampling choices; every method is a validated call of one jitted operation."""

  lm: DecodingModel
  params: SamplingParams = SamplingParams()
  capture: CaptureSpec = CaptureSpec()
  stop: object = None  # a StopRule or a boundary StopTable; None: no step boundary (EOS, budget or cache end rows)

  def __post_init__(self):
    if not isinstance(self.params, SamplingParams):
      raise ConfigError(f"sampling params must be a SamplingParams, got {type(self.params).__name__}")
    self.capture.resolve_layers(self.lm.config.num_layers)
    v = self.lm.config.vocab_size
    if self.params.top_k > v:
      raise ConfigError(f"SamplingParams.top_k={self.params.top_k} exceeds the vocabulary size {v}")
    if self.stop is None:
      self.stop = StopRule.from_mask(np.zeros(v, bool))
    if self.stop.vocab_size != v:
      raise ConfigError(f"stop rule covers {self.stop.vocab_size} tokens, the model has {v}")
    self._eos = jnp.asarray(self.lm.eos_mask())

  # ------------------------------------------------------------------------------------------ operations

  def prefill(
    self,
    prompts,
    *,
    max_new_tokens: int,
    n: int = 1,
    seed: int = 0,
    extra_slots: int = 0,
    share: bool | None = None,
    prompt_seeds: Sequence[int] | None = None,
    prompt_len: int = 0,
  ) -> DecodeState:
    """Prefills each prompt (text or token ids) once and opens `n` rows per prompt (prompt-major: row = prompt * n
    + sample; rows past len(prompts) * n are batch padding and start finished). max_new_tokens: each row's token
    budget; extra_slots: cache room for forced text beyond it. With n > 1 the rows read their prompt's cache as a
    shared prefix (share=False copies it per row instead).

    Randomness: without prompt_seeds the batch draws from one key, key(seed). With prompt_seeds (one integer in
    [0, 2**32) per prompt) every row has its own key: row p * n + s draws from fold_in(fold_in(key(seed),
    prompt_seeds[p]), s), so a prompt gets the same samples in any batch (`decode_state.prompt_keys`, `row_keys`).
    prompt_len: the prompt columns are at least this many (bucketed): a caller whose batches' longest prompts
    straddle a bucket edge (RL rounds) keeps one shape, so nothing downstream compiles twice."""
    max_new_tokens = _positive_int("max_new_tokens", max_new_tokens)
    n = _positive_int("n", n)
    if isinstance(extra_slots, bool) or not isinstance(extra_slots, (int, np.integer)) or extra_slots < 0:
      raise ConfigError(f"extra_slots must be an integer >= 0, got {extra_slots!r}")
    seed = check_seed(seed, "seed")
    if isinstance(prompt_len, bool) or not isinstance(prompt_len, (int, np.integer)) or prompt_len < 0:
      raise ConfigError(f"prompt_len must be an integer >= 0, got {prompt_len!r}")
    lm = self.lm
    ids = lm.encode(prompts)
    if prompt_seeds is not None:
      prompt_seeds = check_seeds(prompt_seeds, "prompt_seeds")
      if len(prompt_seeds) != len(ids):
        raise ConfigError(f"prompt_seeds: need one seed per prompt ({len(ids)}), got {len(prompt_seeds)}")
    for j, p in enumerate(ids):
      if not p:
        raise ConfigError(f"generate: prompt {j} is empty")
    lm.check_ids(ids, "prompt")
    longest = max(map(len, ids))
    if longest + max_new_tokens + extra_slots > lm.config.max_position_embeddings:
      forced = f" + extra_slots={extra_slots}" if extra_slots else ""
      raise CacheFullError(
        f"prompt of {longest} tokens + max_new_tokens={max_new_tokens}{forced} exceeds "
        f"max_position_embeddings={lm.config.max_position_embeddings}"
      )
    plen = bucket(max(longest, int(prompt_len)))
    new_len = bucket(max_new_tokens)
    room = bucket(max_new_tokens + extra_slots)
    n_prompts = len(ids)
    b = bucket(n_prompts, minimum=1)
    arr = np.full((b, plen), lm.pad_id(), np.int32)
    mask = np.zeros((b, plen), np.int32)
    for j, p in enumerate(ids):
      arr[j, plen - len(p) :] = p
      mask[j, plen - len(p) :] = 1
    share = n > 1 if share is None else share
    budget = np.zeros(b * n if share else b, np.int32)
    budget[: n_prompts * (n if share else 1)] = max_new_tokens
    key = jax.random.key(seed)
    if share:
      # The prompt rows only hold the prefix; their own budget is 0 so they start finished.
      cache = new_cache(lm.config, b, plen, lm.dtype, lm.shard)
      state = decoding.prefill(
        *lm.decode_view(),
        cache,
        arr,
        mask,
        np.zeros(b, np.int32),
        key,
        buffer_len=new_len,
        capture=self.capture,
        shard=lm.shard,
      )
      state = share_rows(state, n, room, lm.shard)
      state = state.replace(budget=jnp.minimum(jnp.asarray(budget), new_len), done=jnp.asarray(budget) <= 0)
    else:
      cache = new_cache(lm.config, b, plen + room, lm.dtype, lm.shard)
      state = decoding.prefill(
        *lm.decode_view(), cache, arr, mask, budget, key, buffer_len=new_len, capture=self.capture, shard=lm.shard
      )
      if n > 1:
        state = repeat_rows(state, n, lm.shard)
        state = state.replace(done=jnp.repeat(jnp.asarray(budget) <= 0, n), budget=jnp.repeat(jnp.asarray(budget), n))
    if prompt_seeds is not None:  # batch padding prompts take seed 0: any fixed key will do, they start finished
      seeds = np.zeros(b, np.uint32)
      seeds[:n_prompts] = prompt_seeds
      state = decode_state.rekey(state, decode_state.row_keys(decode_state.prompt_keys(seed, seeds), n))
    return decoding.start_rule(state)

  def decode(self, state: DecodeState, max_steps: int | None = None) -> DecodeState:
    """Decodes every live row until it is done, or for at most `max_steps` tokens (default: the buffer)."""
    steps = state.buffer_len if max_steps is None else _positive_int("max_steps", max_steps)
    p = self.params
    return decoding.decode(
      *self.lm.decode_view(),
      state,
      self.stop,
      self._eos,
      jnp.float32(p.temperature),
      jnp.float32(p.top_p),
      jnp.int32(steps),
      greedy=p.greedy,
      top_k=p.top_k,
      filtered=p.filtered,
      capture=self.capture,
      shard=self.lm.shard,
    )

  def force(self, state: DecodeState, forced, rows=None) -> DecodeState:
    """Appends forced text to rows: `forced` is one text or id list for every chosen row (rows [B] bool, default
    all), or a list of B items (text, ids or None = nothing), one per row. The block is bucketed to a power of 2."""
    b = state.batch
    same = isinstance(forced, str) or (len(forced) > 0 and isinstance(forced[0], (int, np.integer)))
    if not same and len(forced) != b:
      raise ConfigError(f"force: give one text / id list for all rows or one item per row ({b}), got {len(forced)}")
    items = [forced] * b if same else list(forced)
    chosen = np.ones(b, bool) if rows is None else np.asarray(rows, bool)
    if chosen.shape != (b,):
      raise ConfigError(f"force: rows must be [{b}] bool, got shape {chosen.shape}")
    seqs = []
    for r, item in enumerate(items):
      if item is None or not chosen[r]:
        seqs.append([])
      elif isinstance(item, str):
        if self.lm.tokenizer is None:
          raise ConfigError("force: text needs a tokenizer; pass token ids instead")
        seqs.append(list(self.lm.tokenizer(item, add_special_tokens=False)["input_ids"]))
      else:
        seqs.append([int(t) for t in item])
    self.lm.check_ids(seqs, "forced")
    k = bucket(max(map(len, seqs)), minimum=1)
    arr = np.full((b, k), self.lm.pad_id(), np.int32)
    mask = np.zeros((b, k), np.int32)
    for r, s in enumerate(seqs):
      if s:
        arr[r, k - len(s) :], mask[r, k - len(s) :] = s, 1
    return decoding.force(
      *self.lm.decode_view(), state, self.stop, arr, mask, capture=self.capture, shard=self.lm.shard
    )

  def take(self, state: DecodeState, rows) -> DecodeState:
    rows = np.asarray(rows, np.int32)
    if rows.ndim != 1 or rows.size == 0 or rows.min() < 0 or rows.max() >= state.batch:
      raise ConfigError(f"take: rows must be a non-empty list of indices in [0, {state.batch}), got {rows.tolist()}")
    if state.cache.prefix is not None:  # a row must stay with the prefix it reads
      p = state.cache.prefix.batch  # prefix rows; row b reads prefix row b // (rows per prefix)
      per_now, per_new = state.batch // p, len(rows) // p
      if len(rows) % p or np.any(rows // per_now != np.arange(len(rows)) // per_new):
        raise ConfigError("take: with a shared prefix, output rows must keep to their prefix's block of rows")
    return decode_state.take(state, jnp.asarray(rows))

  def resume(self, state: DecodeState, rows=None) -> DecodeState:
    """Rows (default: all) paused at a step boundary go on from there."""
    mask = np.ones(state.batch, bool) if rows is None else np.asarray(rows, bool)
    with shape_errors(f"resume: rows must be [{state.batch}] bool"):
      chex.assert_shape(mask, (state.batch,))
    return decode_state.resume(state, jnp.asarray(mask))

  def read(self, state: DecodeState, rows: Sequence[int] | None = None) -> list[Row]:
    """Rows back on the host (one transfer of the buffers; rows that live on other processes' devices are
    all-gathered, so on a multi-process job every process calls this together)."""
    host = to_host(
      {
        "tokens": state.tokens,
        "logprobs": state.logprobs,
        "features": state.features,
        "lengths": state.lengths,
        "done": state.done,
        "finish": state.finish,
        "step_start": state.step_start,
        "step_end": state.step_end,
      }
    )
    out = []
    for r in range(state.batch) if rows is None else rows:
      n = int(host["lengths"][r])
      out.append(
        Row(
          tokens=host["tokens"][r, :n].tolist(),
          logprobs=host["logprobs"][r, :n],
          features=jax.tree.map(lambda v: v[r, :n], host["features"]),
          finish_reason=decode_state.FINISH_NAMES[int(host["finish"][r])] if host["done"][r] else None,
          step_start=int(host["step_start"][r]),
          step_end=int(host["step_end"][r]),
        )
      )
    return out


# The prefill's buffers on a mesh (docs/scale.md, "What runs data-parallel"): made inside jitted programs on the rows'
# sharding, so that no KV cache of a sampling call is ever whole on one device (eagerly, `jnp.zeros` of all rows would
# sit on the first device before the rows are split). Without a mesh, the same buffers made eagerly.


@functools.partial(jax.jit, static_argnames=("cfg", "batch", "size", "dtype", "shard"))
def _new_cache(cfg: ModelConfig, batch: int, size: int, dtype, shard: ShardingCtx) -> KVCache:
  return constrain_rows(KVCache.zeros(cfg, batch, size, dtype), shard)


def new_cache(cfg: ModelConfig, batch: int, size: int, dtype, shard: ShardingCtx | None) -> KVCache:
  """An empty cache of `batch` rows and `size` slots, its rows over the mesh's data axis (`shard`)."""
  return KVCache.zeros(cfg, batch, size, dtype) if shard is None else _new_cache(cfg, batch, size, dtype, shard)


@functools.partial(jax.jit, static_argnames=("n", "size", "shard"))
def _share_rows(state: DecodeState, n: int, size: int, shard: ShardingCtx) -> DecodeState:
  return constrain_rows(decode_state.share(state, n=n, suffix_size=size), shard)


def share_rows(state: DecodeState, n: int, size: int, shard: ShardingCtx | None) -> DecodeState:
  """`decode_state.share`: n rows per row reading it as a shared prefix, their own `size` slots split by rows."""
  return decode_state.share(state, n=n, suffix_size=size) if shard is None else _share_rows(state, n, size, shard)


@functools.partial(jax.jit, static_argnames=("n", "shard"))
def _repeat_rows(state: DecodeState, n: int, shard: ShardingCtx) -> DecodeState:
  return constrain_rows(decode_state.take(state, jnp.repeat(jnp.arange(state.batch), n)), shard)


def repeat_rows(state: DecodeState, n: int, shard: ShardingCtx | None) -> DecodeState:
  """Each row copied n times (row p * n + s = row p), split by rows."""
  if shard is None:
    return decode_state.take(state, jnp.repeat(jnp.arange(state.batch), n))
  return _repeat_rows(state, n, shard)


def _positive_int(name: str, value) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ConfigError(f"{name} must be an integer, got {value!r}")
  if value < 1:
    raise ConfigError(f"{name} must be >= 1, got {value!r}")
  return int(value)
