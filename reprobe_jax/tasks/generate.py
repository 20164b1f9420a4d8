"""Problems of a synthetic family: `make_problems`, distinct and deterministic in (family, seed, difficulty)."""

from __future__ import annotations

import numpy as np

from reprobe_jax.errors import ConfigError
from reprobe_jax.tasks.base import Problem, TaskFamily, get_family


def make_problems(family: str | TaskFamily, n: int, seed: int, difficulty: int) -> list[Problem]:
  """`n` distinct problems (no two with the same question), deterministic in (family, seed, difficulty).

  Ids are '{family}-d{difficulty}-s{seed}-{i:05d}', unique within a call and across seeds.
  """
  fam = get_family(family) if isinstance(family, str) else family
  if n < 0:
    raise ConfigError(f"n must be non-negative, found {n}")
  fam.generate(seed, difficulty)  # validates seed and difficulty before the loop
  # Each item's seed comes from a seed sequence, so problems of different base seeds do not overlap.
  child_seeds = np.random.SeedSequence([seed, difficulty]).generate_state(max(4 * n, 16), dtype=np.uint64)
  problems: list[Problem] = []
  questions: set[str] = set()
  for child in child_seeds:
    if len(problems) == n:
      break
    problem = fam.generate(int(child), difficulty)
    if problem.question in questions:
      continue  # small families repeat; a duplicate would leak between train and test splits
    questions.add(problem.question)
    problems.append(
      Problem(
        id=f"{fam.name}-d{difficulty}-s{seed}-{len(problems):05d}",
        domain=problem.domain,
        question=problem.question,
        answer=problem.answer,
        data=problem.data,
      )
    )
  if len(problems) < n:
    raise ConfigError(
      f"could only make {len(problems)} distinct {fam.name} problems at difficulty {difficulty}, asked for {n}"
    )
  return problems
