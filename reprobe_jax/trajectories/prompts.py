"""Prompts: the chat-formatted prompt of a problem, after worked examples (few-shot turns) of the same family.

The worked examples are clean reference solutions (`tasks.traces.solve`) of other problems of the family, drawn from
their own seed (`SHOT_SEED`), so no example is a problem of any split.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from reprobe_jax.errors import ConfigError
from reprobe_jax.models import LanguageModel
from reprobe_jax.tasks import Problem, get_family, make_problems
from reprobe_jax.tasks.formats import render_line, user_prompt
from reprobe_jax.tasks.traces import TraceNoise, solve

SHOT_SEED = 3_000_017  # few-shot examples come from their own seed, disjoint from every split


def few_shot_turns(
  problem: Problem, mode: str, k: int, first_step: bool = False, goal_mark: bool = False
) -> list[dict]:
  """k (user, assistant) message pairs: the same family's problems with their clean reference solutions
  (`first_step`, `goal_mark`: as `TrajectoryConfig`'s)."""
  return [dict(m) for m in _shots(problem.domain, mode, k, first_step, goal_mark)]


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
def _shots(domain: str, mode: str, k: int, first_step: bool = False, goal_mark: bool = False) -> tuple:
  if goal_mark and mode != "line":
    raise ConfigError(f"trajectories.goal_mark marks line-mode worked examples; answer mode is {mode!r}")
  turns = []
  for shot in make_problems(domain, k, SHOT_SEED, 1) if k > 0 else []:
    trace = solve(shot, shot.domain, np.random.default_rng(0), mode, TraceNoise.clean())
    text = render_line(with_done_mark(shot, trace.steps), trace.answer) if goal_mark else trace.text
    turns += [
      (("role", "user"), ("content", user_prompt(shot, mode, example=False, first_step=first_step))),
      (("role", "assistant"), ("content", text)),
    ]
  return tuple(turns)


def prompt_text(
  lm: LanguageModel, problem: Problem, mode: str, few_shot: int = 0, first_step: bool = False, goal_mark: bool = False
) -> str:
  """The chat-formatted prompt (after `few_shot` worked examples; `first_step`, `goal_mark`: as
  `TrajectoryConfig`'s); without a chat template, plain text turns."""
  # With worked examples the hint drops its made-up step (`user_prompt`'s `example`); without, it is what shows
  # the format.
  messages = few_shot_turns(problem, mode, few_shot, first_step, goal_mark) + [
    {"role": "user", "content": user_prompt(problem, mode, example=few_shot == 0, first_step=first_step)}
  ]
  if getattr(lm.tokenizer, "chat_template", None):
    return lm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  return "\n\n".join(m["content"] for m in messages) + ("\n\n" if few_shot else "")
