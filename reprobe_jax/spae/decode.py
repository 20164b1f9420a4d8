"""Thinking-mode decoding with the step potential computed on device at every boundary, and probe-truncated
decoding (docs/method.md §B3): at a row's first saturated boundary `</think>` is appended and the row writes its
answer.

    rows = decode_thinking(lm, prober, prompt_ids, answers, seeds, sampling=..., max_new_tokens=192, truncate=True)

One compiled program (`thinking_loop`, a `lax.while_loop`) runs the whole call: the rows decode together to their
next paragraph boundary (the sampler pauses each row there); the paused rows' boundaries are probed in one batched
call as side branches of the live rows (`potential.probe`: the paused rows gathered into the smallest of four row
buckets that holds them, one `lax.switch` branch per bucket; nothing is re-prefilled); with `truncate`, saturated
rows get `</think>` forced in; the paused rows resume. The per-boundary cuts, Acc and Conf go into [B, K] device
buffers (K: the response buffer, the most boundaries a row can pass), fetched once at the end. Rows truncate
independently. Without `truncate` the same loop gives plain decoding with its potential curve, which equals
`Prober.potentials` of the finished trajectory (same keys).

Where the boundary's last token holds the paragraph end and the next word ('\\n\\nSo', a token that closes its step
in paragraph mode), truncation rewinds the row by that token and forces in the paragraph end's own tokens and then
`</think>`, so the close follows the paragraph end and not a word of the next paragraph.

Randomness: the rows draw from per-row key streams (`prompt_seeds`, docs/decoding.md), so a row's tokens do not
depend on the batch, and until its truncation a truncated row is the plain row token for token.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int, Key

from reprobe_jax.errors import ConfigError
from reprobe_jax.fields import Int as IntField, check_seed, check_seeds
from reprobe_jax.models import decoding
import reprobe_jax.models.decode_state as decode_state
from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.decode_state import DecodeState, StopRule
from reprobe_jax.models.sampling import SamplingParams
from reprobe_jax.models.xla_options import decode_jit
from reprobe_jax.spae.potential import BOUNDARY_TEXT, StepPotentials, in_context, probe_in_jit, step_potential
from reprobe_jax.spae.prober import Prober
from reprobe_jax.steps import THINK_CLOSE, StepBoundary


@dataclasses.dataclass(frozen=True)
class ThinkingRow:
  """One decoded thinking trajectory with the potentials of the boundaries it passed."""

  prompt_index: int
  sample: int
  response_ids: tuple[int, ...]  # without the final EOS
  finish_reason: str
  potentials: StepPotentials  # one entry per boundary probed (all of them, or up to the truncation)
  truncated_at: int | None  # the boundary (ordinal) after which `</think>` was forced in; None: not truncated


def trajectory_seed(prompt_seed: int, sample: int, samples: int) -> int:
  """The probe's per-trajectory seed of sample s of a prompt (unique per (prompt seed, sample), in [0, 2**32))."""
  return (check_seed(prompt_seed, "trajectory_seed: prompt_seed") * samples + sample) % (2**32)


# ------------------------------------------------------------------------------------------------ device program


@dataclasses.dataclass(frozen=True)
class ThinkingPlan:
  """The static choices of one `thinking_loop` program (sampling and probe shapes)."""

  greedy: bool
  top_k: int
  filtered: bool
  samples: int  # probe continuations per boundary
  suffix_size: int  # a probe row's own cache slots
  probe_buffer: int  # a probe row's response buffer
  max_tokens: int
  reading: str
  top_logprobs: int
  truncate: bool
  buckets: tuple[int, ...]  # the paused rows are probed in the smallest of these row counts that holds them


