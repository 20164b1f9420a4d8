"""Step scorers by name: the uncertainty baselines, the probe (`probe`) and the PRM (`prm`)."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Mapping

from reprobe_jax.errors import ConfigError
from reprobe_jax.io.readers import shown
from reprobe_jax.registry import Registry
from reprobe_jax.scorers.base import StepScorer

# name -> a factory: `get_scorer(name, **kwargs)` calls `SCORERS.get(name)(**kwargs)`.
SCORERS: Registry[Callable[..., StepScorer]] = Registry("step scorer")


def register_scorer(name: str, factory: Callable[..., StepScorer]) -> None:
  """Makes `get_scorer(name, **kwargs)` call `factory(**kwargs)`; a name is registered once."""
  SCORERS.register(name, factory)


def get_scorer(name: str, **kwargs) -> StepScorer:
  """The registered scorer `name`, built with `kwargs` (e.g. get_scorer('random', seed=1),
  get_scorer('probe', path='runs/x/probe')). The keyword arguments are checked against the factory's signature
  first, for every scorer: an argument it does not take, or one it needs and was not given, is a ConfigError naming
  the scorer, the argument and the arguments it accepts; each factory checks its values' types and ranges."""
  factory = SCORERS.get(name)
  check_arguments(name, factory, kwargs)
  scorer = factory(**kwargs)
  if not isinstance(scorer, StepScorer):
    raise ConfigError(f"scorer {name!r}: its factory returned {shown(scorer)}, not a StepScorer")
  return scorer


def check_arguments(name: str, factory: Callable[..., Any], kwargs: Mapping[str, Any]) -> None:
  """ConfigError naming the scorer when `kwargs` do not bind to `factory`'s keyword parameters (unknown, missing)."""
  try:
    sig = inspect.signature(factory)
  except (TypeError, ValueError):  # a callable without a readable signature: it checks its own arguments
    return
  params = sig.parameters.values()
  named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
  if not any(p.kind is p.VAR_KEYWORD for p in params):
    unknown_arguments(name, kwargs, named)
  missing = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty]
  missing = [m for m in missing if m not in kwargs]
  if missing:
    raise ConfigError(f"scorer {name!r}: missing argument(s) {missing}; it accepts {_listed(named)}")


def unknown_arguments(name: str, kwargs: Iterable[str], accepted: Iterable[str]) -> None:
  """ConfigError naming the scorer, the arguments it does not take and those it does."""
  accepted = list(accepted)
  unknown = sorted(set(kwargs) - set(accepted))
  if unknown:
    raise ConfigError(f"scorer {name!r}: unknown argument(s) {unknown}; it accepts {_listed(accepted)}")


def _listed(names: list[str]) -> str:
  return str(sorted(names)) if names else "no arguments"
