"""Prompts: the chat-formatted prompt of a problem, after its task's worked examples (earlier chat turns), through the
target's chat template; thinking templates (a generation prompt that ends with '<think>') included.
"""

from __future__ import annotations

from reprobe_jax.errors import ConfigError
from reprobe_jax.models import LanguageModel
from reprobe_jax.steps.modes import THINK_CLOSE, THINK_OPEN
from reprobe_jax.tasks import Problem, get_task
from reprobe_jax.tasks.formats import user_prompt


def few_shot_turns(
  problem: Problem, mode: str, k: int, first_step: bool = False, goal_mark: bool = False
) -> list[dict]:
  """k (user, assistant) message pairs: worked examples of the problem's task (`first_step`, `goal_mark`: as
  `TrajectoryConfig`'s)."""
  turns = get_task(problem.domain).worked_examples(mode, k, first_step=first_step, goal_mark=goal_mark)
  return [
    m
    for user, assistant in turns
    for m in ({"role": "user", "content": user}, {"role": "assistant", "content": assistant})
  ]


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


def opens_thinking(prompt: str) -> bool:
  """Whether a chat-formatted prompt ends inside the thinking: its template ends the generation prompt with
  '<think>' (DeepSeek-R1-Distill, QwQ and others), so the response starts thinking without the opening tag."""
  return prompt.rstrip().endswith(THINK_OPEN)


def check_thinking_template(prompt: str, mode: str, *, opens: bool = False, where: str = "the prompt") -> None:
  """ConfigError, before any sampling, when a chat-formatted prompt cannot hold a thinking-mode response: its
  template closes the thinking in the generation prompt (it ends with '</think>': thinking switched off, so no
  step would be probed), or `opens` says the target is a thinking model whose template opens the thinking and the
  prompt does not end with '<think>' (a template without '<think>' for a thinking job)."""
  if mode != "thinking":
    return
  tail = prompt.rstrip()
  if tail.endswith(THINK_CLOSE):
    raise ConfigError(
      f"{where}: the chat template closes the thinking in the generation prompt (it ends with '{THINK_CLOSE}': "
      "thinking switched off), so a thinking-mode job would probe no step; turn thinking on or use answer mode 'line'"
    )
  if opens and not tail.endswith(THINK_OPEN):
    raise ConfigError(
      f"{where}: the target is declared a thinking model whose template opens the thinking, but the generation "
      f"prompt does not end with '{THINK_OPEN}' (its end: {tail[-40:]!r}); load the model's own chat template"
    )