@struct.dataclass
class ThinkingEnv:
  """The traced inputs of `thinking_loop` besides the state (B rows, A answer columns, L close tokens)."""

  stop: object  # the sampler's paragraph StopTable
  eos: Bool[Array, " v"]
  temperature: Float[Array, ""]
  top_p: Float[Array, ""]
  real: Bool[Array, " b"]  # rows that are not batch padding
  row_keys: Key[Array, " b"]  # fold_in(key(probe seed), trajectory seed) per row
  suffix: Int[Array, " s"]
  answers: Int[Array, "b a"]  # left-padded
  answer_len: Int[Array, " b"]
  close_rule: StopRule  # tokens holding '}'
  probe_temperature: Float[Array, ""]
  eps_sat: Float[Array, ""]
  close_block: Int[Array, "m h"]  # row 0: the close's ids; row m: merged token m's paragraph end + close; left-padded
  close_mask: Int[Array, "m h"]
  merged_row: Int[Array, " v"]  # each token's row of close_block (0: a token that holds no paragraph end and more)


@struct.dataclass
class ThinkingLoop:
  """The loop's carry: the decode state and what each row's probed boundaries gave (K per row at most)."""

  state: DecodeState
  ordinal: Int[Array, " b"]  # boundaries probed so far per row
  cuts: Int[Array, "b k"]  # response-token index of each boundary's last token, -1 past the row's count
  acc: Float[Array, "b k"]
  conf: Float[Array, "b k"]
  truncated_at: Int[Array, " b"]  # the boundary after which the close was forced in, -1: none


def _put(buf, rows, col, value):
  """buf [B, K] <- value [B] at (b, col[b]) where rows[b]."""
  b, k = buf.shape
  return buf.at[jnp.arange(b), jnp.where(rows, col, k)].set(value.astype(buf.dtype), mode="drop")


def rewind(state: DecodeState, rows, k: int) -> DecodeState:
  """Rows [B] bool lose their last k response tokens (and those tokens' cache slots: each row's last k writes):
  the state as it was before they were fed, but for the pending logits, which the next fed token replaces."""
  n = state.buffer_len
  pos = jnp.arange(n)[None, :]
  drop = rows[:, None] & (pos >= state.lengths[:, None] - k) & (pos < state.lengths[:, None])  # [B, N]
  c = state.cache
  b = state.batch
  gone = jnp.where(drop & (state.slots >= 0), state.slots, c.size)
  valid = c.valid.at[jnp.arange(b)[:, None], gone].set(False, mode="drop")
  back = jnp.where(rows, k, 0).astype(jnp.int32)
  zero = lambda x: jnp.where(drop.reshape(drop.shape + (1,) * (x.ndim - 2)), jnp.zeros_like(x), x)
  return state.replace(
    cache=c.replace(valid=valid, index=c.index - back, positions=c.positions - back),
    tokens=zero(state.tokens),
    logprobs=zero(state.logprobs),
    features=jax.tree.map(zero, state.features),
    slots=jnp.where(drop, -1, state.slots),
    lengths=state.lengths - back,
    again=state.again & ~rows,
  )


def close_rows(graphdef, params, state: DecodeState, hit, env: ThinkingEnv, *, shard=None) -> DecodeState:
  """Forces the close into rows `hit` [B] paused at a boundary, after the boundary's last token. Where that token
  holds the paragraph end and more ('\\n\\nSo'), the row is rewound by it and the token before it, and gets the
  token before forced again (its recorded log-prob and features kept: the pending logits are then those after it),
  then the paragraph end's ids and the close (`env.close_block`)."""
  b, n = state.batch, state.buffer_len
  rows = jnp.arange(b)
  cut = jnp.clip(state.step_end - 1, 0, n - 1)  # the boundary's last token
  m = jnp.where(hit & (cut >= 1), env.merged_row[state.tokens[rows, cut]], 0)  # [B]
  merged = m > 0
  prev = jnp.maximum(cut - 1, 0)
  prev_tok = state.tokens[rows, prev]
  kept_lp = state.logprobs[rows, prev]
  kept_feat = jax.tree.map(lambda x: x[rows, prev], state.features)
  state = rewind(state, merged, 2)
  h = env.close_block.shape[1]
  ids = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), env.close_block[m]], axis=1)  # [B, 1 + H]
  mask = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), env.close_mask[m] * hit[:, None]], axis=1)
  at = jnp.where(merged, h - jnp.sum(env.close_mask[m], axis=1), h + 1)  # the column just before the block's ids
  ids = ids.at[rows, at].set(prev_tok, mode="drop")
  mask = mask.at[rows, at].set(1, mode="drop")
  state = decoding.force_in_jit(graphdef, params, state, env.stop, ids, mask, capture=CaptureSpec(), shard=shard)
  put = jnp.where(merged, prev, n)
  return state.replace(
    logprobs=state.logprobs.at[rows, put].set(kept_lp, mode="drop"),
    features=jax.tree.map(lambda x, v: x.at[rows, put].set(v, mode="drop"), state.features, kept_feat),
  )


