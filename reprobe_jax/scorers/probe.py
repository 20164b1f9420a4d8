"""The ReProbe probe (METHOD A4) as a step scorer: P(step incorrect) from the features of the tokens [0, step end)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from reprobe_jax.errors import ConfigError
from reprobe_jax.probe.bundle import ProbeBundle, load_probe
from reprobe_jax.scorers.base import ScoreInputs, StepScorer, step_token_mask
from reprobe_jax.scorers.registry import SCORERS


@struct.dataclass
class ProbeScorer(StepScorer):
  """Scores steps with a probe bundle (its parameters are the traced leaves); reads ScoreInputs.features, which
  must be assembled by the bundle's FeatureSpec."""

  bundle: ProbeBundle
  name = "probe"  # not a field: the same for every probe

  def score(self, inputs: ScoreInputs, spans: jax.Array) -> jax.Array:
    """P(incorrect) [B, S] for spans [B, S, 2]; steps with no real tokens -> NaN."""
    feats = inputs.get("features", self.name)
    if feats.shape[-1] != self.bundle.config.feature_dim:
      raise ConfigError(f"ScoreInputs.features has {feats.shape[-1]} dims, the probe expects "
                        f"{self.bundle.config.feature_dim} ({self.bundle.features.name} features)")
    p = self.bundle.probabilities(feats, inputs.token_mask, spans)
    return jnp.where(jnp.any(step_token_mask(spans, inputs.token_mask), axis=-1), p, jnp.nan)


@SCORERS.register("probe")
def _probe_scorer(bundle: ProbeBundle | None = None, *, path: str | None = None,
                  model_fingerprint: str | None = None) -> ProbeScorer:
  """From a bundle in memory or a saved probe folder (checked against the target's fingerprint when given)."""
  if (bundle is None) == (path is None):
    raise ConfigError("the probe scorer needs exactly one of bundle= or path=")
  return ProbeScorer(bundle if bundle is not None else load_probe(path, model_fingerprint=model_fingerprint))
