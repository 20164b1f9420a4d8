"""Every paragraph boundary of every trajectory of a batch probed in one call (SPAE's step potential,
docs/method.md §B1; `potential` says what is read and how Phi is made of it).

How it runs (`potential.probe`, one jitted program): the trajectories' own decode state (its KV cache) is forked at
every boundary into a row that reads that cache as a shared prefix cut at the boundary (`decoding.fork`: no re-prefill
of the question or of earlier steps, no copy); one `force` call feeds the suffix to all of them, a second the
answer tokens (their log-probs are Acc's terms); N copies of each suffix row (its few own slots copied, the prefix
still shared) then sample the continuations of all boundaries of all trajectories in one `decode` call, each row
stopping at its `}`.

Randomness: the n-th continuation at the c-th boundary of a trajectory draws from
fold_in(fold_in(fold_in(key(seed), trajectory_seed), c), n), so a trajectory's potentials are the same in any batch.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Integer

from reprobe_jax.errors import CacheFullError, ConfigError, DataFormatError, shape_errors
from reprobe_jax.fields import check_seeds
from reprobe_jax.io.readers import shown
from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.decode_state import DecodeState, StopRule
from reprobe_jax.models.sampling import bucket
from reprobe_jax.models.sharding import constrain_rows
from reprobe_jax.steps import THINK_OPEN, StepBoundary, token_ids
from reprobe_jax.spae.potential import (
  BOUNDARY_TEXT,
  ProbeConfig,
  StepPotentials,
  boundary_marks,
  cut_keys,
  in_context,
  paragraph_head,
  probe,
)
from reprobe_jax.trajectories.prompts import opens_thinking

ANSWER_BUCKET = 4  # the fewest answer columns a probe call has (left padding is masked: it changes no value)
CUT_STEP = 4  # a chunk's boundaries per trajectory are padded to a multiple of this (few shapes, little padding)
THINK_TAIL = 16  # prompt tokens read for a template-opened '<think>' (it and the whitespace after it fit)


def cut_columns(most: int) -> int:
  """The boundary columns of a probe call whose rows hold at most `most` boundaries: `most` rounded up to a multiple
  of CUT_STEP (at least CUT_STEP). Every row of the call pays for every column (fork, suffix, answer and N samples),
  so the columns follow the rows' own counts; a multiple of CUT_STEP keeps the compiled shapes few."""
  return max(CUT_STEP, -(-most // CUT_STEP) * CUT_STEP)


# ------------------------------------------------------------------------------------------------ host shell


class ProbeAnswers(NamedTuple):
  """Answer ids as `probe` takes them: [B, A] left-padded (A a bucket), lengths [B], a probe row's buffer."""

  answers: np.ndarray
  answer_len: np.ndarray
  buffer_len: int


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
    alone = list(tok(cfg.suffix, add_special_tokens=False)["input_ids"])
    self.suffix_ids = in_context(tok, BOUNDARY_TEXT, cfg.suffix) or alone  # as it follows a paragraph's end
    self._answers: dict[str, list[int]] = {}
    if cfg.reading == "reference_code" and cfg.top_logprobs > v:
      raise ConfigError(f"ProbeConfig.top_logprobs={cfg.top_logprobs} exceeds the vocabulary ({v})")
    close = np.zeros(v, bool)
    self.merged_ends: dict[int, str] = {}  # token -> its text to the paragraph end it holds before more text
    for i in range(min(v, len(tok))):
      text = tok.decode([i])
      close[i] = "}" in text
      head = paragraph_head(text)
      if head is not None:
        self.merged_ends[i] = head
    if not close.any():
      raise ConfigError("SPAE probing: no token of this tokenizer holds '}', so a probe answer can never close")
    self.close_rule = StopRule.from_mask(close)
    self.table = StepBoundary("paragraph").compile(tok, v)
    self.eos = jnp.asarray(lm.eos_mask())
    think = tok.convert_tokens_to_ids(THINK_OPEN)
    self.think_id = think if isinstance(think, int) and think != tok.unk_token_id else None

  # -- inputs

  def answer_ids(self, answers: Sequence[str], where: str = "answers") -> list[list[int]]:
    """The token ids of each ground-truth answer as the model writes it after the probe suffix (`in_context`; where
    a token straddles the suffix's end, the answer's own ids less leading whitespace-only tokens: docs/method.md
    §B1); ConfigError naming `<where>[i]` unless it is a string (bytes would be probed as the text "b'...'"),
    DataFormatError when it tokenizes to nothing."""
    if isinstance(answers, (str, bytes)) or not hasattr(answers, "__len__") or not hasattr(answers, "__iter__"):
      raise ConfigError(f"{where}: expected a sequence of answer strings, got {shown(answers)}")
    out = []
    for i, a in enumerate(answers):
      if not isinstance(a, str):
        raise ConfigError(f"{where}[{i}]: expected the ground-truth answer as a string, got {shown(a)}")
      ids = self._answer_ids(a)
      if not ids:
        raise DataFormatError(f"SPAE probing: ground-truth answer {i} ({a!r}) tokenizes to no tokens")
      out.append(ids)
    return out

  def _answer_ids(self, answer: str) -> list[int]:
    if answer not in self._answers:
      tok = self.lm.tokenizer
      ids = in_context(tok, BOUNDARY_TEXT + self.cfg.suffix, answer)
      if ids is None:
        ids = list(tok(answer, add_special_tokens=False)["input_ids"])
        while len(ids) > 1 and not tok.decode(ids[:1]).strip():  # SentencePiece's lone '▁' that opens a text
          ids = ids[1:]
      self._answers[answer] = ids
    return self._answers[answer]

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

  def thinks(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> np.ndarray:
    """[M] bool: trajectory m thinks, i.e. its response holds `<think>` or its prompt ends with it (the chat
    template opened the thinking: `trajectories.prompts.opens_thinking` on the prompt's last tokens)."""
    tok = self.lm.tokenizer
    out = np.zeros(len(response_ids), bool)
    for i, ids in enumerate(response_ids):
      if self.think_id is not None and self.think_id in ids:
        out[i] = True
      elif self.think_id is None and THINK_OPEN in tok.decode(list(ids)):
        out[i] = True
      elif prompt_ids is not None and len(prompt_ids[i]):
        out[i] = opens_thinking(tok.decode(list(prompt_ids[i])[-THINK_TAIL:]))
    return out

  def check_thinking(
    self,
    response_ids: Sequence[Sequence[int]],
    names: Sequence[str] | None = None,
    prompt_ids: Sequence[Sequence[int]] | None = None,
  ) -> None:
    """DataFormatError naming the first trajectory that does not think (`thinks`; without prompts, the response
    must hold `<think>`)."""
    ok = self.thinks(prompt_ids, response_ids)
    for i in np.flatnonzero(~ok)[:1]:
      name = names[i] if names else f"trajectory {i}"
      raise DataFormatError(
        f"SPAE probing: {name} has no {THINK_OPEN} in its response nor at the end of its prompt (the potential is "
        "defined on thinking trajectories only)"
      )

  def probe_room(self, answer_len: int) -> int:
    """Suffix-cache slots a probe row needs: the boundary token again, the suffix, then the answer or samples."""
    return bucket(1 + len(self.suffix_ids) + max(answer_len, self.cfg.max_tokens))

  def check_room(self, context_len: int, answer_len: int) -> None:
    """CacheFullError unless a probe row at the end of a context of `context_len` tokens fits the positions: the
    boundary token read again, the suffix, then the answer or the samples (in-context ids)."""
    need = context_len + 1 + len(self.suffix_ids) + max(answer_len, self.cfg.max_tokens)
    if need > self.lm.config.max_position_embeddings:
      raise CacheFullError(
        f"SPAE probing: a context of {context_len} tokens + 1 (the boundary token read again) + the probe suffix "
        f"({len(self.suffix_ids)} tokens) + {max(answer_len, self.cfg.max_tokens)} answer tokens = {need} exceeds "
        f"max_position_embeddings={self.lm.config.max_position_embeddings}"
      )

  def check_budget(self, prompt_len: int, max_new_tokens: int, answers: Sequence[str]) -> None:
    """Before a run's first step: CacheFullError naming the numbers unless the longest prompt (`prompt_len`) +
    `max_new_tokens` leaves a probe row room for the longest of `answers` (in-context ids) or the samples."""
    longest = max((len(ids) for ids in self.answer_ids(answers, "check_budget: answers")), default=0)
    try:
      self.check_room(prompt_len + max_new_tokens, longest)
    except CacheFullError as e:
      raise CacheFullError(f"a prompt of {prompt_len} tokens + max_new_tokens={max_new_tokens}: {e}") from None

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

  def probe_answers(self, answers: list[list[int]]) -> ProbeAnswers:
    """Answer ids, one list per row, as `probe` takes them: left-padded to a bucket (at least ANSWER_BUCKET
    columns, so answers of 1 to 4 tokens share one compiled probe), with their lengths."""
    a = bucket(max(map(len, answers)), minimum=ANSWER_BUCKET)
    ans = np.zeros((len(answers), a), np.int32)  # left-padded, as `force` takes its blocks
    alen = np.ones(len(answers), np.int32)
    for i, ids in enumerate(answers):
      ans[i, a - len(ids) :], alen[i] = ids, len(ids)
    return ProbeAnswers(ans, alen, bucket(len(self.suffix_ids) + max(a, self.cfg.max_tokens)))

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
    state = constrain_rows(state, self.lm.shard, put=True)  # data parallel: its rows over the mesh's data axis
    a = self.probe_answers(answers)
    keys = cut_keys(self.cfg.seed, trajectory_seeds, np.maximum(ordinals, 0))
    cfg = self.cfg
    return probe(
      *self.lm.decode_view(),
      state,
      jnp.asarray(cuts, jnp.int32),
      keys,
      jnp.asarray(self.suffix_ids, jnp.int32),
      jnp.asarray(a.answers),
      jnp.asarray(a.answer_len),
      self.close_rule,
      self.eos,
      jnp.float32(cfg.temperature),
      n=cfg.samples,
      suffix_size=self.probe_room(a.answers.shape[1]),
      buffer_len=a.buffer_len,
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
    self.check_thinking(response_ids, names, prompt_ids)
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
    c = cut_columns(max(len(cuts[i]) for i in idx))
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
