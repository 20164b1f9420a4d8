"""The step-scorer interface: per-token inputs + step spans -> per-step scores on device (docs/method.md §A6, §A7).

A scorer is a flax struct: its configuration is static (it goes into the pytree's structure, so jit compiles once
per configuration) and its arrays (a probe's parameters, a random key) are traced leaves. `score` and
`score_newest` are pure functions of fixed shapes, so a search loop can call them inside its own jitted
`while_loop`; the module-level `score` / `score_newest` below are the jitted entry points for everything else.
Every score is "higher = more likely incorrect"; a step with no tokens scores NaN.

A *stateful* scorer (`stateful = True`, a PRM with its own KV cache) also keeps per-row state across the rounds of a
search: `init_carry` builds each row's state from its prompt, `advance` scores a row's next step from that state and
returns it extended by the step, and a search gathers the carries of its survivors (`take_carry`) with their decode
rows. Contract: advancing a row's steps one by one from `init_carry` gives the scores `score` gives on the whole row.

A scorer also says what it needs of the target and how it is best run (`feature_spec`, `feature_dim`,
`model_fingerprint`, `vocab_size`, `packs_trajectories`), so that callers (`tts.checks`, Best-of-N) ask the scorer,
never test its class.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, ClassVar, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from reprobe_jax.errors import ConfigError, shape_errors
from reprobe_jax.features import FeatureSpec, with_logprobs
from reprobe_jax.io.readers import shown
from reprobe_jax.models.decode_state import DecodeState
from reprobe_jax.models.sampling import bucket
from reprobe_jax.models.sharding import ShardingCtx


@dataclasses.dataclass(frozen=True)
class PendingScores:
  """Step scores [B, S] not fetched yet: `values`, a pytree of device arrays, and `unpack`, which makes the [B, S]
  numpy scores of their host copies (`result()` fetches and unpacks)."""

  values: Any
  unpack: Callable[[Any], np.ndarray] = np.asarray

  def result(self) -> np.ndarray:
    return self.unpack(jax.device_get(self.values))


@struct.dataclass
class ScoreInputs:
  """What a scorer may read per token, next-token aligned (entry j is about token j, docs/method.md §A3): token_mask
  [B, T] bool (True = a real token); features [B, T, F] (a probe's FeatureSpec assembly); logprobs (log p of the
  token), entropy and self_certainty (KL(U || p)) of the distribution that produced it, [B, T] each; tokens [B, T]
  int32 the response token ids (entry j = token j, as token_mask and spans index them); prompt_ids [B, Tp] int32
  each row's prompt, LEFT-padded, with prompt_mask [B, Tp] bool (True = a real prompt token). Fields a scorer does
  not read may be None."""

  token_mask: Bool[Array, "b t"]
  features: Float[Array, "b t f"] | None = None
  logprobs: Float[Array, "b t"] | None = None
  entropy: Float[Array, "b t"] | None = None
  self_certainty: Float[Array, "b t"] | None = None
  tokens: Int[Array, "b t"] | None = None
  prompt_ids: Int[Array, "b tp"] | None = None
  prompt_mask: Bool[Array, "b tp"] | None = None

  def get(self, field: str, scorer: str) -> jax.Array:
    """The named array, checked: per-token fields against token_mask's [B, T], prompt_ids / prompt_mask as a pair
    of one [B, Tp]; ConfigError if absent or misshapen."""
    x = getattr(self, field)
    if x is None:
      raise ConfigError(f"scorer {scorer!r} reads ScoreInputs.{field}, which is None")
    if field in ("prompt_ids", "prompt_mask"):
      other = "prompt_mask" if field == "prompt_ids" else "prompt_ids"
      y = getattr(self, other)
      if y is None:
        raise ConfigError(f"scorer {scorer!r} reads ScoreInputs.{field}, whose {other} is None")
      if x.ndim != 2 or x.shape[0] != self.token_mask.shape[0] or tuple(y.shape) != tuple(x.shape):
        raise ConfigError(
          f"ScoreInputs.{field} has shape {tuple(x.shape)} and {other} {tuple(y.shape)}; both must "
          f"be [B, Tp] with B = {self.token_mask.shape[0]} (token_mask's)"
        )
      return x
    if tuple(x.shape[:2]) != tuple(self.token_mask.shape):
      raise ConfigError(f"ScoreInputs.{field} has shape {tuple(x.shape)}; token_mask is {tuple(self.token_mask.shape)}")
    return x


def step_token_mask(spans, token_mask):
  """[B, S, T] bool: token t lies in step s's half-open span [start, end) and is a real token.
  spans [B, S, 2] int32, token_mask [B, T]."""
  pos = jnp.arange(token_mask.shape[1])
  return (pos >= spans[..., 0:1]) & (pos < spans[..., 1:2]) & token_mask.astype(bool)[:, None, :]


def check_spans(spans, inputs: ScoreInputs, what: str = "spans") -> None:
  """Shape check at the API boundary: spans [B, S, 2] of integers with the batch of token_mask [B, T]."""
  with shape_errors("ScoreInputs.token_mask [B, T]"):
    chex.assert_rank(inputs.token_mask, 2)
  if spans.ndim != 3 or spans.shape[-1] != 2 or spans.shape[0] != inputs.token_mask.shape[0]:
    raise ConfigError(f"{what} must be [B, S, 2] with B = {inputs.token_mask.shape[0]}; got {tuple(spans.shape)}")
  with shape_errors(what):
    chex.assert_type(spans, int)


def scorer_name(scorer) -> str:
  """How errors name a scorer: its `name`, else its class's."""
  name = getattr(scorer, "name", None)
  return name if isinstance(name, str) else type(scorer).__name__


