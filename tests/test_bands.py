"""Bands over seeds: mean and spread, the stored file, and the user's numbers beside them."""

import math

import numpy as np
import pytest

from reprobe_jax.eval.bands import Band, BandFile, flatten, grid_markdown, over_seeds, summarise
from reprobe_jax.errors import DataFormatError


def test_summarise_is_mean_sample_sd_and_the_prediction_interval_of_one_more_seed():
  b = summarise([0.60, 0.64, 0.71])
  assert b.mean == pytest.approx(np.mean([0.60, 0.64, 0.71]))
  assert b.sd == pytest.approx(np.std([0.60, 0.64, 0.71], ddof=1))
  # Worked example: mean 0.65, sd sqrt(0.0062 / 2) = 0.05568; t(0.975, 2) = 4.3027, sqrt(1 + 1/3) = 1.1547, so the
  # half width is 0.2766 and the band 0.3734 .. 0.9266.
  assert b.half_width == pytest.approx(0.27663, abs=1e-4)
  assert (b.lo, b.hi) == (pytest.approx(0.37337, abs=1e-4), pytest.approx(0.92663, abs=1e-4))
  assert b.holds(0.60) and b.holds(0.90) and not b.holds(0.95) and not b.holds(0.35)
  one = summarise([0.5, math.nan])
  assert (one.sd, one.n, one.lo, one.hi) == (0.0, 1, 0.5, 0.5)
  assert summarise([]).n == 0


def test_t_quantiles_match_scipy():
  stats = pytest.importorskip("scipy.stats")
  from reprobe_jax.eval.bands import t_975

  for df in (1, 2, 3, 5, 10, 30):
    assert t_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-4)
  assert t_975(1000) == pytest.approx(stats.t.ppf(0.975, 1000), rel=0.01)
  with pytest.raises(ValueError, match="degrees of freedom"):
    t_975(0)


def test_flatten_and_over_seeds_follow_dotted_keys():
  runs = [{"methods": {"maxprob": {"arithmetic": {"pr_auc": x, "name": "s"}}}, "ok": True} for x in (0.5, 0.7)]
  assert flatten(runs[0]) == {"methods.maxprob.arithmetic.pr_auc": 0.5}
  bands = over_seeds(runs)
  assert bands["methods.maxprob.arithmetic.pr_auc"].mean == pytest.approx(0.6)


def test_band_file_round_trips_and_refuses_a_damaged_one(tmp_path):
  f = BandFile(
    "reprobe", (0, 1, 2), "Intel(R) Xeon(R) Processor (AVX-512+AMX)", "abc123", {"a.b": Band(0.6, 0.05, 0.55, 0.66, 3)}
  )
  path = str(tmp_path / "bands.json")
  f.save(path)
  assert BandFile.load(path) == f
  (tmp_path / "bad.json").write_text(
    '{"job": "x", "seeds": [0], "machine": "m", "config_key": "k", "bands": {"a": {"mean": 1}}}'
  )
  with pytest.raises(DataFormatError, match=r"bad\.json: not a band file"):
    BandFile.load(str(tmp_path / "bad.json"))


def test_grid_shows_bands_and_marks_values_outside_them():
  bands = {"m.x.pr": Band(0.6, 0.01, 0.59, 0.61, 3), "m.y.pr": Band(0.3, 0.1, 0.2, 0.4, 3)}
  key = lambda r, c: f"{r}.{c}.pr"
  summary = grid_markdown(["m"], ["x", "y", "z"], key, bands)
  assert summary.splitlines()[2] == "| m | 0.600 +- 0.010 | 0.300 +- 0.100 |  |"
  mine = grid_markdown(["m"], ["x", "y", "z"], key, bands, {"m.x.pr": 0.7, "m.y.pr": 0.35, "m.z.pr": 0.1})
  assert mine.splitlines()[2] == "| m | 0.700 ! (0.600 +- 0.010) | 0.350 (0.300 +- 0.100) | 0.100 |"


def _result(x):
  return {
    "target": {"groups": {"arithmetic/line": {"step_error_rate": x, "confident_error_share": 0.4}}},
    "reprobe": {
      "datasets": {"arithmetic": {"steps": 10, "incorrect_share": 0.3}},
      "methods": {
        "maxprob": {
          "arithmetic": {"pr_auc": x, "roc_auc": 0.5, "pr_auc_ci": [x - 0.1, x + 0.1]},
          "id_mean_pr_auc": x,
          "ood_mean_pr_auc": x,
          "overall_pr_auc": x,
        }
      },
    },
  }


