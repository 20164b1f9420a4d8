"""Trajectories: sampled responses with per-token statistics, exact step spans and step labels.

`record`: the `Trajectory` record, its JSONL schema and `read_trajectories` (below features, which read records);
`prompts`: a problem's chat prompt after worked examples; `sample`: `TrajectoryConfig` and `sample_trajectories`;
`teacher`: reader mode, the target teacher-forced over given labelled steps (`teacher_force`, `render_steps`).
"""

from reprobe_jax.trajectories.record import MODES, RECORD_FIELDS, StepSpan, Trajectory, read_trajectories
from reprobe_jax.trajectories.prompts import check_thinking_template, few_shot_turns, opens_thinking, prompt_text
from reprobe_jax.trajectories.sample import TrajectoryConfig, sample_trajectories
from reprobe_jax.trajectories.teacher import render_steps, teacher_force

__all__ = [
  "MODES",
  "RECORD_FIELDS",
  "StepSpan",
  "Trajectory",
  "read_trajectories",
  "check_thinking_template",
  "opens_thinking",
  "few_shot_turns",
  "prompt_text",
  "TrajectoryConfig",
  "sample_trajectories",
  "render_steps",
  "teacher_force",
]
