"""Hostile follow-ups of issue 12: sampling settings checked where TrajectoryConfig is defined, a target-LM
checkpoint resumed with another model shape, out-of-vocabulary ids named by row."""

from __future__ import annotations

import pytest

from reprobe_jax import pipeline
from reprobe_jax.errors import ConfigError
from reprobe_jax.trajectories import TrajectoryConfig


@pytest.mark.parametrize("field,value,match", [
    ("temperature", float("nan"), r"a finite number >= 0\.0, got nan"), ("temperature", -1.0, r">= 0\.0, got -1\.0"),
    ("top_p", 0.0, r"in \(0\.0, 1\.0\], got 0\.0"), ("top_k", -1, "an int >= 0, got -1"),
    ("samples", 0, "an int >= 1, got 0"), ("max_new_tokens", 2.0, "int.*got 2.0"), ("batch_size", 0, "got 0"),
    ("seed", -3, "an int >= 0, got -3"), ("few_shot", True, "int.*got True"),
])
def test_trajectory_config_checks_itself(field, value, match):
  """Built directly the class is named; built from a config mapping the dotted field is."""
  with pytest.raises(ConfigError, match=rf"^TrajectoryConfig\.{field}: expected .*{match}$"):
    TrajectoryConfig(**{field: value})
  with pytest.raises(ConfigError, match=rf"^config\.trajectories\.{field}: expected .*{match}$"):
    pipeline.config_from_dict({"trajectories": {field: value}})


def test_trajectory_config_accepts_the_edges():
  cfg = TrajectoryConfig(samples=1, temperature=0.0, top_k=0, top_p=1.0, max_new_tokens=1, batch_size=1, seed=0)
  assert (cfg.temperature, cfg.top_k, cfg.top_p) == (0.0, 0, 1.0)
  assert pipeline.config_from_dict({"trajectories": {"temperature": 0}}).trajectories.temperature == 0.0
