"""The step-scorer interface: per-token inputs + step spans -> per-step scores on device (METHOD A6, A7).

A scorer is a flax struct: its configuration is static (it goes into the pytree's structure, so jit compiles once
per configuration) and its arrays (a probe's parameters, a random key) are traced leaves. `score` and
`score_newest` are pure functions of fixed shapes, so a search loop can call them inside its own jitted
`while_loop`; the module-level `score` / `score_newest` below are the jitted entry points for everything else.
Every score is "higher = more likely incorrect"; a step with no tokens scores NaN.
"""

from __future__ import annotations

import abc

import jax
import jax.numpy as jnp
from flax import struct

from reprobe_jax.errors import ConfigError


@struct.dataclass
class ScoreInputs:
  """What a scorer may read per token, next-token aligned (entry j is about token j, METHOD A3): token_mask
  [B, T] bool (True = a real token); features [B, T, F] (a probe's FeatureSpec assembly); logprobs (log p of the
  token), entropy and self_certainty (KL(U || p)) of the distribution that produced it, [B, T] each. Fields a
  scorer does not read may be None."""

  token_mask: jax.Array
  features: jax.Array | None = None
  logprobs: jax.Array | None = None
  entropy: jax.Array | None = None
  self_certainty: jax.Array | None = None

  def get(self, field: str, scorer: str) -> jax.Array:
    """The named per-token array, checked against token_mask's [B, T]; ConfigError if absent or misshapen."""
    x = getattr(self, field)
    if x is None:
      raise ConfigError(f"scorer {scorer!r} reads ScoreInputs.{field}, which is None")
    if tuple(x.shape[:2]) != tuple(self.token_mask.shape):
      raise ConfigError(f"ScoreInputs.{field} has shape {tuple(x.shape)}; token_mask is {tuple(self.token_mask.shape)}")
    return x


def step_token_mask(spans, token_mask):
  """[B, S, T] bool: token t lies in step s's half-open span [start, end) and is a real token.
  spans [B, S, 2] int32, token_mask [B, T]."""
  pos = jnp.arange(token_mask.shape[1])
  return (pos >= spans[..., 0:1]) & (pos < spans[..., 1:2]) & token_mask.astype(bool)[:, None, :]


def check_spans(spans, inputs: ScoreInputs, what: str = "spans") -> None:
  """Shape check at the API boundary: spans [B, S, 2] with the batch of token_mask [B, T]."""
  if spans.ndim != 3 or spans.shape[-1] != 2 or spans.shape[0] != inputs.token_mask.shape[0]:
    raise ConfigError(f"{what} must be [B, S, 2] with B = {inputs.token_mask.shape[0]}; got {tuple(spans.shape)}")


class StepScorer(abc.ABC):
  """One step scorer (probe, uncertainty baseline, PRM). Subclasses are flax struct dataclasses with a static
  `name` (their registry name) and any arrays as pytree fields."""

  name: str

  @abc.abstractmethod
  def score(self, inputs: ScoreInputs, spans: jax.Array) -> jax.Array:
    """Scores [B, S] float32 of every step; spans [B, S, 2] int32 half-open token spans; empty spans -> NaN."""

  def score_newest(self, inputs: ScoreInputs, newest_span: jax.Array) -> jax.Array:
    """Scores [B] of one step per row (the newest, in a search); newest_span [B, 2]. Equals the last column of
    `score` for scorers whose step score reads only that step's span and the tokens before it (all of ours)."""
    return self.score(inputs, newest_span[:, None, :])[:, 0]


@jax.jit
def score(scorer: StepScorer, inputs: ScoreInputs, spans: jax.Array) -> jax.Array:
  """Jitted `scorer.score`: [B, S] float32; compiles once per scorer configuration and (B, T, S)."""
  check_spans(spans, inputs)
  return scorer.score(inputs, spans).astype(jnp.float32)


@jax.jit
def score_newest(scorer: StepScorer, inputs: ScoreInputs, newest_span: jax.Array) -> jax.Array:
  """Jitted `scorer.score_newest`: [B] float32 for newest_span [B, 2]."""
  check_spans(newest_span[:, None, :], inputs, "newest_span [B, 2]")
  return scorer.score_newest(inputs, newest_span).astype(jnp.float32)


def inputs_from_state(state, spec=None, num_layers: int | None = None) -> ScoreInputs:
  """ScoreInputs of a decode state's rows (`reprobe_jax.models.decoding.DecodeState`), on device: the tokens the
  sampler recorded, their log-probs and captured statistics, and, given a FeatureSpec (with the model's layer
  count), the probe's features assembled from the captured values. No second forward."""
  feats = state.features
  token_mask = jnp.arange(state.buffer_len)[None, :] < state.lengths[:, None]  # [B, N]
  features = None
  if spec is not None:
    if num_layers is None:
      raise ConfigError("inputs_from_state: a feature spec needs the model's num_layers")
    from reprobe_jax.features import with_logprobs  # features build on the scorers' layer
    features = spec.assemble(with_logprobs(feats, state.logprobs), num_layers)
  return ScoreInputs(token_mask=token_mask, features=features, logprobs=state.logprobs,
                     entropy=feats.get("token_entropy"), self_certainty=feats.get("token_self_certainty"))
