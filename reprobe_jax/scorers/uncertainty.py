"""Step-level uncertainty baselines (docs/method.md §A6) as step scorers: masked reductions over [B, S, T], on device.

maxprob: -sum log p(token); perplexity: -mean log p; max_entropy / mean_entropy over the step's tokens;
self_certainty: -mean KL(U || p) (Kang et al., 2025; negated so higher = less sure); random: U(0, 1) from a jax key,
drawn per (row, span), so that scoring one step alone gives the value it has among all of its row's steps.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from reprobe_jax.errors import ConfigError
from reprobe_jax.fields import check_seed
from reprobe_jax.scorers.base import ScoreInputs, StepScorer, step_token_mask
from reprobe_jax.scorers.registry import SCORERS

BASELINES = ("maxprob", "perplexity", "max_entropy", "mean_entropy", "self_certainty", "random")
_READS = {
  "maxprob": "logprobs",
  "perplexity": "logprobs",
  "max_entropy": "entropy",
  "mean_entropy": "entropy",
  "self_certainty": "self_certainty",
}


def _step_uniform(key, spans):
  """U(0, 1) [B, S], one draw per (row, start, end): fold the three into the key."""
  rows = jnp.broadcast_to(jnp.arange(spans.shape[0])[:, None], spans.shape[:2])

  def one(r, a, e):
    return jax.random.uniform(jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, r), a), e))

  return jax.vmap(jax.vmap(one))(rows, spans[..., 0], spans[..., 1])


@struct.dataclass
class UncertaintyScorer(StepScorer):
  """One of BASELINES. `key` (a jax PRNG key, a traced leaf) is used by 'random' only; build with `create`."""

  name: str = struct.field(pytree_node=False)
  key: jax.Array | None = None

  @classmethod
  def create(cls, name: str, seed: int = 0) -> "UncertaintyScorer":
    """The baseline `name`; seed (an int in [0, 2**32), `fields.SEED`) keys 'random' and is checked for every
    baseline (the TTS job hands each the run's seed)."""
    if name not in BASELINES:
      raise ConfigError(f"unknown baseline {name!r}; known: {BASELINES}")
    seed = check_seed(seed, f"scorer {name!r}: seed")
    return cls(name=name, key=jax.random.key(seed) if name == "random" else None)

  def score(self, inputs: ScoreInputs, spans: jax.Array) -> jax.Array:
    """Scores [B, S] (docs/method.md §A6) for spans [B, S, 2]; steps with no real tokens -> NaN."""
    in_step = step_token_mask(spans, inputs.token_mask)  # [B, S, T]
    n = jnp.sum(in_step, axis=-1)  # [B, S]
    if self.name == "random":
      if self.key is None:
        raise ConfigError("the random baseline needs a key: build it with UncertaintyScorer.create('random', seed)")
      out = _step_uniform(self.key, spans)
    elif self.name in _READS:
      x = inputs.get(_READS[self.name], self.name).astype(jnp.float32)[:, None, :]  # [B, 1, T]
      if self.name == "max_entropy":
        out = jnp.max(jnp.where(in_step, x, -jnp.inf), axis=-1)
      else:
        total = jnp.sum(jnp.where(in_step, x, 0.0), axis=-1)  # [B, S]
        mean = total / jnp.maximum(n, 1)
        out = {"maxprob": -total, "perplexity": -mean, "mean_entropy": mean, "self_certainty": -mean}[self.name]
    else:
      raise ConfigError(f"unknown baseline {self.name!r}; known: {BASELINES}")
    return jnp.where(n > 0, out, jnp.nan).astype(jnp.float32)


for _name in BASELINES:
  SCORERS.register(_name, functools.partial(UncertaintyScorer.create, _name))
