"""Jitted prefill and `lax.while_loop` decoding over a fixed-size KV cache (flax gemma sampler shape).

Static: the graph, the capture spec, the sharding context, buffer lengths, greedy-or-not and top_k. Traced:
temperature, top_p, max_new_tokens, the EOS and stop-token masks. So new prompts in the same length bucket, new
stop strings, a new temperature or a new max_new_tokens within the bucket compile nothing.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from reprobe_jax.errors import ConfigError
from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.forward import logit_stats, run_decoder
from reprobe_jax.models.kv_cache import KVCache
from reprobe_jax.models.sharding import ShardingCtx

FINISH_LENGTH, FINISH_EOS, FINISH_STOP = 0, 1, 2
FINISH_NAMES = {FINISH_LENGTH: "length", FINISH_EOS: "eos", FINISH_STOP: "stop"}


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to pick tokens. temperature 0 = greedy. top_k 0 = off (static), top_p 1 = off."""

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
      raise ConfigError(f"SamplingParams out of range: {self} (need temperature >= 0, 0 < top_p <= 1, top_k >= 0)")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


def bucket(n: int, minimum: int = 16) -> int:
  """The smallest power of two >= max(n, minimum): few shapes, so few compilations."""
  b = minimum
  while b < n:
    b *= 2
  return b


def sample_token(logits, rng, temperature, top_p, *, greedy: bool, top_k: int):
  """logits [B, V] float32 -> token ids [B]. Filtering follows HF's TopK then TopP warpers."""
  if greedy:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  scaled = logits / jnp.maximum(temperature, 1e-6)
  k = top_k if top_k else logits.shape[-1]
  vals, idx = jax.lax.top_k(scaled, k)  # [B, k], sorted descending
  probs = jax.nn.softmax(vals, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  keep = (mass_before < top_p) | (jnp.arange(k) == 0)
  vals = jnp.where(keep, vals, -jnp.inf)
  choice = jax.random.categorical(rng, vals, axis=-1)  # [B]
  return jnp.take_along_axis(idx, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "capture", "shard"), donate_argnames=("cache",))
def extend(graphdef, params, cache: KVCache, input_ids, attention_mask, *, capture: CaptureSpec = CaptureSpec(),
           shard: ShardingCtx | None = None):
  """Appends [B, T] tokens (left-padded: mask 0 = padding) at slot `cache.index`.

  Returns (logits [B, T, V], captured dict, new cache). Prefill is `extend` of an empty cache; beam search and
  SPAE use it to append a step or a probe suffix to a branched cache.
  """
  t = input_ids.shape[1]
  mask = attention_mask.astype(bool)
  positions = cache.positions[:, None] + jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1, 0)
  valid = jax.lax.dynamic_update_slice_in_dim(cache.valid, mask, cache.index, axis=1)
  logits, kv, captured = run_decoder(graphdef, params, input_ids, positions, valid, kv_caches=cache.layers(),
                                     write_index=cache.index, capture=capture, shard=shard)
  new_cache = cache.replace(k=tuple(k for k, _ in kv), v=tuple(v for _, v in kv), valid=valid,
                            positions=cache.positions + jnp.sum(mask, axis=1, dtype=jnp.int32),
                            index=cache.index + t)
  return logits, captured, new_cache


def _step_features(logits, captured, capture: CaptureSpec):
  """Features of one decode position: hidden states, attention window, top-K probs, entropy; [B, ...]."""
  feats = {f"hidden_{i}": h[:, -1] for i, h in captured["hidden_states"].items()}
  if capture.attn_window:
    feats["attn_window"] = captured["attn_window"][:, -1]
  stats = logit_stats(logits[:, None], jnp.zeros(logits.shape[:1] + (1,), jnp.int32), capture)
  stats.pop("token_logprobs", None)  # the sampled token's log-prob is recorded by the loop itself
  feats.update({k: v[:, 0] for k, v in stats.items()})
  return feats


@functools.partial(jax.jit, static_argnames=("graphdef", "capture", "shard", "buffer_len", "greedy", "top_k"),
                   donate_argnames=("cache",))
def decode(graphdef, params, cache: KVCache, logits, captured, rng, max_new_tokens, active, eos_mask, stop_mask,
           temperature, top_p, pad_id, *, buffer_len: int, greedy: bool, top_k: int,
           capture: CaptureSpec = CaptureSpec(), shard: ShardingCtx | None = None):
  """Samples up to `max_new_tokens` (traced, <= buffer_len) tokens per row from `logits` [B, V].

  `captured` holds the features of the positions that produced `logits` (so token i's features are read from the
  state that predicted it, METHOD A3). Rows with active=False start finished. Stops per row on an EOS token or a
  stop token (masks [V] bool). Returns tokens, log-probs (temperature 1), lengths, finish codes, features, cache.
  """
  b = logits.shape[0]
  feats0 = _step_features(logits, captured, capture)
  bufs = {k: jnp.zeros((b, buffer_len) + v.shape[1:], v.dtype) for k, v in feats0.items()}
  state = dict(
      i=jnp.zeros((), jnp.int32), cache=cache, logits=logits, feats=feats0, rng=rng,
      tokens=jnp.full((b, buffer_len), pad_id, jnp.int32), logprobs=jnp.zeros((b, buffer_len), jnp.float32),
      done=~active, lengths=jnp.zeros((b,), jnp.int32), finish=jnp.full((b,), FINISH_LENGTH, jnp.int32),
      bufs=bufs)

  def cond(s):
    return (s["i"] < max_new_tokens) & ~jnp.all(s["done"])

  def body(s):
    rng, sub = jax.random.split(s["rng"])
    tok = sample_token(s["logits"], sub, temperature, top_p, greedy=greedy, top_k=top_k)  # [B]
    logp = jax.nn.log_softmax(s["logits"], axis=-1)
    tok_logp = jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]
    live = ~s["done"]
    tok = jnp.where(live, tok, pad_id)
    i = s["i"]
    tokens = s["tokens"].at[:, i].set(tok)
    logprobs = s["logprobs"].at[:, i].set(jnp.where(live, tok_logp, 0.0))
    bufs = {k: v.at[:, i].set(jnp.where(live.reshape((b,) + (1,) * (v.ndim - 2)), s["feats"][k], 0))
            for k, v in s["bufs"].items()}
    is_eos = live & eos_mask[tok]
    is_stop = live & ~is_eos & stop_mask[tok]
    finish = jnp.where(is_eos, FINISH_EOS, jnp.where(is_stop, FINISH_STOP, s["finish"]))
    lengths = s["lengths"] + live.astype(jnp.int32)
    done = s["done"] | is_eos | is_stop

    def step(c):
      lg, capt, c = extend(graphdef, params, c, tok[:, None], live[:, None], capture=capture, shard=shard)
      return lg[:, -1], _step_features(lg[:, -1], capt, capture), c

    need_more = (i + 1 < max_new_tokens) & ~jnp.all(done)
    new_logits, new_feats, new_cache = jax.lax.cond(
        need_more, step, lambda c: (s["logits"], s["feats"], c), s["cache"])
    return dict(i=i + 1, cache=new_cache, logits=new_logits, feats=new_feats, rng=rng, tokens=tokens,
                logprobs=logprobs, done=done, lengths=lengths, finish=finish, bufs=bufs)

  out = jax.lax.while_loop(cond, body, state)
  return {"tokens": out["tokens"], "logprobs": out["logprobs"], "lengths": out["lengths"],
          "finish": out["finish"], "features": out["bufs"], "cache": out["cache"]}
