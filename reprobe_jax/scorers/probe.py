"""The ReProbe probe (docs/method.md §A4) as a step scorer: P(step incorrect) from the features of the tokens [0, step
end)."""

from __future__ import annotations

import os

import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Float, Int

from reprobe_jax.errors import ConfigError
from reprobe_jax.features import FeatureSpec
from reprobe_jax.io.readers import shown
from reprobe_jax.probe.bundle import ProbeBundle, load_probe
from reprobe_jax.models.sharding import ShardingCtx
from reprobe_jax.probe.windows import score_windows
from reprobe_jax.scorers.base import PendingScores, ScoreInputs, StepScorer, step_token_mask
from reprobe_jax.scorers.registry import SCORERS


@struct.dataclass
class ProbeScorer(StepScorer):
  """Scores steps with a probe bundle (its parameters are the traced leaves); reads ScoreInputs.features, which
  must be assembled by the bundle's FeatureSpec."""

  bundle: ProbeBundle
  name = "probe"  # not a field: the same for every probe
  packs_trajectories = True

  @property
  def feature_spec(self) -> FeatureSpec:
    return self.bundle.features

  @property
  def feature_dim(self) -> int:
    return self.bundle.config.feature_dim

  @property
  def model_fingerprint(self) -> str | None:
    return self.bundle.model_fingerprint

  def score(self, inputs: ScoreInputs, spans: Int[Array, "b s 2"]) -> Float[Array, "b s"]:
    """P(incorrect) [B, S] for spans [B, S, 2]; steps with no real tokens -> NaN."""
    feats = inputs.get("features", self.name)
    if feats.shape[-1] != self.bundle.config.feature_dim:
      raise ConfigError(
        f"ScoreInputs.features has {feats.shape[-1]} dims, the probe expects "
        f"{self.bundle.config.feature_dim} ({self.bundle.features.name} features)"
      )
    p = self.bundle.probabilities(feats, inputs.token_mask, spans)
    return jnp.where(jnp.any(step_token_mask(spans, inputs.token_mask), axis=-1), p, jnp.nan)

  def dispatch_trajectories(
    self, features: Float[Array, "b n f"], spans: Int[Array, "b s 2"], *, shard: ShardingCtx | None = None
  ) -> PendingScores:
    """[B, S] P(incorrect) of every step span [B, S, 2] (`score_trajectories`; steps without tokens: NaN), the probe
    run over windows packed on device (`probe.windows.score_windows`): each step's window [0, end) once, side by side,
    instead of B x S windows of the whole buffer; the same values as `score` (tests). The spans may be on device:
    dispatched, nothing fetched; shard: trajectories, windows and steps over the mesh's data axis."""
    graph, params = self.bundle.graph, self.bundle.params
    return PendingScores(score_windows(graph, params, features, jnp.asarray(spans, jnp.int32), shard))


@SCORERS.register("probe")
def _probe_scorer(
  bundle: ProbeBundle | None = None, *, path: str | None = None, model_fingerprint: str | None = None
) -> ProbeScorer:
  """From a bundle in memory or a saved probe folder (checked against the target's fingerprint when given)."""
  if (bundle is None) == (path is None):
    raise ConfigError("the probe scorer needs exactly one of bundle= or path=")
  if bundle is not None and not isinstance(bundle, ProbeBundle):
    raise ConfigError(f"scorer 'probe': bundle: expected a ProbeBundle, got {shown(bundle)}")
  if path is not None and not isinstance(path, (str, os.PathLike)):
    raise ConfigError(f"scorer 'probe': path: expected a folder path, got {shown(path)}")
  if model_fingerprint is not None and not isinstance(model_fingerprint, str):
    raise ConfigError(f"scorer 'probe': model_fingerprint: expected a string or None, got {shown(model_fingerprint)}")
  if bundle is not None and model_fingerprint is not None:
    raise ConfigError("scorer 'probe': model_fingerprint checks a probe loaded from path=, not a bundle")
  return ProbeScorer(bundle if bundle is not None else load_probe(os.fspath(path), model_fingerprint=model_fingerprint))