def test_summary_and_beside_bands_read_the_same_keys(tmp_path):
  import ml_collections
  from reprobe_jax.eval.bands import summary_markdown
  from reprobe_jax.jobs.bands import band_key, beside_bands

  runs = [_result(x) for x in (0.5, 0.6, 0.7)]
  config = ml_collections.ConfigDict(
    {"job": "reprobe", "seed": 0, "workdir": "w", "target_path": "m", "lr": 1.0, "bands": str(tmp_path / "bands.json")}
  )
  f = BandFile("reprobe", (0, 1, 2), "machine A", band_key(config), over_seeds(runs))
  assert "reprobe.methods.maxprob.arithmetic.pr_auc_ci.1" in f.bands  # intervals flatten to .0 / .1
  summary = summary_markdown(f, runs[0])
  assert "| arithmetic/line | 0.600 +- 0.100 |" in summary and "| maxprob | 0.600 +- 0.100 |" in summary
  f.save(config.bands)
  mine = beside_bands(config, _result(1.2), machine="machine B")
  assert "machine B" in mine and "machine A" in mine and "| maxprob | 1.200 ! (0.600 +- 0.100) |" in mine
  # A band file made on this run's machine kind is named after the README's comparison, with its flagged numbers.
  f_b = BandFile("reprobe", (0, 1, 2), "machine B", band_key(config), over_seeds([_result(x) for x in (1.1, 1.2, 1.3)]))
  f_b.save(str(tmp_path / "b.json"))
  config.machine_bands = (str(tmp_path / "b.json"), str(tmp_path / "missing.json"))
  assert band_key(config) == f.config_key  # naming band files is not part of what a band depends on
  mine = beside_bands(config, _result(1.2), machine="machine B")
  assert "| maxprob | 1.200 ! (0.600 +- 0.100) |" in mine  # the README's grid is still the one shown
  # 7 shown numbers: 2 target cells, maxprob's arithmetic PR-AUC and its three means, the incorrect share.
  assert "this machine kind" in mine and "0 of 7 numbers outside." in mine
  mine = beside_bands(config, _result(5.0), machine="machine B")
  assert "5 of 7 numbers outside: target.groups.arithmetic/line.step_error_rate, " in mine  # the constants hold
  assert "this machine kind" not in beside_bands(config, _result(1.2), machine="machine C")
  config.seed = 5  # the seed and workdir are not part of what a band depends on
  assert "1.200 !" in beside_bands(config, _result(1.2), machine="B")
  config.lr = 2.0
  assert "made with another config" in beside_bands(config, _result(1.2), machine="B")
  config.bands = str(tmp_path / "none.json")
  assert "No band file" in beside_bands(config, _result(1.2), machine="B")


def test_seeds_are_checked():
  from reprobe_jax.jobs.bands import check_seeds
  from reprobe_jax.errors import ConfigError

  assert check_seeds((0, 1, 2)) == (0, 1, 2)
  for bad in ((0,), (1, 1), (0, -1), (0, 1.5), "012", None):
    with pytest.raises(ConfigError, match="config.seeds"):
      check_seeds(bad)


def test_the_shipped_bands_apply_to_the_shipped_config():
  """make demo compares its numbers with configs/bands/ only when the band file's key is the demo config's: a
  field added later with its old behaviour as default (the interrupted-thinking ones, off here) must not change the
  key, or the demo silently stops comparing. Each world has its own band files; world v2's (the control) kept the key
  they had when v2 was the default."""
  import json
  import os
  from configs import reprobe_synthetic, tts_synthetic
  from reprobe_jax.jobs.bands import band_key

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

  def key_of(path):
    with open(os.path.join(root, path)) as f:
      d = json.load(f)
    return d["config_key"], d["machine"]

  for world in ("v3", "v2"):
    config = reprobe_synthetic.get_config(world)
    assert config.target.world == world and world in config.bands
    machines = set()
    for path in (config.bands,) + tuple(config.machine_bands):
      key, machine = key_of(path)
      assert key == band_key(config), path
      machines.add(machine)
    assert len(machines) == 1 + len(config.machine_bands)
    demo = tts_synthetic.get_config(f"demo,{world}")
    assert key_of(demo.bands)[0] == band_key(demo), demo.bands
  assert band_key(reprobe_synthetic.get_config("v2")) == "71cbb8b6cae0"  # the key v2's bands were made with
  assert reprobe_synthetic.get_config().target.world == "v3" and tts_synthetic.get_config().bands == ""
  with pytest.raises(ValueError, match="expected one of"):
    reprobe_synthetic.get_config("v4")
  from configs import reprobe_smollm2  # SmolLM2's bands (three seeds, no PRM: its config's default)

  config = reprobe_smollm2.get_config()
  assert key_of(config.bands)[0] == band_key(config)
  config.target.world = "v2"  # a pretrained target: the built-in target's section is not part of the key
  assert key_of(config.bands)[0] == band_key(config)


def _tts(best):
  cells = {
    "greedy": {"1": {"first": 0.3}},
    "best_of_n[probe]": {
      "1": {"first": 0.3, "best": 0.3, "majority": 0.3, "weighted": 0.3, "pass@n": 0.3},
      "4": {"first": 0.3, "best": best, "majority": 0.5, "weighted": 0.6, "pass@n": 0.9},
    },
    "beam[probe]": {"4": {"best": best + 0.1}},
  }
  return {"tts": {"results": {"arithmetic": cells}, "config": {"budgets": [1, 4]}, "machine": "m"}}


