"""Worked examples of the synthetic families: clean reference solutions of other problems of the family (the
scripted solver, `tasks.traces.solve`), drawn from their own seed (`SHOT_SEED`), so no example is a problem of any
split. A job shows them as earlier chat turns (`trajectories.prompt_text`).
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from reprobe_jax.errors import ConfigError
from reprobe_jax.tasks.base import Problem, get_family
from reprobe_jax.tasks.generate import make_problems
from reprobe_jax.tasks.response import render_line
from reprobe_jax.tasks.traces import TraceNoise, solve

SHOT_SEED = 3_000_017  # worked examples come from their own seed, disjoint from every split


def with_done_mark(problem: Problem, steps: Sequence[str]) -> list[str]:
  """Line-mode step bodies with the family's `done_mark` added to the step after which the checker finds the chain
  complete (none added where the family has no mark or the steps never complete it)."""
  family = get_family(problem.domain)
  out = list(steps)
  if not family.done_mark:
    return out
  state = family.initial_state(problem)
  for i, body in enumerate(steps):
    parsed = family.parse_step(body)
    if parsed is None:
      break
    _, state = family.judge_step(problem, state, parsed, None)
    if family.is_done(problem, state):
      out[i] = body + family.done_mark
      break
  return out


@functools.lru_cache(maxsize=64)
def family_examples(
  name: str, mode: str, k: int, first_step: bool = False, goal_mark: bool = False
) -> tuple[tuple[str, str], ...]:
  """k (user message, assistant response) pairs of family `name` at the easiest difficulty (`first_step`,
  `goal_mark`: as `TrajectoryConfig`'s)."""
  if goal_mark and mode != "line":
    raise ConfigError(f"trajectories.goal_mark marks line-mode worked examples; answer mode is {mode!r}")
  family = get_family(name)
  turns = []
  for shot in make_problems(family, k, SHOT_SEED, 1) if k > 0 else []:
    trace = solve(shot, shot.domain, np.random.default_rng(0), mode, TraceNoise.clean())
    text = render_line(with_done_mark(shot, trace.steps), trace.answer) if goal_mark else trace.text
    turns.append((family.user_prompt(shot, mode, example=False, first_step=first_step), text))
  return tuple(turns)