def checked_scores(scorer, out, shape: tuple[int, ...], what: str):
  """A scorer's output `out` where it enters its caller (the jitted `score` / `score_newest`, and every search
  strategy: checked while traced, or on the host): an array (jax or numpy) of a floating dtype (NaN marks a step
  with no tokens) and exactly `shape` ([B, S]: one score per step span of each row; [B]: one per row's newest step).
  Returns it; ConfigError naming the scorer, its method (`what`) and what it returned otherwise (a list, a [B] array
  for [B, S], integer scores, ...)."""
  name = scorer_name(scorer)
  if not hasattr(out, "shape") or not hasattr(out, "dtype"):
    raise ConfigError(f"scorer {name!r}: {what} must return an array of scores {list(shape)}, got {shown(out)}")
  if not jnp.issubdtype(out.dtype, jnp.floating):
    raise ConfigError(
      f"scorer {name!r}: {what} must return floating-point scores (NaN for a step with no tokens), got dtype "
      f"{out.dtype}"
    )
  if tuple(out.shape) != tuple(shape):
    rows = "[B, S]: one score per step span of each row" if len(shape) == 2 else "[B]: one score per row"
    raise ConfigError(f"scorer {name!r}: {what} must return scores {rows}, here {list(shape)}; got {list(out.shape)}")
  return out


def bad_scores(scores, spans):
  """Bool mask [...] of the steps with tokens (span end > start) whose score is NaN or +-inf: a score is finite
  wherever a step has tokens (only an empty step scores NaN). scores [...] and spans [..., 2]: numpy on the host,
  or traced inside a jit."""
  xp = np if isinstance(scores, np.ndarray) else jnp
  return ~xp.isfinite(scores) & (spans[..., 1] > spans[..., 0])


def nonfinite_error(scorer, count: int, where: str) -> ConfigError:
  """What a strategy raises when `bad_scores` finds `count` steps with tokens whose scores are not finite: such a
  score would be ranked silently (NaN last, -inf first)."""
  return ConfigError(
    f"scorer {scorer_name(scorer)!r} gave {count} step(s) with tokens a NaN or infinite score ({where}): a score "
    "must be finite wherever a step has tokens (NaN only marks a step with none)"
  )


