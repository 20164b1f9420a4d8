"""Every job config in configs/ loads and its sections convert to the typed configs the jobs run (no field a job
would reject on its first line): the ones CI never runs end to end included (SmolLM2, Colab at full size)."""

from __future__ import annotations

import importlib
import json

import pytest

from configs import (
  colab,
  reprobe_smollm2,
  reprobe_synthetic,
  rl_synthetic,
  spae_smollm2,
  spae_synthetic,
  tts_smollm2,
  tts_synthetic,
)
from reprobe_jax.jobs import spae as spae_job
from reprobe_jax.jobs.cli import job_section
from reprobe_jax.jobs.rl import rl_config_from_dict
from reprobe_jax.jobs.reprobe_config import config_from_dict, prm_config_from_dict
from reprobe_jax.jobs.target_config import config_from_dict as target_config
from reprobe_jax.errors import ConfigError
from reprobe_jax.jobs.tts_config import check_prm, grid_domains, tts_config_from_dict


def _check(c):
  if c.job in ("reprobe", "seeds", "tts", "tts_seeds"):
    config_from_dict(c)
    prm_config_from_dict(c.get("prm"))
  if c.job in ("tts", "tts_seeds"):
    check_prm(tts_config_from_dict(c.tts), prm_config_from_dict(c.get("prm")))
    grid_domains(config_from_dict(c), tts_config_from_dict(c.tts))
  if c.job in ("spae", "spae_seeds"):  # as eval.py reads them
    job_section(c, "spae", spae_job.job_config_from_dict, ("seed", "data"))
    spae_job.probe_config_from_dict(c.probe)
  if c.job in ("rl", "rl_compare"):  # as train.py reads them
    job_section(c, "rl", rl_config_from_dict, ("advantage", "seed", "data"))
    job_section(c, "eval", spae_job.job_config_from_dict, ("data",))
    spae_job.probe_config_from_dict(c.probe)
  if not c.get("target_path") and not isinstance(c.get("target"), str):  # the built-in target's build section
    target_config(c.target, "config.target")


@pytest.mark.parametrize(
  "make",
  [
    reprobe_synthetic.get_config,
    reprobe_smollm2.get_config,
    tts_smollm2.get_config,
    tts_synthetic.get_config,
    lambda: tts_synthetic.get_config("demo"),
    lambda: tts_synthetic.get_config("demo,v2"),
    lambda: reprobe_synthetic.get_config("v2"),
    spae_synthetic.get_config,
    lambda: spae_synthetic.get_config("v2"),
    spae_smollm2.get_config,
    rl_synthetic.get_config,
    lambda: rl_synthetic.get_config("v2"),
  ],
)
def test_job_configs_convert(make):
  _check(make())


def test_the_world_is_the_configs_argument():
  """World v3 is the default of every synthetic config; `:v2` (`:demo,v2` for the tts grid) gives the control, and
  anything else is refused by name before a job starts."""
  from reprobe_jax.jobs.target_config import config_from_dict as build_config

  for make in (reprobe_synthetic.get_config, spae_synthetic.get_config, rl_synthetic.get_config):
    assert make().target.world == "v3" and make("v2").target.world == "v2"
    assert build_config(make("v2").target, "config.target").noise.procedures == ()
    assert build_config(make().target, "config.target").noise.procedures
  assert tts_synthetic.get_config("demo,v2").target.world == "v2" and tts_synthetic.get_config("demo").tts.problems
  for bad, make in (("v4", reprobe_synthetic.get_config), ("demo,v4", tts_synthetic.get_config)):
    with pytest.raises(ValueError, match="v4"):
      make(bad)
  with pytest.raises(ValueError, match="'fast'"):
    tts_synthetic.get_config("fast,v2")


@pytest.mark.parametrize("smoke", [False, True])
@pytest.mark.parametrize("model", ["", "HuggingFaceTB/SmolLM2-135M-Instruct"])
@pytest.mark.parametrize("make", [colab.reprobe, colab.tts, colab.spae])
def test_colab_configs_convert(make, model, smoke, tmp_path):
  c = make(str(tmp_path), model=model, smoke=smoke)
  assert c.workdir.startswith(str(tmp_path))
  assert c.get("target_path", "") == (model or "")
  _check(c)


@pytest.mark.parametrize("name", ["reprobe_math", "tts_math", "spae_math", "rl_math"])
def test_math_configs_need_a_data_file_and_run_on_one(name, tmp_path):
  """The math configs: SmolLM2 by default, refused at start without `config.data.path` (the message says to name a
  file), and every section converts once a GSM8K-format file is named."""
  c = importlib.import_module(f"configs.{name}").get_config()
  assert c.target == "smollm2" and "target_path" not in c and c.data.path == "" and c.data.format == "gsm8k"
  # (tts_math may stop at configs/reprobe_math.py's own check of the file, which names config.data.path too)
  with pytest.raises(ConfigError, match=r"data\.path"):
    _check(c)
  path = tmp_path / "gsm8k.jsonl"
  path.write_text(
    "".join(json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(20))
  )
  c.data.path = str(path)
  _check(c)
