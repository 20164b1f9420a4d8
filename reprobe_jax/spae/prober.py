"""Every paragraph boundary of every trajectory of a batch probed in one call (SPAE's step potential,
docs/method.md §B1; `potential` says what is read and how Phi is made of it).

How it runs (`probe`, one jitted program): the trajectories' own decode state (its KV cache) is forked at every
boundary into a row that reads that cache as a shared prefix cut at the boundary (`decoding.fork`: no re-prefill
of the question or of earlier steps, no copy); one `force` call feeds the suffix to all of them, a second the
answer tokens (their log-probs are Acc's terms); N copies of each suffix row (its few own slots copied, the prefix
still shared) then sample the continuations of all boundaries of all trajectories in one `decode` call, each row
stopping at its `}`.

Randomness: the n-th continuation at the c-th boundary of a trajectory draws from
fold_in(fold_in(fold_in(key(seed), trajectory_seed), c), n), so a trajectory's potentials are the same in any batch.
"""

from __future__ import annotations

from typing import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Integer, Key

from reprobe_jax.errors import CacheFullError, ConfigError, DataFormatError, shape_errors
from reprobe_jax.fields import check_seed, check_seeds
from reprobe_jax.io.readers import shown
from reprobe_jax.models import decoding
import reprobe_jax.models.decode_state as decode_state
from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.decode_state import DecodeState, StopRule
from reprobe_jax.models.sampling import bucket
from reprobe_jax.models.sharding import constrain_rows
from reprobe_jax.models.xla_options import decode_jit
from reprobe_jax.steps import ENDS_AFTER, ENDS_BEFORE, THINK_OPEN, StepBoundary, token_ids
from reprobe_jax.spae.potential import ProbeConfig, StepPotentials

CUT_STEP = 4  # a chunk's boundaries per trajectory are padded to a multiple of this (few shapes, little padding)
REFERENCE_MISSING_LOGPROB = -10.0  # what the released script adds when the answer token is not in the top-20 list


@jax.jit
def boundary_marks(table, tokens: Integer[Array, "b n"], lengths: Integer[Array, " b"]) -> Bool[Array, "b n"]:
  """[B, N] bool: response token j is the last token of a paragraph step (docs/method.md §A1) that a later token or the
  boundary itself closed: the sampler's own stop automaton run over the tokens (ENDS_AFTER at j marks j,
  ENDS_BEFORE at j marks j - 1), so these are exactly where a sampler with that stop rule pauses."""
  b, n = tokens.shape

  def step(q, j):
    nq, ends = table.advance(q, tokens[:, j])
    live = j < lengths
    return jnp.where(live, nq, q), jnp.where(live, ends, 0)

  _, ends = jax.lax.scan(step, jnp.zeros((b,), jnp.int32), jnp.arange(n))
  ends = ends.T  # [B, N]
  after = (ends & ENDS_AFTER) != 0
  before = (ends & ENDS_BEFORE) != 0
  before_prev = jnp.concatenate([before[:, 1:], jnp.zeros((b, 1), bool)], axis=1)  # ENDS_BEFORE at j+1 marks j
  return after | before_prev


