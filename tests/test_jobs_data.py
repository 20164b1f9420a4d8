"""The test-time-scaling, SPAE and RL jobs on the user's data file (`config.data`, docs/own-data.md), on a tiny random
model and a GSM8K-format file written here: the TTS grid, SPAE decoding and two RL steps run on its splits; a run
resumed at its data position draws the prompts an uninterrupted one does; a bad data config is refused before any
work, naming `config.data.<field>`; the synthetic runs keep their keys."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
import test_rl_loop

from configs import judge_prompts
from reprobe_jax.annotate import JudgePrompts, JudgeSettings
from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.jobs import rl as rl_job
from reprobe_jax.jobs import spae as spae_job
from reprobe_jax.jobs import tts as tts_job
from reprobe_jax.jobs.cli import job_section
from reprobe_jax.jobs.reprobe_config import ReprobeConfig
from reprobe_jax.jobs.tts_config import TTSConfig, grid_domains
from reprobe_jax.probe.train import ProbeTrainConfig
from reprobe_jax.rl import loop
from reprobe_jax.spae.potential import ProbeConfig
from reprobe_jax.tasks.data import DataConfig, PromptOrder, load_data
from reprobe_jax.trajectories import TrajectoryConfig

QUESTIONS = [
  ("Ann has {a} apples and buys {b} more. How many apples does she have?", lambda a, b: a + b),
  ("A box holds {a} pens. How many pens are in {b} boxes?", lambda a, b: a * b),
  ("Tom had {a} dollars and spent {b}. How much is left?", lambda a, b: a - b),
]


def write_gsm8k(path, n: int, shift: int = 0) -> str:
  """A GSM8K-format file of n problems ('question', 'answer' ending '#### x'); `shift` changes every number."""
  with open(path, "w") as f:
    for i in range(n):
      q, solve = QUESTIONS[i % len(QUESTIONS)]
      a, b = 10 + 3 * i + shift, 2 + i % 4
      x = solve(a, b)
      f.write(json.dumps({"question": q.format(a=a, b=b), "answer": f"{a} and {b} give <<{x}>>{x}.\n#### {x}"}) + "\n")
  return str(path)


@pytest.fixture
def data(tmp_path) -> DataConfig:
  return DataConfig(path=write_gsm8k(tmp_path / "gsm8k.jsonl", 8), format="gsm8k", val=0.25, test=0.25)


def test_synthetic_keys_do_not_change():
  """`data` enters no synthetic run key: the configs' keys are their fields before data files existed."""
  assert "data" not in spae_job.config_key(spae_job.SPAEJobConfig())
  assert "data" not in loop.config_key(loop.RLConfig())
  assert spae_job.data_fingerprint(spae_job.SPAEJobConfig()) == loop.data_fingerprint(loop.RLConfig()) == ""
  on = DataConfig(path="x.jsonl", format="gsm8k")
  assert spae_job.config_key(spae_job.SPAEJobConfig(data=on))["data"]["path"] == "x.jsonl"
  assert grid_domains(ReprobeConfig(), TTSConfig()) == ("arithmetic", "planning", "qa")


def test_math_without_a_data_file_is_refused_naming_the_flag():
  with pytest.raises(ConfigError, match=r"^config\.tts\.domains: 'math' is the task of a data file.*--config\.data"):
    grid_domains(ReprobeConfig(), TTSConfig(domains=("math",)))
  with pytest.raises(ConfigError, match=r"^SPAEJobConfig\.domains: 'math' is the task of a data file.*data\.path"):
    spae_job.SPAEJobConfig(domains=("math",))
  with pytest.raises(ConfigError, match=r"^config\.rl\.train_domains: 'math' is the task of a data file"):
    rl_job.rl_config_from_dict({"train_domains": ("math",)})


# A data file's math task has no exact step checker: its ReProbe runs label steps by the target judging itself.
SELF_JUDGE = JudgeSettings(prompts=JudgePrompts.from_dict(judge_prompts.get_config().prompts.to_dict()))


def test_a_domain_the_data_split_lacks_is_refused(data):
  cfg = ReprobeConfig(data=data, annotator="self", judge=SELF_JUDGE)
  assert grid_domains(cfg, TTSConfig()) == ("math",)  # the default domains: the split's own
  with pytest.raises(ConfigError, match=r"config\.tts\.domains: the test split has no 'planning' problems"):
    grid_domains(cfg, TTSConfig(domains=("math", "planning")))
  with pytest.raises(ConfigError, match=r"SPAEJobConfig\.domains: a data file's problems are all 'math'"):
    spae_job.SPAEJobConfig(domains=("qa",), data=data)


