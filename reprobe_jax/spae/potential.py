"""SPAE's Step Potential (docs/method.md §B1): what is read at each paragraph boundary of a thinking trajectory
(the suffix and the answer tokenised in context, `in_context`; the boundaries, `boundary_marks`), the jitted probe
program that reads it (`probe`), and Phi. `prober.Prober` probes every boundary of a batch in one call.

At boundary k of a thinking trajectory the model is asked for its answer so far: the probe suffix
`**Final Answer**\\n\\\\boxed{` is appended to the prompt + response up to and including the boundary's last token,
and then
- Conf = (1/N) sum_n exp(-(1/L_n) sum_l H_{n,l}) over N continuations of at most `max_tokens` tokens sampled at
  T = 0.6, H the full-vocabulary entropy (temperature 1) of the distribution each sampled token came from, L_n
  the tokens of sample n up to and including the one that holds the closing `}` (or its EOS, or all of them);
- Acc = (1/|y*|) sum_m p(y*_m | prefix, suffix, y*_<m), teacher-forced on the ground-truth answer tokens y*;
- Phi = 1.5 Acc Conf + 0.5 Acc - Conf; the boundary is saturated when Phi > eps_sat (0.9).

`reading='reference_code'` reproduces the released script (cii030/SPAE-RL, inference/probe_mechanism_example.py):
for sample n and answer position k < min(|y*|, L_n), the top-20 list of the *sampled* continuation's k-th position
gives lp_k (the answer token's log-prob when it is in the list, else -10) and H_k (the entropy of the 20 listed
probabilities, not renormalised); Acc_n = exp(sum_k lp_k) / K_n, Conf_n = exp(-sum_k H_k) / K_n, K_n the number of
positions read, and Acc, Conf the sums over samples divided by N. docs/method.md says why the paper reading is the
default.
"""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Integer, Key

from reprobe_jax.errors import ConfigError, shape_errors
from reprobe_jax.fields import SEED, Int, OneOf, Real, check_fields, check_seed, check_seeds, field_name
from reprobe_jax.models import decoding
import reprobe_jax.models.decode_state as decode_state
from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.decode_state import DecodeState, StopRule
from reprobe_jax.models.xla_options import decode_jit
from reprobe_jax.steps import ENDS_AFTER, ENDS_BEFORE
from reprobe_jax.tasks.response import ANSWER_OPENER

READINGS = ("paper", "reference_code")
REFERENCE_MISSING_LOGPROB = -10.0  # what the released script adds when the answer token is not in the top-20 list
BOUNDARY_TEXT = "\n\n"  # the text a paragraph boundary ends with: what the probe suffix follows (docs/method.md §B1)

EPS_SAT = Real(-1.0, 1.0, high_open=True)
"""The saturation threshold's rule: Phi is in [-1, 1] (docs/method.md §B1) and a boundary is saturated when
Phi > eps_sat, so both outcomes are reachable exactly for eps_sat in [-1, 1) (at 1 nothing ever saturates, below -1
every probed boundary does)."""


def step_potential(acc: Float[Array, "*s"], conf: Float[Array, "*s"]) -> Float[Array, "*s"]:
  """Phi = 1.5 Acc Conf + 0.5 Acc - Conf (docs/method.md §B1), elementwise over two arrays of one shape, any shape (NaN
  stays NaN): (0, 0) -> 0 exploration, (1, 1) -> 1 correct and sure, (0, 1) -> -1 false confidence, (1, 0) -> 0.5."""
  with shape_errors("step_potential: acc and conf"):
    chex.assert_equal_shape([acc, conf])
  return 1.5 * acc * conf + 0.5 * acc - conf


def saturated(phi, eps_sat: float = 0.9):
  """Phi > eps_sat, elementwise (NaN is never saturated)."""
  return phi > eps_sat


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
  """docs/method.md §B1's probe: N=5 continuations of at most 10 tokens at T=0.6, eps_sat 0.9."""

  samples: int = 5
  max_tokens: int = 10
  temperature: float = 0.6
  eps_sat: float = 0.9
  suffix: str = ANSWER_OPENER
  reading: str = "paper"  # or 'reference_code' (the released script's top-20 reading, module docstring)
  top_logprobs: int = 20  # the list length of the reference reading
  seed: int = 0
  batch_size: int = 16  # trajectories per probing call (rows: batch_size * boundaries * (samples + 1))

  def __post_init__(self):
    check_fields(
      self,
      {
        "samples": Int(1),
        "max_tokens": Int(1),
        "temperature": Real(0.0, low_open=True),
        "eps_sat": EPS_SAT,
        "reading": OneOf(READINGS),
        "top_logprobs": Int(1),
        "seed": SEED,
        "batch_size": Int(1),
      },
    )
    if not isinstance(self.suffix, str) or not self.suffix:
      raise ConfigError(f"{field_name(self, 'suffix')}: expected a non-empty string, got {self.suffix!r}")