def _thinking_impl(graphdef, params, state: DecodeState, env: ThinkingEnv, *, plan: ThinkingPlan, shard=None):
  """Decodes every row to its end, probing each boundary it pauses at and (plan.truncate) closing the thinking of
  rows at their first saturated one; returns the final `ThinkingLoop`."""
  b, k = state.batch, state.buffer_len

  def decode(s):
    return decoding.decode_in_jit(
      graphdef,
      params,
      s,
      env.stop,
      env.eos,
      env.temperature,
      env.top_p,
      jnp.int32(k),
      greedy=plan.greedy,
      top_k=plan.top_k,
      filtered=plan.filtered,
      capture=CaptureSpec(),
      shard=shard,
    )

  def paused(s):
    return s.done & (s.finish == decode_state.FINISH_STOP) & env.real

  def probe_paused(s, p, cut, keys):
    """(acc, conf) [B] of the paused rows p [B] (NaN elsewhere): the paused rows first, gathered into the smallest
    of `plan.buckets` rows that holds them (one branch of a `lax.switch` per bucket), probed, scattered back."""
    order = jnp.argsort(~p, stable=True)  # paused rows first

    def branch(size):
      def run(_):
        rows = order[:size]
        acc, conf = probe_in_jit(
          graphdef,
          params,
          decode_state.take(s, rows),
          cut[rows][:, None],
          keys[rows][:, None],
          env.suffix,
          env.answers[rows],
          env.answer_len[rows],
          env.close_rule,
          env.eos,
          env.probe_temperature,
          n=plan.samples,
          suffix_size=plan.suffix_size,
          buffer_len=plan.probe_buffer,
          max_tokens=plan.max_tokens,
          reading=plan.reading,
          top_logprobs=plan.top_logprobs,
          shard=shard,
        )
        nan = jnp.full((b,), jnp.nan, jnp.float32)
        return nan.at[rows].set(acc[:, 0]), nan.at[rows].set(conf[:, 0])

      return run

    sizes = jnp.asarray(plan.buckets, jnp.int32)
    which = jnp.minimum(jnp.searchsorted(sizes, jnp.sum(p)), len(plan.buckets) - 1)
    return jax.lax.switch(which, [branch(z) for z in plan.buckets], None)

  def body(c: ThinkingLoop) -> ThinkingLoop:
    s = c.state
    p = paused(s)
    cut = jnp.where(p, s.step_end - 1, -1).astype(jnp.int32)  # [B]
    keys = jax.vmap(jax.random.fold_in)(env.row_keys, c.ordinal.astype(jnp.uint32))  # [B]
    acc, conf = probe_paused(s, p, cut, keys)
    truncated_at = c.truncated_at
    if plan.truncate:
      hit = p & (step_potential(acc, conf) > env.eps_sat) & (truncated_at < 0)
      truncated_at = jnp.where(hit, c.ordinal, truncated_at)
      s = close_rows(graphdef, params, s, hit, env, shard=shard)
    s = decode(decode_state.resume(s, p))
    return ThinkingLoop(
      state=s,
      ordinal=c.ordinal + p.astype(jnp.int32),
      cuts=_put(c.cuts, p, c.ordinal, cut),
      acc=_put(c.acc, p, c.ordinal, acc),
      conf=_put(c.conf, p, c.ordinal, conf),
      truncated_at=truncated_at,
    )

  nan = jnp.full((b, k), jnp.nan, jnp.float32)
  init = ThinkingLoop(
    state=decode(state),
    ordinal=jnp.zeros((b,), jnp.int32),
    cuts=jnp.full((b, k), -1, jnp.int32),
    acc=nan,
    conf=nan,
    truncated_at=jnp.full((b,), -1, jnp.int32),
  )
  return jax.lax.while_loop(lambda c: jnp.any(paused(c.state)), body, init)