@pytest.mark.parametrize(
  "bad, match",
  [
    ({"format": "csv"}, r"^config\.data\.format: expected one of 'gsm8k'"),
    ({"val": 0.7, "test": 0.5}, r"^config\.data\.val \+ config\.data\.test = 1\.2"),
    ({"limit": -1}, r"^config\.data\.limit: expected an int >= 0"),
    ({"nope": 1}, r"^config\.data: unknown field\(s\) \['nope'\]"),
  ],
)
def test_a_bad_data_config_is_refused_naming_its_field(bad, match):
  """As train.py and eval.py read the sections: `config.data` lifted into each job's config."""
  config = {"data": {"path": "gsm8k.jsonl", "format": "gsm8k", **bad}, "rl": {}, "spae": {}, "eval": {}}
  for section, from_dict, lifted in (
    ("rl", rl_job.rl_config_from_dict, ("advantage", "seed", "data")),
    ("spae", spae_job.job_config_from_dict, ("seed", "data")),
    ("eval", spae_job.job_config_from_dict, ("data",)),
  ):
    with pytest.raises(ConfigError, match=match):
      job_section(config, section, from_dict, lifted)


def test_a_bad_data_file_is_refused_before_the_run_folder(synthetic_lm, tmp_path, data):
  cfg = spae_job.SPAEJobConfig(
    problems=2, samples=2, max_new_tokens=16, data=dataclasses.replace(data, path="no.jsonl")
  )
  with pytest.raises(DataFormatError, match="no.jsonl: no such file"):
    spae_job.evaluate(synthetic_lm, cfg, ProbeConfig(samples=2, max_tokens=3), str(tmp_path / "spae"))
  broken = tmp_path / "broken.jsonl"
  broken.write_text(open(data.path).read() + json.dumps({"question": "What is 2 + 2?"}) + "\n")
  rcfg = dataclasses.replace(_tiny_rl(data), data=dataclasses.replace(data, path=str(broken)))
  with pytest.raises(DataFormatError, match=r"broken\.jsonl:9.*answer"):
    rl_job.run(synthetic_lm, rcfg, ProbeConfig(), spae_job.SPAEJobConfig(), str(tmp_path / "rl"))
  assert not (tmp_path / "spae").exists() and not (tmp_path / "rl").exists()


def test_spae_decodes_the_data_split(synthetic_lm, tmp_path, data):
  cfg = spae_job.SPAEJobConfig(problems=2, samples=2, max_new_tokens=24, batch_size=4, data=data)
  assert cfg.run_domains == cfg.run_in_domain == ("math",)
  result = spae_job.evaluate(synthetic_lm, cfg, ProbeConfig(samples=2, max_tokens=3), str(tmp_path))
  assert set(result["groups"]) == {"in_domain"} and set(result["domains"]) == {"math"}
  assert result["groups"]["in_domain"]["plain"]["trajectories"] == 4  # the test split's 2 problems x 2 samples
  test = [p.id for p in load_data(data).problems["test"]]
  assert [p.id for p in spae_job.problems_of(cfg, "math")] == test[:2]
  for mode in spae_job.MODES:
    assert os.path.exists(os.path.join(result["directory"], f"rows_math_{mode}.jsonl"))
  # other problems in the file at the same path: another run folder
  before = spae_job.run_folder(str(tmp_path), synthetic_lm, cfg, ProbeConfig(samples=2, max_tokens=3))
  write_gsm8k(data.path, 8, shift=1)
  assert spae_job.run_folder(str(tmp_path), synthetic_lm, cfg, ProbeConfig(samples=2, max_tokens=3)) != before


