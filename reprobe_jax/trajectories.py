"""Trajectories: N samples per problem from the jitted sampler, with per-token statistics and exact step spans.

A trajectory record (JSONL, one per sample):
  id, problem_id, domain, mode ('line' | 'thinking'), sample (k of N),
  prompt_ids, response_ids (without the final EOS), response (text), finish_reason,
  logprobs, entropy, self_certainty: per response token j, about the distribution that produced token j
    (next-token aligned, METHOD A3), from the sampler (temperature 1, unfiltered),
  steps: [{text, start, end}] token spans relative to the response (METHOD A1; line mode: every non-empty line
    including '<Answer>: ...'; thinking mode: '.\\n\\n' paragraphs before </think>).
Labels are added by `reprobe_jax.annotate`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import numpy as np

from reprobe_jax import steps as step_lib
from reprobe_jax.models import LanguageModel, SamplingParams
from reprobe_jax.tasks import Problem
from reprobe_jax.tasks.formats import user_prompt

STEP_MODE = {"line": "line", "thinking": "paragraph"}


@dataclasses.dataclass(frozen=True)
class TrajectoryConfig:
  """METHOD A5 defaults: T=1.0, top-k 50, top-p 0.95, N=3 samples per problem."""

  samples: int = 3
  temperature: float = 1.0
  top_k: int = 50
  top_p: float = 0.95
  max_new_tokens: int = 128
  batch_size: int = 32  # prompts per generate call (each with `samples` rows)
  seed: int = 0
  # Worked examples (clean reference solutions of other problems of the same family, easiest difficulty) shown as
  # earlier chat turns: a pretrained model that never saw the format learns it in context. 0 for the built-in target.
  few_shot: int = 0


SHOT_SEED = 3_000_017  # few-shot examples come from their own seed, disjoint from every split


def few_shot_turns(problem: Problem, mode: str, k: int) -> list[dict]:
  """k (user, assistant) message pairs: the same family's problems with their clean reference solutions."""
  return [dict(m) for m in _shots(problem.domain, mode, k)]


@functools.lru_cache(maxsize=64)
def _shots(domain: str, mode: str, k: int) -> tuple:
  from reprobe_jax.tasks import make_problems
  from reprobe_jax.tasks.traces import TraceNoise, solve

  turns = []
  for shot in make_problems(domain, k, SHOT_SEED, 1) if k > 0 else []:
    trace = solve(shot, shot.domain, np.random.default_rng(0), mode, TraceNoise.clean())
    turns += [(("role", "user"), ("content", user_prompt(shot, mode))),
              (("role", "assistant"), ("content", trace.text))]
  return tuple(turns)


def prompt_text(lm: LanguageModel, problem: Problem, mode: str, few_shot: int = 0) -> str:
  """The chat-formatted prompt (after `few_shot` worked examples); without a chat template, plain text turns."""
  messages = few_shot_turns(problem, mode, few_shot) + [{"role": "user", "content": user_prompt(problem, mode)}]
  if getattr(lm.tokenizer, "chat_template", None):
    return lm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  return "\n\n".join(m["content"] for m in messages) + ("\n\n" if few_shot else "")


def sample_trajectories(lm: LanguageModel, problems: Sequence[Problem], mode: str, cfg: TrajectoryConfig,
                        *, prompt_fn: Callable[[LanguageModel, Problem, str, int], str] = prompt_text,
                        on_batch: Callable[[int], None] | None = None) -> list[dict]:
  """Samples `cfg.samples` trajectories per problem (the prompt is prefilled once per problem) and aligns steps."""
  from reprobe_jax.models import CaptureSpec
  eos = lm.tokenizer.eos_token_id
  sampling = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)
  out = []
  for start in range(0, len(problems), cfg.batch_size):
    chunk = problems[start:start + cfg.batch_size]
    prompts = [prompt_fn(lm, p, mode, cfg.few_shot) for p in chunk]
    gen = lm.generate(prompts, sampling, max_new_tokens=cfg.max_new_tokens, n=cfg.samples,
                      seed=cfg.seed + start, capture=CaptureSpec(token_stats=True))
    for row in range(gen.tokens.shape[0]):
      problem = chunk[gen.prompt_index[row]]
      ids = gen.token_ids(row)
      n = len(ids) - (1 if ids and ids[-1] == eos else 0)
      ids = ids[:n]
      steps = step_lib.align(lm.tokenizer, ids, STEP_MODE[mode])
      out.append({
          "id": f"{problem.id}#{row % cfg.samples}", "problem_id": problem.id, "domain": problem.domain,
          "mode": mode, "sample": row % cfg.samples, "prompt_ids": gen.prompt_ids[gen.prompt_index[row]],
          "response_ids": ids, "response": lm.tokenizer.decode(ids), "finish_reason": gen.finish_reason[row],
          "logprobs": _floats(gen.logprobs[row, :n]), "entropy": _floats(gen.features["token_entropy"][row, :n]),
          "self_certainty": _floats(gen.features["token_self_certainty"][row, :n]),
          "steps": [{"text": s.text, "start": s.start, "end": s.end} for s in steps],
      })
    if on_batch is not None:
      on_batch(len(chunk))
  return out


def _floats(x) -> list[float]:
  return [round(float(v), 6) for v in np.asarray(x)]