def test_a_tts_run_is_shown_beside_the_bands_of_its_grid_at_the_largest_budget(tmp_path):
  import ml_collections
  from reprobe_jax.eval.bands import grids, outside
  from reprobe_jax.jobs.bands import band_key, beside_bands

  config = ml_collections.ConfigDict({"job": "tts", "seed": 0, "target_path": "m", "bands": str(tmp_path / "b.json")})
  runs = [_tts(x) for x in (0.6, 0.7, 0.8)]
  BandFile("tts", (0, 1, 2), "machine A", band_key(config), over_seeds(runs)).save(config.bands)
  table = grids(runs[0], over_seeds(runs), None)
  assert "accuracy at N = 4" in table
  for row in (
    "| Greedy | 0.300 +- 0.000 |",
    "| Majority vote | 0.500 +- 0.000 |",
    "| Best-of-N, probe | 0.700 +- 0.100 |",
    "| Weighted vote, probe | 0.600 +- 0.000 |",
    "| Beam search, probe | 0.800 +- 0.100 |",
    "| pass@N (upper bound) | 0.900 +- 0.000 |",
  ):
    assert row in table, table
  mine = beside_bands(config, _tts(2.0), machine="machine B")
  assert "| Best-of-N, probe | 2.000 ! (0.700 +- 0.100) |" in mine and "| Greedy | 0.300 (0.300 +- 0.000) |" in mine
  assert outside(_tts(2.0), over_seeds(runs)) == (
    ["tts.results.arithmetic.best_of_n[probe].4.best", "tts.results.arithmetic.beam[probe].4.best"],
    6,
  )


def test_differing_names_the_numbers_two_machines_disagree_on():
  from reprobe_jax.eval.bands import differing, welch_t

  a = BandFile(
    "reprobe",
    (0, 1, 2),
    "A",
    "k",
    {
      "x": summarise([0.80, 0.82, 0.84]),
      "y": summarise([0.5, 0.5, 0.5]),
      "z": summarise([0.1, 0.2, 0.3]),
      "one": summarise([0.1]),
    },
  )
  b = BandFile(
    "reprobe",
    (0, 1, 2),
    "B",
    "k",
    {
      "x": summarise([0.70, 0.71, 0.72]),
      "y": summarise([0.6, 0.6, 0.6]),
      "z": summarise([0.15, 0.25, 0.35]),
      "one": summarise([0.9]),
    },
  )
  # Worked example: x's means 0.82 and 0.71, sds 0.02 and 0.01, se sqrt(0.0004/3 + 0.0001/3) = 0.01291, t = -8.52.
  assert welch_t(a.bands["x"], b.bands["x"]) == pytest.approx(-8.5206, abs=1e-3)
  assert welch_t(a.bands["y"], b.bands["y"]) == math.inf  # no spread on either side, different means
  got = differing(a, b)  # default limit t(0.975, 2) = 4.30: z (t = 0.61) agrees, 'one' has one seed
  assert [k for k, _ in got] == ["y", "x"]
  assert [k for k, _ in differing(a, b, limit=0.5)] == ["y", "x", "z"]
  with pytest.raises(DataFormatError, match="share no number"):
    differing(a, BandFile("reprobe", (0,), "C", "k", {"q": summarise([0.1, 0.2])}))


def test_cli_counts_results_and_stage_times_apart(tmp_path, capsys):
  from reprobe_jax.jobs.bands import main

  a = BandFile(
    "reprobe",
    (0, 1, 2),
    "Xeon",
    "k",
    {
      "reprobe.methods.p.x": summarise([0.80, 0.82, 0.84]),
      "reprobe.methods.p.z": summarise([0.1, 0.2, 0.3]),
      "target.timings_s.train_s": summarise([700.0, 710.0, 730.0]),
    },
  )
  b = BandFile(
    "reprobe",
    (0, 1, 2),
    "EPYC",
    "k",
    {
      "reprobe.methods.p.x": summarise([0.70, 0.71, 0.72]),
      "reprobe.methods.p.z": summarise([0.15, 0.25, 0.35]),
      "target.timings_s.train_s": summarise([350.0, 354.0, 360.0]),
    },
  )
  a.save(str(tmp_path / "a.json"))
  b.save(str(tmp_path / "b.json"))
  main([str(tmp_path / "a.json"), str(tmp_path / "b.json")])
  out = capsys.readouterr().out
  assert "A = Xeon (seeds [0, 1, 2]), B = EPYC" in out
  assert "1 of 2 results differ" in out and "1 of 1 stage times differ" in out
  results, times = out.split("stage times differ")
  assert "reprobe.methods.p.x" in results and "train_s" not in results and "p.z" not in out
  assert "target.timings_s.train_s" in times
