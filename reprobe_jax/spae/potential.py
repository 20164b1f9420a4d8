"""SPAE's Step Potential (docs/method.md §B1): what is read at each paragraph boundary of a thinking trajectory, and
Phi. `prober.Prober` probes every boundary of a batch in one call.

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
import reprobe_jax.models.decode_state as decode_state
from reprobe_jax.steps import ENDS_AFTER, ENDS_BEFORE
from reprobe_jax.tasks.response import ANSWER_OPENER

READINGS = ("paper", "reference_code")
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
