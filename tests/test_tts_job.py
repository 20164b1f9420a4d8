"""The test-time-scaling job: budget shapes, its config checks, the tables over one seed and over seeds, and a tiny
grid end to end (cells stored and reused, Best-of-N's smaller budgets the first k of one run)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from reprobe_jax.errors import ConfigError
from reprobe_jax.jobs import reprobe as pipeline
from reprobe_jax.jobs import tts as job
from reprobe_jax.jobs import tts_cells
from reprobe_jax.jobs import tts_report as report
from reprobe_jax.jobs.reprobe_config import ReprobeConfig
from reprobe_jax.jobs.tts_config import TTSConfig, beam_shape, dvts_shape, tts_config_from_dict
from reprobe_jax.probe.train import ProbeTrainConfig
from reprobe_jax.trajectories import TrajectoryConfig
from test_pipeline import STAGES, count_reads, count_stages


def test_budget_shapes_multiply_to_the_budget():
  assert [beam_shape(b) for b in (1, 2, 4, 8, 16, 32, 6)] == [(1, 1), (1, 2), (2, 2), (2, 4), (4, 4), (4, 8), (1, 6)]
  assert [dvts_shape(b) for b in (1, 2, 4, 8, 16, 6)] == [(1, 1), (1, 2), (1, 4), (2, 4), (4, 4), (1, 6)]


def test_config_is_checked_whole():
  with pytest.raises(ConfigError, match="config.tts.budgets: expected increasing budgets"):
    tts_config_from_dict({"budgets": (4, 2)})
  with pytest.raises(ConfigError, match=r"config.tts.scorers: expected .*probe\[<feature set>\]"):
    tts_config_from_dict({"scorers": ("prm-7b",)})
  with pytest.raises(ConfigError, match="config.tts.split"):
    tts_config_from_dict({"split": "train"})
  with pytest.raises(ConfigError, match=r"config.tts: unknown field\(s\) \[.nope.\]"):
    tts_config_from_dict({"nope": 1})


def _summary(acc: dict, steps=10.0) -> dict:
  return {
    "first": acc.get("first", 0.0),
    "best": acc.get("best", 0.0),
    "majority": acc.get("majority", 0.0),
    "weighted": acc.get("weighted", 0.0),
    "pass@n": acc.get("pass@n", 0.0),
    "sampled_steps": steps,
    "generated_tokens": 10 * steps,
    "problems": 4,
    "seconds_per_problem": 0.5,
  }


def _metrics(shift: float = 0.0) -> dict:
  per = {
    "greedy": {"1": _summary({"first": 0.5 + shift})},
    "best_of_n[maxprob]": {
      "1": _summary({"best": 0.25 + shift, "majority": 0.25}),
      "4": _summary({"best": 0.5 + shift, "majority": 0.75, "weighted": 0.5, "pass@n": 1.0}, 40.0),
    },
    "beam[maxprob]": {"4": _summary({"best": 0.75 + shift}, 38.0)},
  }
  return {
    "results": {"arithmetic": per, "qa": per},
    "config": {"budgets": [1, 4]},
    "train_domains": ["arithmetic"],
    "machine": "test cpu",
  }


def test_table_rows_read_their_selection_at_the_largest_budget():
  table = report.table_markdown(_metrics())
  lines = {}
  for line in table.splitlines():  # the first table's rows (the budget table repeats the titles)
    if line.startswith("| "):
      lines.setdefault(line.split(" | ")[0].strip("| "), line)
  assert "| 0.500 | 0.500 |" in lines["Greedy"]  # greedy is one trajectory at every budget
  assert lines["Majority vote"].startswith("| Majority vote | 0.750 | 0.750 |")
  assert lines["Best-of-N, maxprob"].startswith("| Best-of-N, maxprob | 0.500 |")
  assert lines["Beam search, maxprob"].startswith("| Beam search, maxprob | 0.750 |")
  assert lines["pass@N (upper bound)"].startswith("| pass@N (upper bound) | 1.000 |")
  assert "arithmetic (ID)" in table and "qa (OOD)" in table
  # the budget table: beam search has no N = 1 cell; its cost at the largest budget
  beam = [line for line in table.splitlines() if line.startswith("| Beam search, maxprob |")][1]
  assert beam == "| Beam search, maxprob |  | 0.750 | 38.0 | 380 | 0.50 |  |"


def test_over_seeds_gives_mean_and_sample_sd():
  merged = report.over_seeds([_metrics(0.0), _metrics(0.1), _metrics(0.2)])
  band = merged["results"]["arithmetic"]["beam[maxprob]"]["4"]["best"]
  assert band.mean == pytest.approx(0.85) and band.sd == pytest.approx(0.1) and band.n == 3
  table = report.table_markdown(merged)
  assert "| Beam search, maxprob | 0.850 +- 0.100 |" in table and "Mean +- sd over 3 seeds." in table


@pytest.fixture(scope="module")
def lm(synthetic_lm):
  """A random tiny model with a tokenizer of the synthetic worlds (outputs are noise; mechanics only)."""
  return synthetic_lm


@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_a_tiny_grid_end_to_end_and_resumed(lm, tmp_path, monkeypatch):
  cfg = ReprobeConfig(
    train_problems=4,
    val_problems=2,
    test_problems=3,
    difficulties=(1,),
    trajectories=TrajectoryConfig(samples=1, max_new_tokens=24, batch_size=8),
    train=ProbeTrainConfig(batch_size=4, epochs=1),
  )
  tcfg = TTSConfig(problems=2, domains=("arithmetic",), scorers=("perplexity",), budgets=(1, 2, 4), max_steps=4)
  calls = count_stages(monkeypatch, pipeline)
  metrics = job.evaluate(lm, cfg, tcfg, str(tmp_path))
  assert not calls  # no probe and no PRM among the scorers: nothing of the ReProbe job runs
  per = metrics["results"]["arithmetic"]
  assert set(per) == {"greedy", "best_of_n[perplexity]", "beam[perplexity]", "dvts[perplexity]"}
  assert set(per["best_of_n[perplexity]"]) == {"1", "2", "4"} and set(per["beam[perplexity]"]) == {"2", "4"}
  bon = per["best_of_n[perplexity]"]
  for b in ("1", "2", "4"):
    s = bon[b]
    assert s["problems"] == 2 and 0 <= s["best"] <= s["pass@n"] <= 1
  # the first k of one run: the cost grows with k, and pass@k cannot drop
  assert bon["1"]["sampled_steps"] <= bon["2"]["sampled_steps"] <= bon["4"]["sampled_steps"]
  assert bon["1"]["pass@n"] <= bon["2"]["pass@n"] <= bon["4"]["pass@n"]
  for f in ("metrics.json", "table.md", "accuracy.png", "cells/arithmetic.greedy.json"):
    assert os.path.exists(os.path.join(metrics["directory"], f)), f
  stored = json.load(open(os.path.join(metrics["directory"], "metrics.json")))
  same = lambda a, b: json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN-aware equality
  assert same(stored["results"], metrics["results"])
  # a rerun reads every cell back and searches nothing
  monkeypatch.setattr(tts_cells, "run_search", lambda *a, **k: pytest.fail("a stored cell was searched again"))
  again = job.evaluate(lm, cfg, tcfg, str(tmp_path))
  assert same(again["results"], metrics["results"])
  assert np.isfinite(again["results"]["arithmetic"]["beam[perplexity]"]["4"]["sampled_steps"])


def test_cascade_rows_and_their_mean_over_seeds():
  def with_cascade(shift):
    m = _metrics(shift)
    m["cascade"] = {
      "arithmetic": {
        "probe": "probe[hidden]",
        "budget": 4,
        "fractions": [0.0, 0.5, 1.0],
        "steps": 9,
        "prm": {"accuracy": [0.5 + shift, 0.6, 0.25], "prm_calls": [0.0, 5 / 9, 1.0]},
        "fusion": {"accuracy": [0.5 + shift, 0.75, 0.75], "prm_calls": [0.0, 5 / 9, 1.0]},
      }
    }
    return m

  table = report.table_markdown(with_cascade(0.0))
  assert "Cascade, Best-of-N at N = 4 from probe[hidden]" in table
  assert "| arithmetic | its score | 0.500 | 0.600 | 0.250 |" in table
  assert "| arithmetic | fused with the probe | 0.500 | 0.750 | 0.750 |" in table
  merged = report.over_seeds([with_cascade(0.0), with_cascade(0.2)])
  band = merged["cascade"]["arithmetic"]["prm"]["accuracy"][0]
  assert band.mean == pytest.approx(0.6) and band.n == 2
  assert "| arithmetic | its score | 0.600 +- 0.141 |" in report.table_markdown(merged)


@pytest.mark.slow
def test_the_prm_its_fusion_and_the_cascade_in_a_tiny_grid(lm, tmp_path, monkeypatch):
  """The cascade's ends are the cells it mixes: at 0% PRM calls Best-of-N by the probe, at 100% by the PRM (its
  score) or by the fusion; the same candidates (same seeds) in every Best-of-N cell. The grid's scorers and fusion
  come from one run of the ReProbe job, whose stages each run once."""
  from reprobe_jax.prm.train import PRMTrainConfig

  cfg = ReprobeConfig(
    train_problems=6,
    val_problems=4,
    test_problems=3,
    difficulties=(1,),
    feature_sets=("hidden",),
    trajectories=TrajectoryConfig(samples=1, max_new_tokens=24, batch_size=8),
    train=ProbeTrainConfig(batch_size=4, epochs=1),
  )
  prm = PRMTrainConfig(separator="<|pad|>", batch_size=4, epochs=1)
  tcfg = TTSConfig(
    problems=2,
    domains=("arithmetic",),
    scorers=("probe[hidden]", "prm"),
    strategies=("best_of_n",),
    budgets=(1, 4),
    max_steps=4,
  )
  with pytest.raises(ConfigError, match="config.prm.enabled is False"):
    job.evaluate(lm, cfg, tcfg, str(tmp_path))
  calls, reads = count_stages(monkeypatch, pipeline), count_reads(monkeypatch)
  grid_calls = count_stages(monkeypatch, job)
  metrics = job.evaluate(lm, cfg, tcfg, str(tmp_path), prm=prm)
  # the probes and the PRM for the scorers, the report for the step scores the fusion is fitted on: each stage once
  assert calls == {s: 1 for s in STAGES} and grid_calls == {s: 1 for s in job.GRAPH.stages}
  assert reads == {
    f"{kind}_{split}.jsonl": 1 for kind in ("samples", "trajectories") for split in ("train", "val", "test")
  }
  per = metrics["results"]["arithmetic"]
  assert set(per) == {"greedy", "best_of_n[probe[hidden]]", "best_of_n[prm]", "best_of_n[fusion[hidden]]"}
  c = metrics["cascade"]["arithmetic"]
  assert c["probe"] == "probe[hidden]" and c["fractions"][0] == 0 and c["fractions"][-1] == 1
  for kind in ("prm", "fusion"):
    assert c[kind]["prm_calls"][0] == 0 and c[kind]["prm_calls"][-1] == 1
    assert c[kind]["accuracy"][0] == per["best_of_n[probe[hidden]]"]["4"]["best"]
  assert c["prm"]["accuracy"][-1] == per["best_of_n[prm]"]["4"]["best"]
  assert c["fusion"]["accuracy"][-1] == per["best_of_n[fusion[hidden]]"]["4"]["best"]
  assert per["best_of_n[prm]"]["4"]["sampled_steps"] == per["best_of_n[probe[hidden]]"]["4"]["sampled_steps"]
  assert os.path.exists(os.path.join(metrics["directory"], "cascade.png"))
  assert "Cascade, Best-of-N" in open(os.path.join(metrics["directory"], "table.md")).read()
