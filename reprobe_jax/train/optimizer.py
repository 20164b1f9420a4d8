"""One optimizer config for every learner (the target LM, the probe, the PRM, the RL policy) and the optax
transformation it makes: clip the gradients' global norm, then Adam (AdamW with weight decay) over a learning-rate
schedule that warms up linearly from 0 and then holds or decays.

Each learner's config embeds an `OptimizerConfig` as its `optimizer` field with its own defaults, so a run changes
it with e.g. `--config.train.optimizer.learning_rate=1e-3`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import optax

from reprobe_jax.fields import Int, OneOf, Real, check_fields

# After the warmup: 'cosine' decays to end_frac x learning_rate by the last step (optax's warmup cosine decay),
# 'linear' decays linearly to end_frac x learning_rate, 'constant' holds learning_rate.
SCHEDULES = ("cosine", "linear", "constant")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """learning_rate: the peak rate; schedule: one of SCHEDULES; warmup_steps, warmup_frac: the linear warmup from 0,
  in steps, as a fraction of the run's steps (at least one step), or both (the smaller; None = not set, no warmup
  when neither is); end_frac: where 'cosine' and 'linear' end, as a fraction of learning_rate; weight_decay:
  AdamW's decoupled weight decay (0: Adam); b1, b2: Adam's moment decays; grad_clip: the global gradient norm
  clipped to before the update (0: no clipping)."""

  learning_rate: float = 1e-3
  schedule: str = "constant"
  warmup_steps: int | None = None
  warmup_frac: float | None = None
  end_frac: float = 0.0
  weight_decay: float = 0.0
  b1: float = 0.9
  b2: float = 0.999
  grad_clip: float = 0.0

  def __post_init__(self):
    rules = {
      "learning_rate": Real(0.0, low_open=True),
      "schedule": OneOf(SCHEDULES),
      "end_frac": Real(0.0, 1.0),
      "weight_decay": Real(0.0),
      "b1": Real(0.0, 1.0, high_open=True),
      "b2": Real(0.0, 1.0, high_open=True),
      "grad_clip": Real(0.0),
    }
    if self.warmup_steps is not None:
      rules["warmup_steps"] = Int(0)
    if self.warmup_frac is not None:
      rules["warmup_frac"] = Real(0.0, 1.0, high_open=True)
    check_fields(self, rules)

  def warmup(self, total_steps: int) -> int:
    """The warmup's length in steps for a run of `total_steps`."""
    steps = None if self.warmup_frac is None else max(int(total_steps * self.warmup_frac), 1)
    if self.warmup_steps is not None:
      steps = self.warmup_steps if steps is None else min(self.warmup_steps, steps)
    return steps or 0


class Optimizer(NamedTuple):
  """The optax transformation and its learning-rate schedule (step -> rate, for logging)."""

  tx: optax.GradientTransformation
  schedule: Callable


def make_optimizer(cfg: OptimizerConfig, total_steps: int) -> Optimizer:
  """`cfg` as optax: chain(clip_by_global_norm (when grad_clip > 0), adamw (when weight_decay > 0) or adam) over
  the schedule of a run of `total_steps` optimizer steps."""
  lr, warmup = cfg.learning_rate, cfg.warmup(total_steps)
  if cfg.schedule == "cosine":
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total_steps, warmup + 1), lr * cfg.end_frac)
  elif cfg.schedule == "linear":
    schedule = optax.join_schedules(
      [
        optax.linear_schedule(0.0, lr, warmup),
        optax.linear_schedule(lr, lr * cfg.end_frac, max(total_steps - warmup, 1)),
      ],
      [warmup],
    )
  else:
    schedule = optax.linear_schedule(0.0, lr, warmup) if warmup else optax.constant_schedule(lr)
  parts = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip > 0 else []
  parts.append(
    optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)
    if cfg.weight_decay > 0
    else optax.adam(schedule, b1=cfg.b1, b2=cfg.b2)
  )
  return Optimizer(optax.chain(*parts), schedule)
