"""Trajectories: sampled responses with per-token statistics, exact step spans and step labels."""

from reprobe_jax.trajectories.record import (MODES, RECORD_FIELDS, SHOT_SEED, STEP_MODE, StepSpan, Trajectory,
                                             TrajectoryConfig, few_shot_turns, prompt_text, read_trajectories,
                                             sample_trajectories, with_done_mark)