class StepScorer(abc.ABC):
  """One step scorer (probe, uncertainty baseline, PRM). Subclasses are flax struct dataclasses with a static
  `name` (their registry name) and any arrays as pytree fields. A stateful one sets `stateful = True` and overrides
  `init_carry` and `advance` (see the module docstring); the defaults keep no state."""

  name: str
  stateful: ClassVar[bool] = False
  packs_trajectories: ClassVar[bool] = False  # scores whole trajectories in one call of its own: score_trajectories

  @abc.abstractmethod
  def score(self, inputs: ScoreInputs, spans: Int[Array, "b s 2"]) -> Float[Array, "b s"]:
    """Scores [B, S] float32 of every step; spans [B, S, 2] int32 half-open token spans; empty spans -> NaN."""

  # -- what the scorer needs of the target (checked by `tts.checks.scorer_spec` before any work)

  @property
  def feature_spec(self) -> FeatureSpec | None:
    """The feature set it reads from ScoreInputs.features and was trained on (a probe's own), or None: it reads
    the set the caller assembles, if any."""
    return None

  @property
  def feature_dim(self) -> int | None:
    """The feature width per token its parameters expect, or None."""
    return None

  @property
  def model_fingerprint(self) -> str | None:
    """The target (`features.model_fingerprint`) its parameters were trained on, or None: any target."""
    return None

  @property
  def vocab_size(self) -> int | None:
    """The vocabulary of the token ids it reads (ScoreInputs.tokens, prompt_ids): a PRM reads the target's ids and
    must share its tokenizer. None: it reads no ids."""
    return None

  def dispatch_trajectories(
    self, features: Float[Array, "b n f"], spans: Int[Array, "b s 2"], *, shard: ShardingCtx | None = None
  ) -> "PendingScores":
    """`score_trajectories` left on device (nothing fetched, spans may be device arrays), so that a caller dispatches
    several batches and fetches them at once; shard: the rows over the mesh's data axis. ConfigError for a scorer
    without the capability."""
    raise ConfigError(f"scorer {self.name!r} does not score whole trajectories (packs_trajectories=False)")

  def score_trajectories(
    self, features: Float[Array, "b n f"], spans: Int[Array, "b s 2"], *, shard: ShardingCtx | None = None
  ) -> np.ndarray:
    """[B, S] scores of every step span [B, S, 2] of every row of features [B, N, F] (NaN for a step without tokens:
    padding steps are the empty span (0, 0)) in one batched call of the scorer's own, where `packs_trajectories`;
    ConfigError for a scorer without that capability (callers ask `packs_trajectories` first)."""
    return self.dispatch_trajectories(features, spans, shard=shard).result()

  def score_newest(self, inputs: ScoreInputs, newest_span: Int[Array, "b 2"]) -> Float[Array, " b"]:
    """Scores [B] of one step per row (the newest, in a search); newest_span [B, 2]. Equals the last column of
    `score` for scorers whose step score reads only that step's span and the tokens before it (all of ours)."""
    return self.score(inputs, newest_span[:, None, :])[:, 0]

  def init_carry(self, inputs: ScoreInputs, room: int):
    """Each row's state before its first step: a pytree whose every leaf has leading dim B (it may read
    inputs.prompt_ids / prompt_mask). room (static): the most tokens a row may append after its prompt (its
    response tokens + one per step). Stateless scorers keep none: ()."""
    del inputs, room
    return ()

  def advance(self, carry, inputs: ScoreInputs, span: jax.Array):
    """(scores [B] float32, new carry): the step span [B, 2] of each row scored given the carry of the row's steps
    before it, and that carry extended by the step. A row whose span is empty (end <= start) scores NaN and keeps
    its carry. Stateful scorers override it so that advancing a row's steps one by one from `init_carry` equals
    `score` on the whole row; the default reads no carry: (score_newest, carry)."""
    return self.score_newest(inputs, span), carry