@dataclasses.dataclass(frozen=True)
class StepPotentials:
  """One trajectory's potentials: one entry per paragraph boundary before `</think>`, in order.

  cuts: the response-token index of each boundary's last token (the probe reads the response up to and including
  it). acc, conf, phi: NaN where the boundary was skipped (a boundary that closes a step with no tokens)."""

  cuts: Integer[np.ndarray, " c"]
  acc: Float[np.ndarray, " c"]
  conf: Float[np.ndarray, " c"]
  phi: Float[np.ndarray, " c"]
  eps_sat: float = 0.9

  @property
  def saturated(self) -> np.ndarray:
    return saturated(self.phi, self.eps_sat)

  @property
  def first_saturated(self) -> int | None:
    """Index of the first saturated boundary, or None."""
    hit = np.flatnonzero(self.saturated)
    return int(hit[0]) if hit.size else None

  def __len__(self) -> int:
    return int(self.cuts.shape[0])

  @classmethod
  def of(cls, cuts, acc, conf, eps_sat: float = 0.9) -> "StepPotentials":
    """From per-boundary cuts, Acc and Conf (Phi computed here)."""
    if not EPS_SAT.ok(eps_sat):
      raise ConfigError(f"StepPotentials.eps_sat: expected {EPS_SAT}, got {eps_sat!r}")
    acc = np.asarray(acc, np.float64)
    conf = np.asarray(conf, np.float64)
    return cls(np.asarray(cuts, np.int64).reshape(-1), acc, conf, step_potential(acc, conf), eps_sat)


# ------------------------------------------------------------------------------------------------ what is read


def in_context(tokenizer, before: str, text: str) -> list[int] | None:
  """The ids of `text` as the tokenizer writes it right after `before` (docs/method.md §B1): `before + text`
  tokenised, less its first tokens, which must decode to what `before` alone decodes to. A SentencePiece-style
  tokenizer writes '42' as ['▁', '4', '2'] alone and ['4', '2'] after '{'; a byte-level BPE may write '\n\n'
  alone as one token and split it before a word. None when no token boundary falls at the join (a token straddles
  it)."""
  enc = lambda t: list(tokenizer(t, add_special_tokens=False)["input_ids"])
  head, joint = enc(before), enc(before + text)
  if joint[: len(head)] == head:
    return joint[len(head) :]
  want = tokenizer.decode(head)
  for k in range(1, len(joint) + 1):
    got = tokenizer.decode(joint[:k])
    if got == want:
      return joint[k:]
    if len(got) > len(want):
      return None
  return None


def paragraph_head(text: str) -> str | None:
  """A token's text up to and including the paragraph end (BOUNDARY_TEXT) it holds, where more than whitespace
  follows it in the same token ('\\n\\nSo' -> '\\n\\n'); None for any other token. Such a token closes its
  paragraph step (`steps.boundary`: the token that completes '.\\n\\n' closes its step), so the probe reads it
  whole, and truncation puts `</think>` after its head (docs/method.md §B3)."""
  j = text.find(BOUNDARY_TEXT)
  if j < 0 or not text[j + len(BOUNDARY_TEXT) :].strip():
    return None
  return text[: j + len(BOUNDARY_TEXT)]


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


def cut_keys(seed: int, trajectory_seeds, ordinals) -> Key[Array, "b c"]:
  """[B, C] typed keys fold_in(fold_in(key(seed), trajectory_seeds[b]), ordinals[b, c])."""
  seed = check_seed(seed, "cut_keys: seed")
  seeds = np.asarray(check_seeds(trajectory_seeds, "cut_keys: trajectory_seeds"), np.uint32)
  base = decode_state.prompt_keys(seed, seeds)  # [B]
  ords = jnp.asarray(ordinals, jnp.uint32)
  return jax.vmap(lambda k, o: jax.vmap(lambda x: jax.random.fold_in(k, x))(o))(base, ords)


# ------------------------------------------------------------------------------------------------ the probe program


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
