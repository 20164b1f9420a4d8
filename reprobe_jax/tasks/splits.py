"""Which problems form the train, val and test splits. Each split draws its problems from a seed of its own,
disjoint from the other splits and from the built-in target's training data, so every job that says "the test
split" (ReProbe, test-time scaling, SPAE, RL) means the same problems."""

from __future__ import annotations

from typing import Sequence

from reprobe_jax.errors import ConfigError
from reprobe_jax.tasks import make_problems
from reprobe_jax.tasks.base import Problem

SPLIT_SEEDS = {"train": 2_000_003, "val": 2_000_004, "test": 2_000_005}  # disjoint from the target LM's data


def split_seed(split: str, seed: int) -> int:
  """The base seed of a split's problems in a run of seed `seed`."""
  if split not in SPLIT_SEEDS:
    raise ConfigError(f"unknown split {split!r}; known: {', '.join(SPLIT_SEEDS)}")
  return SPLIT_SEEDS[split] + seed


def spread(domain: str, n: int, split: str, seed: int, difficulties: Sequence[int]) -> list[Problem]:
  """`n` problems of a split, spread evenly over `difficulties`: ceil(n / len(difficulties)) of each, in the
  order given, the last ones cut so there are `n`."""
  per = -(-n // len(difficulties))
  out = []
  for d in difficulties:
    out += make_problems(domain, per, split_seed(split, seed), d)
  return out[:n]