def _probe_impl(
  graphdef,
  params,
  state: DecodeState,
  cuts,
  keys,
  suffix,
  answers,
  answer_len,
  close_rule: StopRule,
  eos_mask,
  temperature,
  *,
  n: int,
  suffix_size: int,
  buffer_len: int,
  max_tokens: int,
  reading: str,
  top_logprobs: int,
  shard=None,
):
  """(acc, conf) [B, C] at the cuts [B, C] (response-token index of each boundary's last token; -1 = none: NaN)
  of every row of `state` (a decode state without a shared prefix, each row's response in its buffers).

  keys [B, C]: one typed PRNG key per cut (its samples draw from fold_in(key, n)); suffix [S] int32; answers
  [B, A] int32 left-padded (mask 0 = padding) with lengths answer_len [B] >= 1; close_rule: tokens holding '}'.

  One row per cut forks the row's cache (shared prefix cut at the boundary) and reads the suffix once; the
  teacher-forced answer goes on from it, and n copies of it (their own few suffix slots copied, the prefix still
  shared) sample the continuations."""
  b, c = cuts.shape
  capture = CaptureSpec(
    token_stats=True,
    top_k_probs=top_logprobs if reading == "reference_code" else 0,
    top_k_ids=reading == "reference_code",
  )
  valid = cuts.reshape(-1) >= 0  # [B * C]
  f = decoding.fork_in_jit(
    graphdef,
    params,
    state,
    jnp.maximum(cuts, 0),
    n=1,
    suffix_size=suffix_size,
    capture=capture,
    shard=shard,
    buffer_len=buffer_len,
  )  # [B * C] rows, (row, cut) order
  bc, s = f.batch, suffix.shape[0]
  f = decoding.force_in_jit(
    graphdef,
    params,
    f,
    close_rule,
    jnp.broadcast_to(suffix[None], (bc, s)),
    jnp.broadcast_to(valid[:, None], (bc, s)).astype(jnp.int32),
    capture=capture,
    shard=shard,
  )
  pos = jnp.arange(f.buffer_len)[None, :]
  a_len = jnp.repeat(answer_len, c)  # [B * C]
  acc = None
  if reading == "paper":  # Acc: the answer teacher-forced after the suffix, at response positions [s, s + |y*|)
    a = answers.shape[1]
    a_mask = jnp.arange(a)[None, :] >= a - answer_len[:, None]
    fa = decoding.force_in_jit(
      graphdef,
      params,
      f,
      close_rule,
      jnp.repeat(answers, c, axis=0),
      (jnp.repeat(a_mask, c, axis=0) & valid[:, None]).astype(jnp.int32),
      capture=capture,
      shard=shard,
    )
    in_ans = (pos >= s) & (pos < s + a_len[:, None])
    acc = jnp.sum(jnp.where(in_ans, jnp.exp(fa.logprobs), 0.0), axis=1) / jnp.maximum(a_len, 1)
  fs = decode_state.take(f, jnp.repeat(jnp.arange(bc), n))  # [B * C * n] rows, (row, cut, sample) order
  fs = decode_state.rekey(fs, decode_state.row_keys(keys.reshape(-1), n))
  row_valid = jnp.repeat(valid, n)
  fs = fs.replace(done=fs.done | ~row_valid, budget=jnp.full((fs.batch,), s + max_tokens, jnp.int32))
  fs = decoding.decode_in_jit(
    graphdef,
    params,
    fs,
    close_rule,
    eos_mask,
    temperature,
    jnp.float32(1.0),
    jnp.int32(max_tokens),
    greedy=False,
    top_k=0,
    filtered=False,
    capture=capture,
    shard=shard,
  )
  sampled = (pos >= s) & (pos < fs.lengths[:, None])  # [R, Nbuf] the sampled tokens of each sample row
  if reading == "paper":
    ent = fs.features.token_entropy
    count = jnp.sum(sampled, axis=1)
    mean_ent = jnp.sum(jnp.where(sampled, ent, 0.0), axis=1) / jnp.maximum(count, 1)
    conf = jnp.mean(jnp.where(count > 0, jnp.exp(-mean_ent), 0.0).reshape(b, c, n), axis=-1)
    acc = acc.reshape(b, c)
  else:  # the released script's reading, from the samples' top-K lists
    top_p = fs.features.top_probs  # [R, Nbuf, K]
    top_ids = fs.features.top_ids
    a = answers.shape[1]
    first = a - answer_len  # [B] the answer's first column in the left-padded block
    row_first = jnp.repeat(jnp.repeat(first, c), n)
    row_len = jnp.repeat(a_len, n)
    row_ans = jnp.repeat(jnp.repeat(answers, c, axis=0), n, axis=0)  # [R, A]
    k_idx = pos - s  # the answer position read at buffer position pos
    target = jnp.take_along_axis(row_ans, jnp.clip(row_first[:, None] + k_idx, 0, a - 1), axis=1)  # [R, Nbuf]
    read = sampled & (k_idx < row_len[:, None])
    hit = top_ids == target[..., None]  # [R, Nbuf, K]
    p_hit = jnp.sum(jnp.where(hit, top_p, 0.0), axis=-1)
    lp_k = jnp.where(jnp.any(hit, axis=-1), jnp.log(jnp.maximum(p_hit, 1e-30)), REFERENCE_MISSING_LOGPROB)
    h_k = -jnp.sum(jnp.where(top_p > 0, top_p * jnp.log(jnp.maximum(top_p, 1e-30)), 0.0), axis=-1)
    k_n = jnp.sum(read, axis=1)
    acc_n = jnp.where(k_n > 0, jnp.exp(jnp.sum(jnp.where(read, lp_k, 0.0), axis=1)) / jnp.maximum(k_n, 1), 0.0)
    conf_n = jnp.where(k_n > 0, jnp.exp(-jnp.sum(jnp.where(read, h_k, 0.0), axis=1)) / jnp.maximum(k_n, 1), 0.0)
    acc = jnp.sum(acc_n.reshape(b, c, n), axis=-1) / n
    conf = jnp.sum(conf_n.reshape(b, c, n), axis=-1) / n
  nan = jnp.float32(jnp.nan)
  ok = valid.reshape(b, c)
  return jnp.where(ok, acc, nan), jnp.where(ok, conf, nan)