def take_carry(carry, rows):
  """A scorer carry's rows [B'] (int32 indices), gathered on every leaf along axis 0 (a search's survivors)."""
  return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), carry)


@jax.jit
def score(scorer: StepScorer, inputs: ScoreInputs, spans: jax.Array) -> jax.Array:
  """Jitted `scorer.score`: [B, S] float32; compiles once per scorer configuration and (B, T, S)."""
  check_spans(spans, inputs)
  return checked_scores(scorer, scorer.score(inputs, spans), spans.shape[:2], "score").astype(jnp.float32)


@jax.jit
def score_newest(scorer: StepScorer, inputs: ScoreInputs, newest_span: jax.Array) -> jax.Array:
  """Jitted `scorer.score_newest`: [B] float32 for newest_span [B, 2]."""
  check_spans(newest_span[:, None, :], inputs, "newest_span [B, 2]")
  out = scorer.score_newest(inputs, newest_span)
  return checked_scores(scorer, out, newest_span.shape[:1], "score_newest").astype(jnp.float32)


def inputs_from_state(
  state: DecodeState, spec: FeatureSpec | None = None, num_layers: int | None = None, prompts=None
) -> ScoreInputs:
  """ScoreInputs of a decode state's rows (`reprobe_jax.models.decode_state.DecodeState`), on device: the tokens the
  sampler recorded, their log-probs and captured statistics, and, given a FeatureSpec (with the model's layer
  count), the probe's features assembled from the captured values; given prompts = (ids [B, Tp], mask [B, Tp]),
  one per row (`prompt_rows`), the rows' prompts. No second forward."""
  prompt_ids = prompt_mask = None
  if prompts is not None:
    prompt_ids, prompt_mask = prompts
    if prompt_ids.ndim != 2 or prompt_ids.shape[0] != state.batch or prompt_mask.shape != prompt_ids.shape:
      raise ConfigError(
        f"inputs_from_state: prompts must be (ids, mask) of one [{state.batch}, Tp]; got "
        f"{tuple(prompt_ids.shape)} and {tuple(prompt_mask.shape)}"
      )
  feats = state.features
  token_mask = jnp.arange(state.buffer_len)[None, :] < state.lengths[:, None]  # [B, N]
  features = None
  if spec is not None:
    if num_layers is None:
      raise ConfigError("inputs_from_state: a feature spec needs the model's num_layers")
    features = spec.assemble(with_logprobs(feats, state.logprobs), num_layers)
  return ScoreInputs(
    token_mask=token_mask,
    features=features,
    logprobs=state.logprobs,
    entropy=feats.token_entropy,
    self_certainty=feats.token_self_certainty,
    tokens=state.tokens,
    prompt_ids=prompt_ids,
    prompt_mask=prompt_mask,
  )


def prompt_rows(
  prompt_ids: Sequence[Sequence[int]], n: int, batch: int, pad_id: int = 0
) -> tuple[np.ndarray, np.ndarray]:
  """The prompts of a batch of prompt-major rows (prompt p on rows p * n .. p * n + n - 1, rows past them padding):
  (ids [batch, Tp] int32 LEFT-padded with pad_id, mask [batch, Tp] bool), Tp = bucket(longest prompt), the
  prefill's own prompt bucket, so a second batch in the same buckets has the same shapes."""
  if len(prompt_ids) * n > batch:
    raise ConfigError(f"prompt_rows: {len(prompt_ids)} prompts x {n} rows do not fit a batch of {batch}")
  tp = bucket(max([len(p) for p in prompt_ids] + [1]))
  ids = np.full((batch, tp), pad_id, np.int32)
  mask = np.zeros((batch, tp), bool)
  for j, p in enumerate(prompt_ids):
    if len(p):
      ids[j * n : (j + 1) * n, tp - len(p) :] = np.asarray(p, np.int32)
      mask[j * n : (j + 1) * n, tp - len(p) :] = True
  return ids, mask
