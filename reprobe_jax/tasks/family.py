"""The base class of the built-in synthetic families as tasks: exact step labels in both response formats (line
steps by `TaskFamily.check_steps`, thinking paragraphs by `formats.check_thinking`) and worked examples from the
scripted solver (`tasks.examples`). Kept apart from `tasks.base` because both read the families back through the
registry.
"""

from __future__ import annotations

from typing import Sequence

from reprobe_jax.tasks.base import Problem, TaskFamily
from reprobe_jax.tasks.examples import family_examples
from reprobe_jax.tasks.formats import check_thinking


class SyntheticFamily(TaskFamily):
  """A synthetic family with everything a job asks of a task (module docstring)."""

  def judge_steps(self, problem: Problem, steps: Sequence[str], mode: str) -> list[float]:
    """Exact labels (docs/method.md §A2(a)): line-mode steps by `check_steps`, thinking paragraphs by
    `formats.check_thinking` (work steps, re-checks and the conclusion)."""
    return self.check_steps(problem, steps) if mode == "line" else check_thinking(problem, steps)

  def worked_examples(
    self, mode: str, k: int, *, first_step: bool = False, goal_mark: bool = False
  ) -> list[tuple[str, str]]:
    """k clean reference solutions of this family's easiest problems, drawn from their own seed (no problem of
    any split); `goal_mark`: line-mode solutions mark the step that completes the chain with `done_mark`."""
    return list(family_examples(self.name, mode, k, first_step, goal_mark))