probe, probe_in_jit = decode_jit(
  static_argnames=("graphdef", "shard", "n", "suffix_size", "buffer_len", "max_tokens", "reading", "top_logprobs")
)(_probe_impl)


def cut_keys(seed: int, trajectory_seeds, ordinals) -> Key[Array, "b c"]:
  """[B, C] typed keys fold_in(fold_in(key(seed), trajectory_seeds[b]), ordinals[b, c])."""
  seed = check_seed(seed, "cut_keys: seed")
  seeds = np.asarray(check_seeds(trajectory_seeds, "cut_keys: trajectory_seeds"), np.uint32)
  base = decode_state.prompt_keys(seed, seeds)  # [B]
  ords = jnp.asarray(ordinals, jnp.uint32)
  return jax.vmap(lambda k, o: jax.vmap(lambda x: jax.random.fold_in(k, x))(o))(base, ords)


# ------------------------------------------------------------------------------------------------ host shell


class Prober:
  """Binds a model and a ProbeConfig: checks inputs at the boundary, buckets shapes, runs `probe` in chunks."""

  def __init__(self, lm, cfg: ProbeConfig = ProbeConfig()):
    if not isinstance(cfg, ProbeConfig):
      raise ConfigError(f"Prober: expected a ProbeConfig, got {type(cfg).__name__}")
    if lm.tokenizer is None:
      raise ConfigError("SPAE probing needs the model's tokenizer (the suffix, the answers, the boundaries)")
    self.lm, self.cfg = lm, cfg
    tok = lm.tokenizer
    v = lm.config.vocab_size
    self.suffix_ids = list(tok(cfg.suffix, add_special_tokens=False)["input_ids"])
    if cfg.reading == "reference_code" and cfg.top_logprobs > v:
      raise ConfigError(f"ProbeConfig.top_logprobs={cfg.top_logprobs} exceeds the vocabulary ({v})")
    close = np.zeros(v, bool)
    for i in range(min(v, len(tok))):
      close[i] = "}" in tok.decode([i])
    if not close.any():
      raise ConfigError("SPAE probing: no token of this tokenizer holds '}', so a probe answer can never close")
    self.close_rule = StopRule.from_mask(close)
    self.table = StepBoundary("paragraph").compile(tok, v)
    self.eos = jnp.asarray(lm.eos_mask())
    think = tok.convert_tokens_to_ids(THINK_OPEN)
    self.think_id = think if isinstance(think, int) and think != tok.unk_token_id else None

  # -- inputs

  def answer_ids(self, answers: Sequence[str], where: str = "answers") -> list[list[int]]:
    """The token ids of each ground-truth answer; ConfigError naming `<where>[i]` unless it is a string (bytes
    would be probed as the text "b'...'"), DataFormatError when it tokenizes to nothing."""
    if isinstance(answers, (str, bytes)) or not hasattr(answers, "__len__") or not hasattr(answers, "__iter__"):
      raise ConfigError(f"{where}: expected a sequence of answer strings, got {shown(answers)}")
    out = []
    for i, a in enumerate(answers):
      if not isinstance(a, str):
        raise ConfigError(f"{where}[{i}]: expected the ground-truth answer as a string, got {shown(a)}")
      ids = list(self.lm.tokenizer(a, add_special_tokens=False)["input_ids"])
      if not ids:
        raise DataFormatError(f"SPAE probing: ground-truth answer {i} ({a!r}) tokenizes to no tokens")
      out.append(ids)
    return out

  def token_rows(self, rows, where: str) -> list[list[int]]:
    """Each row of `rows` as a list of token ids of this model's vocabulary; ConfigError naming `<where>[i]`."""
    if isinstance(rows, (str, bytes)) or not hasattr(rows, "__len__") or not hasattr(rows, "__iter__"):
      raise ConfigError(f"{where}: expected a sequence of token id sequences, got {shown(rows)}")
    out = []
    for i, row in enumerate(rows):
      try:
        out.append(token_ids(row))
      except DataFormatError as e:
        raise ConfigError(f"{where}[{i}]: {e}") from None
    self.lm.check_ids(out, where)
    return out

  def check_thinking(self, response_ids: Sequence[Sequence[int]], names: Sequence[str] | None = None) -> None:
    for i, ids in enumerate(response_ids):
      has = (self.think_id in ids) if self.think_id is not None else (THINK_OPEN in self.lm.tokenizer.decode(list(ids)))
      if not has:
        name = names[i] if names else f"trajectory {i}"
        raise DataFormatError(
          f"SPAE probing: {name} has no {THINK_OPEN} (the potential is defined on thinking trajectories only)"
        )

  def probe_room(self, answer_len: int) -> int:
    """Suffix-cache slots a probe row needs: the boundary token again, the suffix, then the answer or samples."""
    return bucket(1 + len(self.suffix_ids) + max(answer_len, self.cfg.max_tokens))

  def check_room(self, context_len: int, answer_len: int) -> None:
    need = context_len + 1 + len(self.suffix_ids) + max(answer_len, self.cfg.max_tokens)
    if need > self.lm.config.max_position_embeddings:
      raise CacheFullError(
        f"SPAE probing: a context of {context_len} tokens + the probe suffix ({len(self.suffix_ids)} tokens) + "
        f"{max(answer_len, self.cfg.max_tokens)} answer tokens exceeds max_position_embeddings="
        f"{self.lm.config.max_position_embeddings}"
      )

  # -- boundaries

  def boundaries(self, response_ids: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Per response: the token index of the last token of every paragraph step before `</think>` (docs/method.md
    §A1)."""
    if not response_ids:
      return []
    n = bucket(max(1, max(map(len, response_ids))))
    toks = np.zeros((len(response_ids), n), np.int32)
    lens = np.zeros(len(response_ids), np.int32)
    for i, ids in enumerate(response_ids):
      toks[i, : len(ids)], lens[i] = ids, len(ids)
    marks = np.asarray(boundary_marks(self.table, jnp.asarray(toks), jnp.asarray(lens)))
    return [np.flatnonzero(marks[i, : lens[i]]) for i in range(len(response_ids))]

  # -- the device call

  def probe_state(
    self,
    state: DecodeState,
    cuts: Integer[np.ndarray, "b c"],
    ordinals: Integer[np.ndarray, "b c"],
    answers: list[list[int]],
    trajectory_seeds: Sequence[int],
  ) -> tuple[Float[Array, "b c"], Float[Array, "b c"]]:
    """(acc, conf) [B, C] device arrays for cuts [B, C] (-1 = none) of the rows of `state` (no shared prefix)."""
    with shape_errors("Prober.probe_state: cuts [B, C] and ordinals [B, C] of the state's B rows"):
      chex.assert_rank(cuts, 2)
      chex.assert_axis_dimension(cuts, 0, state.batch)
      chex.assert_equal_shape([cuts, ordinals])
      chex.assert_type([cuts, ordinals], int)
    trajectory_seeds = check_seeds(trajectory_seeds, "Prober.probe_state: trajectory_seeds")
    if not len(answers) == len(trajectory_seeds) == state.batch:
      raise ConfigError(
        f"Prober.probe_state: {len(answers)} answers and {len(trajectory_seeds)} seeds for "
        f"{state.batch} rows; need one of each per row"
      )
    b, c = cuts.shape
    state = constrain_rows(state, self.lm.shard, put=True)  # data parallel: its rows over the mesh's data axis
    a = bucket(max(map(len, answers)), minimum=1)
    ans = np.zeros((b, a), np.int32)  # left-padded, as `force` takes its blocks
    alen = np.ones(b, np.int32)
    for i, ids in enumerate(answers):
      ans[i, a - len(ids) :], alen[i] = ids, len(ids)
    keys = cut_keys(self.cfg.seed, trajectory_seeds, np.maximum(ordinals, 0))
    cfg = self.cfg
    buf = bucket(len(self.suffix_ids) + max(a, cfg.max_tokens))
    return probe(
      *self.lm.decode_view(),
      state,
      jnp.asarray(cuts, jnp.int32),
      keys,
      jnp.asarray(self.suffix_ids, jnp.int32),
      jnp.asarray(ans),
      jnp.asarray(alen),
      self.close_rule,
      self.eos,
      jnp.float32(cfg.temperature),
      n=cfg.samples,
      suffix_size=self.probe_room(a),
      buffer_len=buf,
      max_tokens=cfg.max_tokens,
      reading=cfg.reading,
      top_logprobs=cfg.top_logprobs,
      shard=self.lm.shard,
    )

  def teacher_forced_state(
    self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]
  ) -> DecodeState:
    """A decode state whose rows hold the given responses (fed through the model once, as `force` does)."""
    smp = self.lm.sampler(capture=CaptureSpec())
    longest = max(1, max(map(len, response_ids)))  # bucketed, within the room the positions leave
    longest = max(longest, min(bucket(longest), self.lm.config.max_position_embeddings - max(map(len, prompt_ids))))
    state = smp.prefill([list(p) for p in prompt_ids], max_new_tokens=longest, share=False)
    state = smp.force(state, [list(r) if len(r) else None for r in response_ids])
    return constrain_rows(state, self.lm.shard, put=True)  # its rows (cache, buffers) over the mesh's data axis

  def potentials(
    self,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    answers: Sequence[str],
    trajectory_seeds: Sequence[int],
    *,
    names: Sequence[str] | None = None,
    progress=None,
  ) -> list[StepPotentials]:
    """The potentials at every boundary of every trajectory (prompt ids, response ids without EOS, the true
    answer, a seed per trajectory: the same trajectory and seed give the same potentials in any batch)."""
    prompt_ids = self.token_rows(prompt_ids, "potentials: prompt_ids")
    response_ids = self.token_rows(response_ids, "potentials: response_ids")
    trajectory_seeds = check_seeds(trajectory_seeds, "potentials: trajectory_seeds")
    ans = self.answer_ids(answers, "potentials: answers")
    m = len(response_ids)
    if not (len(prompt_ids) == len(answers) == len(trajectory_seeds) == m):
      raise ConfigError(
        f"potentials: {len(prompt_ids)} prompts, {m} responses, {len(answers)} answers and "
        f"{len(trajectory_seeds)} seeds; need one of each per trajectory"
      )
    if names is not None and (isinstance(names, str) or len(names) != m):
      raise ConfigError(f"potentials: names: expected one name per trajectory ({m}), got {shown(names)}")
    self.check_thinking(response_ids, names)
    for p, r, a in zip(prompt_ids, response_ids, ans):
      self.check_room(len(p) + len(r), len(a))
    cuts = self.boundaries(response_ids)
    out: list[StepPotentials | None] = [None] * m
    order = sorted(range(m), key=lambda i: (len(cuts[i]), len(response_ids[i])))  # less padding per chunk
    bs = self.cfg.batch_size
    for start in range(0, m, bs):
      idx = [i for i in order[start : start + bs] if len(cuts[i])]
      for i in order[start : start + bs]:
        if not len(cuts[i]):
          out[i] = StepPotentials.of(np.zeros(0, int), np.zeros(0), np.zeros(0), self.cfg.eps_sat)
      if idx:
        self._chunk(idx, prompt_ids, response_ids, ans, trajectory_seeds, cuts, out)
      if progress is not None:
        progress(min(bs, m - start))
    return out

  def _chunk(self, idx, prompt_ids, response_ids, ans, seeds, cuts, out):
    b = bucket(len(idx), minimum=1)
    c = -(-max(len(cuts[i]) for i in idx) // CUT_STEP) * CUT_STEP  # boundaries per row, padded to CUT_STEP
    pad = idx + [idx[0]] * (b - len(idx))  # batch padding repeats a real row (its results are dropped)
    state = self.teacher_forced_state([prompt_ids[i] for i in pad], [response_ids[i] for i in pad])
    cut_arr = np.full((b, c), -1, np.int32)
    for r, i in enumerate(idx):
      cut_arr[r, : len(cuts[i])] = cuts[i]
    ordinals = np.broadcast_to(np.arange(c, dtype=np.int32), (b, c))
    acc, conf = jax.device_get(
      self.probe_state(state, cut_arr, ordinals, [ans[i] for i in pad], [seeds[i] for i in pad])
    )
    for r, i in enumerate(idx):
      k = len(cuts[i])
      out[i] = StepPotentials.of(cuts[i], acc[r, :k], conf[r, :k], self.cfg.eps_sat)
