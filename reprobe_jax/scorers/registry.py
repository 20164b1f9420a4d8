"""Step scorers by name: the uncertainty baselines, the probe (`probe`) and the PRM (`prm`)."""

from __future__ import annotations

from typing import Callable

from reprobe_jax.registry import Registry
from reprobe_jax.scorers.base import StepScorer

# name -> a factory: `get_scorer(name, **kwargs)` calls `SCORERS.get(name)(**kwargs)`.
SCORERS: Registry[Callable[..., StepScorer]] = Registry("step scorer")


def register_scorer(name: str, factory: Callable[..., StepScorer]) -> None:
  """Makes `get_scorer(name, **kwargs)` call `factory(**kwargs)`; a name is registered once."""
  SCORERS.register(name, factory)


def get_scorer(name: str, **kwargs) -> StepScorer:
  """The registered scorer `name`, built with `kwargs` (e.g. get_scorer('random', seed=1),
  get_scorer('probe', path='runs/x/probe'))."""
  return SCORERS.get(name)(**kwargs)
