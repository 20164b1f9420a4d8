"""Trajectories: sampled responses with per-token statistics, exact step spans and step labels.

`record`: the `Trajectory` record, its JSONL schema and `read_trajectories` (below features, which read records);
`prompts`: a problem's chat prompt after worked examples; `sample`: `TrajectoryConfig` and `sample_trajectories`.
"""

from reprobe_jax.trajectories.record import MODES, RECORD_FIELDS, StepSpan, Trajectory, read_trajectories
from reprobe_jax.trajectories.prompts import SHOT_SEED, few_shot_turns, prompt_text, with_done_mark
from reprobe_jax.trajectories.sample import TrajectoryConfig, sample_trajectories

__all__ = [
  "MODES",
  "RECORD_FIELDS",
  "StepSpan",
  "Trajectory",
  "read_trajectories",
  "SHOT_SEED",
  "few_shot_turns",
  "prompt_text",
  "with_done_mark",
  "TrajectoryConfig",
  "sample_trajectories",
]