thinking_loop, thinking_loop_in_jit = decode_jit(
  static_argnames=("graphdef", "plan", "shard"), donate_argnames=("state",)
)(_thinking_impl)


# ------------------------------------------------------------------------------------------------ host shell


def decode_thinking(
  lm,
  prober: Prober,
  prompt_ids: Sequence[Sequence[int]],
  answers: Sequence[str],
  prompt_seeds: Sequence[int],
  *,
  sampling: SamplingParams,
  max_new_tokens: int,
  samples: int = 1,
  seed: int = 0,
  truncate: bool = False,
  close: str = THINK_CLOSE,
  progress: Callable[[int], None] | None = None,
) -> list[ThinkingRow]:
  """`samples` thinking trajectories per prompt, each boundary probed on device; with `truncate`, each row gets
  `close` forced in at its first saturated boundary. Rows come back prompt-major (prompt p, sample s). One device
  program and one fetch per call; `progress` ticks once, at the end, with the rows."""
  if lm.tokenizer is None:
    raise ConfigError("decode_thinking needs the model's tokenizer")
  if not isinstance(prober, Prober) or prober.lm is not lm:
    raise ConfigError(f"decode_thinking: prober: expected a Prober of this model, got {type(prober).__name__}")
  for name, value in (("max_new_tokens", max_new_tokens), ("samples", samples)):
    if not IntField(1).ok(value):
      raise ConfigError(f"decode_thinking: {name}: expected {IntField(1)}, got {value!r}")
  prompt_ids = prober.token_rows(prompt_ids, "decode_thinking: prompt_ids")
  prompt_seeds = check_seeds(prompt_seeds, "decode_thinking: prompt_seeds")
  seed = check_seed(seed, "decode_thinking: seed")
  ans = prober.answer_ids(answers, "decode_thinking: answers")
  if len(prompt_ids) != len(answers) or len(prompt_ids) != len(prompt_seeds):
    raise ConfigError(
      f"decode_thinking: {len(prompt_ids)} prompts, {len(answers)} answers, {len(prompt_seeds)} "
      "prompt seeds; need one of each per prompt"
    )
  tok = lm.tokenizer
  close_ids = in_context(tok, BOUNDARY_TEXT, close) or list(tok(close, add_special_tokens=False)["input_ids"])
  if truncate and not close_ids:
    raise ConfigError(f"decode_thinking: the closing text {close!r} tokenizes to nothing")
  for p, a in zip(prompt_ids, ans):
    prober.check_room(len(p) + max_new_tokens, len(a))
  enc = lambda text: list(tok(text, add_special_tokens=False)["input_ids"])
  blocks = [close_ids] + [in_context(tok, "a", t + close) or enc(t + close) for t in prober.merged_ends.values()]
  merged_row = np.zeros(lm.config.vocab_size, np.int32)
  merged_row[list(prober.merged_ends)] = np.arange(1, len(blocks))
  h = max(map(len, blocks))
  close_block, close_mask = np.zeros((len(blocks), h), np.int32), np.zeros((len(blocks), h), np.int32)
  for i, ids in enumerate(blocks):
    close_block[i, h - len(ids) :], close_mask[i, h - len(ids) :] = ids, 1
  smp = lm.sampler(sampling, capture=CaptureSpec(), stop=StepBoundary("paragraph").compile(tok, lm.config.vocab_size))
  n_prompts = len(prompt_ids)
  state = smp.prefill(
    [list(p) for p in prompt_ids],
    max_new_tokens=max_new_tokens,
    n=samples,
    seed=seed,
    share=False,
    extra_slots=max(len(close_ids), h - 1),  # a merged row loses two tokens and gets one back before its block
    prompt_seeds=list(prompt_seeds),
  )
  b = state.batch
  rows = n_prompts * samples
  row_prompt = np.minimum(np.arange(b) // samples, n_prompts - 1)  # batch padding rows borrow a real prompt
  row_seed = [trajectory_seed(prompt_seeds[p], r % samples, samples) for r, p in enumerate(row_prompt)]
  a = prober.probe_answers([ans[p] for p in row_prompt])
  cfg = prober.cfg
  plan = ThinkingPlan(
    greedy=sampling.greedy,
    top_k=sampling.top_k,
    filtered=sampling.filtered,
    samples=cfg.samples,
    suffix_size=prober.probe_room(a.answers.shape[1]),
    probe_buffer=a.buffer_len,
    max_tokens=cfg.max_tokens,
    reading=cfg.reading,
    top_logprobs=cfg.top_logprobs,
    truncate=bool(truncate),
    buckets=tuple(sorted({max(1, b // 8), max(1, b // 4), max(1, b // 2), b})),
  )
  env = ThinkingEnv(
    stop=smp.stop,
    eos=prober.eos,
    temperature=jnp.float32(sampling.temperature),
    top_p=jnp.float32(sampling.top_p),
    real=jnp.asarray(np.arange(b) < rows),
    row_keys=decode_state.prompt_keys(cfg.seed, np.asarray(row_seed, np.uint32)),
    suffix=jnp.asarray(prober.suffix_ids, jnp.int32),
    answers=jnp.asarray(a.answers),
    answer_len=jnp.asarray(a.answer_len),
    close_rule=prober.close_rule,
    probe_temperature=jnp.float32(cfg.temperature),
    eps_sat=jnp.float32(cfg.eps_sat),
    close_block=jnp.asarray(close_block),
    close_mask=jnp.asarray(close_mask),
    merged_row=jnp.asarray(merged_row),
  )
  out = thinking_loop(*lm.decode_view(), state, env, plan=plan, shard=lm.shard)
  s = out.state
  host = jax.device_get(
    {
      "tokens": s.tokens,
      "lengths": s.lengths,
      "done": s.done,
      "finish": s.finish,
      "ordinal": out.ordinal,
      "cuts": out.cuts,
      "acc": out.acc,
      "conf": out.conf,
      "truncated_at": out.truncated_at,
    }
  )
  eos = tok.eos_token_id
  result = []
  for r in range(rows):
    ids = host["tokens"][r, : host["lengths"][r]].tolist()
    ids = ids[:-1] if ids and ids[-1] == eos else ids
    k = int(host["ordinal"][r])
    t = int(host["truncated_at"][r])
    result.append(
      ThinkingRow(
        prompt_index=int(row_prompt[r]),
        sample=r % samples,
        response_ids=tuple(ids),
        finish_reason=decode_state.FINISH_NAMES[int(host["finish"][r])] if host["done"][r] else "length",
        potentials=StepPotentials.of(host["cuts"][r, :k], host["acc"][r, :k], host["conf"][r, :k], cfg.eps_sat),
        truncated_at=t if t >= 0 else None,
      )
    )
  if progress is not None:
    progress(rows)
  return result