@pytest.mark.slow  # about 25 s on 2 cores
def test_tts_grid_on_the_data_split(synthetic_lm, tmp_path, data):
  cfg = ReprobeConfig(
    data=data,
    annotator="self",
    judge=SELF_JUDGE,
    trajectories=TrajectoryConfig(samples=1, max_new_tokens=24, batch_size=8),
    train=ProbeTrainConfig(batch_size=4, epochs=1),
  )
  tcfg = TTSConfig(problems=2, scorers=("perplexity",), strategies=("best_of_n", "beam"), budgets=(1, 2), max_steps=3)
  metrics = tts_job.evaluate(synthetic_lm, cfg, tcfg, str(tmp_path))
  assert list(metrics["results"]) == ["math"] and list(metrics["config"]["domains"]) == ["math"]
  per = metrics["results"]["math"]
  assert set(per) == {"greedy", "best_of_n[perplexity]", "beam[perplexity]"}
  assert per["best_of_n[perplexity]"]["2"]["problems"] == 2
  table = open(os.path.join(metrics["directory"], "table.md")).read()
  assert "math (ID)" in table


def _tiny_rl(data: DataConfig, **kw) -> loop.RLConfig:
  return test_rl_loop._tiny_rl(**{"steps": 2, "train_domains": ("math",), "data": data, **kw})


def _recording(monkeypatch) -> list[list[int]]:
  """The prompt indices of every round each step rolls out, in order (the rounds `collect` really used)."""
  drawn: list[list[int]] = []
  collect = loop.collect

  def recorded(roll, plan, want, *, dynamic):
    def roll_and_note(idx, round_):
      drawn.append([int(i) for i in idx])
      return roll(idx, round_)

    return collect(roll_and_note, plan, want, dynamic=dynamic)

  monkeypatch.setattr(loop, "collect", recorded)
  return drawn


@pytest.mark.slow  # about 30 s on 2 cores
def test_rl_on_data_resumes_at_its_data_position(synthetic_lm, tmp_path, data, monkeypatch):
  cfg, pcfg = _tiny_rl(data), ProbeConfig(samples=2, max_tokens=3)
  train = load_data(data).problems["train"]
  prompts = loop.train_prompts(synthetic_lm, cfg)
  assert [p.id for p in prompts.problems] == [p.id for p in train] and prompts.order == PromptOrder(len(train), 0)
  drawn = _recording(monkeypatch)
  whole = loop.train_rl(synthetic_lm, cfg, pcfg, str(tmp_path / "whole"), reward=test_rl_loop._coin_reward)
  assert whole.step == 2
  # each step draws on from where the last stopped: the order's positions, consumed round by round
  flat = [i for r in drawn for i in r]
  assert flat == PromptOrder(len(train), 0).take(0, len(flat))
  assert whole.metrics["data_position"][-1] == len(flat)
  assert [2 * r for r in whole.metrics["rounds"]] == np.diff([0] + whole.metrics["data_position"]).tolist()
  uninterrupted, drawn[:] = list(drawn), []

  def kill(step, m):
    if step == 2:
      raise test_rl_loop._Kill()

  with pytest.raises(
    test_rl_loop._Kill
  ):  # killed after step 2's rollout, before its checkpoint: step 1's is the latest
    loop.train_rl(synthetic_lm, cfg, pcfg, str(tmp_path / "cut"), reward=test_rl_loop._coin_reward, on_step=kill)
  assert drawn == uninterrupted
  drawn[:] = []
  resumed = loop.train_rl(synthetic_lm, cfg, pcfg, str(tmp_path / "cut"), reward=test_rl_loop._coin_reward)
  assert drawn == uninterrupted[int(whole.metrics["rounds"][0]) :]  # step 2 again, at step 1's data position
  assert resumed.metrics["data_position"] == whole.metrics["data_position"]
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # about 40 s on 2 cores
def test_rl_job_on_data_trains_and_evaluates_on_its_splits(synthetic_lm, tmp_path, data):
  cfg = _tiny_rl(data, advantage="spae")
  ecfg = spae_job.SPAEJobConfig(problems=2, samples=2, max_new_tokens=16, batch_size=4)
  assert rl_job.eval_config(cfg, ecfg).data == data  # the held-out evaluation: the same file's test split
  summary = rl_job.run(synthetic_lm, cfg, ProbeConfig(samples=2, max_tokens=3), ecfg, str(tmp_path))
  assert summary["steps"] == 2 and set(summary["eval"]) == {"in_domain"}
  assert summary["eval"]["in_domain"]["trajectories"] == 4
  stored = json.load(open(os.path.join(os.path.dirname(summary_path(tmp_path)), "config.json")))
  assert stored["rl"]["data"]["path"] == data.path and stored["eval"]["data"]["path"] == data.path


def summary_path(root) -> str:
  (found,) = [os.path.join(d, "summary.json") for d, _, files in os.walk(root) if "summary.json" in files]
  return found
