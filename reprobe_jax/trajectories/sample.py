"""Sampling trajectories: N samples per problem from the jitted sampler, with per-token statistics, exact step spans
and, on request, the probe's features captured on the way (docs/method.md §A3, §A5).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from reprobe_jax import steps as step_lib
from reprobe_jax.features.spec import FeatureSpec, union_capture, with_logprobs
from reprobe_jax.fields import SEED, Int, OneOf, check_fields
from reprobe_jax.models import CaptureSpec, LanguageModel, SamplingParams
from reprobe_jax.tasks import Problem
from reprobe_jax.trajectories.prompts import prompt_text
from reprobe_jax.steps.modes import STEP_MODE
from reprobe_jax.trajectories.record import StepSpan, Trajectory


@dataclasses.dataclass(frozen=True)
class TrajectoryConfig:
  """docs/method.md §A5 defaults: T=1.0, top-k 50, top-p 0.95, N=3 samples per problem."""

  samples: int = 3
  sampling: SamplingParams = SamplingParams(temperature=1.0, top_k=50, top_p=0.95)  # temperature 0 is greedy
  max_new_tokens: int = 128
  batch_size: int = 32  # prompts per generate call (each with `samples` rows)
  seed: int = 0
  # Worked examples (clean reference solutions of other problems of the same family, easiest difficulty) shown as
  # earlier chat turns: a pretrained model that never saw the format learns it in context. 0 for the built-in target.
  few_shot: int = 0
  # Spell out the first step's starting point in qa and planning questions (`TaskFamily.first_step_question`), in
  # the worked examples too: SmolLM2-135M otherwise starts from a person or room of the fact list, not the
  # question's (docs/tasks.md, "SmolLM2"). Off for the built-in target.
  first_step: bool = False
  # Worked examples end the step that completes the chain with the family's `done_mark` (planning: 'move from 6 to
  # 9 (the goal)'): SmolLM2-135M otherwise walks on past the goal (docs/tasks.md, "SmolLM2"). Line mode only; off
  # for the built-in target.
  goal_mark: bool = False
  # Where a sampled response's steps end (docs/method.md §A1): '' = its response format's own boundary (line mode's
  # lines, thinking mode's '.\n\n' paragraphs); 'line', 'sentence' or 'paragraph' for free-form output that does
  # not keep to the format (sentence mode: a step of under 20 characters joins the next). Exact step labels need the
  # format's own steps, so a job with the rule annotator refuses any other.
  steps: str = ""

  def __post_init__(self):
    # errors name config.trajectories.<field> when built by replace_fields, else TrajectoryConfig.<field>
    check_fields(
      self,
      {
        "samples": Int(1),
        "max_new_tokens": Int(1),
        "batch_size": Int(1),
        "seed": SEED,
        "few_shot": Int(0),
        "first_step": OneOf((False, True)),
        "goal_mark": OneOf((False, True)),
        "steps": OneOf(("", "line", "sentence", "paragraph")),
      },
    )


def sample_trajectories(
  lm: LanguageModel,
  problems: Sequence[Problem],
  mode: str,
  cfg: TrajectoryConfig,
  *,
  prompt_fn: Callable[[LanguageModel, Problem, str, int, bool, bool], str] = prompt_text,
  on_batch: Callable[[int], None] | None = None,
  feature_specs: Sequence[FeatureSpec] = (),
  on_features: Callable[[list[Trajectory], dict[str, dict[str, np.ndarray]]], None] | None = None,
) -> list[Trajectory]:
  """Samples `cfg.samples` trajectories per problem (the prompt is prefilled once per problem, its samples read it
  as a shared prefix) and aligns steps.

  feature_specs: the probe's feature sets to record while sampling (docs/method.md §A3, next-token aligned, no second
  forward); after each batch `on_features(batch trajectories, {spec name: {trajectory id: [n_tokens, F]}})` gets
  them, so a caller can store them as they come instead of holding a whole split.
  """
  eos = lm.tokenizer.eos_token_id
  capture = union_capture(feature_specs) if feature_specs else CaptureSpec(token_stats=True)
  out = []
  for start in range(0, len(problems), cfg.batch_size):
    chunk = problems[start : start + cfg.batch_size]
    prompts = [prompt_fn(lm, p, mode, cfg.few_shot, cfg.first_step, cfg.goal_mark) for p in chunk]
    gen = lm.generate(
      prompts, cfg.sampling, max_new_tokens=cfg.max_new_tokens, n=cfg.samples, seed=cfg.seed + start, capture=capture
    )
    batch = []
    for row in range(gen.tokens.shape[0]):
      problem = chunk[gen.prompt_index[row]]
      ids = gen.token_ids(row)
      n = len(ids) - (1 if ids and ids[-1] == eos else 0)
      ids = ids[:n]
      steps = step_lib.align(lm.tokenizer, ids, cfg.steps or STEP_MODE[mode])
      batch.append(
        Trajectory(
          id=f"{problem.id}#{row % cfg.samples}",
          problem_id=problem.id,
          domain=problem.domain,
          mode=mode,
          sample=row % cfg.samples,
          prompt_ids=tuple(gen.prompt_ids[gen.prompt_index[row]]),
          response_ids=tuple(ids),
          response=lm.tokenizer.decode(ids),
          finish_reason=gen.finish_reason[row],
          logprobs=_floats(gen.logprobs[row, :n]),
          entropy=_floats(gen.features["token_entropy"][row, :n]),
          self_certainty=_floats(gen.features["token_self_certainty"][row, :n]),
          steps=tuple(StepSpan(s.text, s.start, s.end) for s in steps),
        )
      )
    if feature_specs and on_features is not None:
      feats = {}
      for spec in feature_specs:
        arr = np.asarray(spec.assemble(with_logprobs(gen.features, gen.logprobs), lm.config.num_layers))  # [R, N, F]
        feats[spec.name] = {t.id: arr[row, : len(t.response_ids)] for row, t in enumerate(batch)}
      on_features(batch, feats)
    out += batch
    if on_batch is not None:
      on_batch(len(chunk))
  return out


def _floats(x) -> tuple[float, ...]:
  return tuple(round(float(v), 6) for v in np.asarray(x))
