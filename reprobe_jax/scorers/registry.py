"""Step scorers by name: the uncertainty baselines, the probe (`probe`) and the PRM (`prm`)."""

from __future__ import annotations

from typing import Callable

from reprobe_jax.errors import ConfigError
from reprobe_jax.scorers.base import StepScorer

SCORERS: dict[str, Callable[..., StepScorer]] = {}


def register_scorer(name: str, factory: Callable[..., StepScorer]) -> None:
  """Makes `get_scorer(name, **kwargs)` call `factory(**kwargs)`; a name is registered once."""
  if name in SCORERS:
    raise ConfigError(f"step scorer {name!r} is already registered")
  SCORERS[name] = factory


def get_scorer(name: str, **kwargs) -> StepScorer:
  """The registered scorer `name`, built with `kwargs` (e.g. get_scorer('random', seed=1),
  get_scorer('probe', path='runs/x/probe'))."""
  if name not in SCORERS:
    raise ConfigError(f"unknown step scorer {name!r}; known: {sorted(SCORERS)}")
  return SCORERS[name](**kwargs)
