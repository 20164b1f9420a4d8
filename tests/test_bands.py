"""Bands over seeds: mean and spread, the stored file, and the user's numbers beside them."""

import math

import numpy as np
import pytest

from reprobe_jax.bands import Band, BandFile, comparison_markdown, flatten, over_seeds, summarise
from reprobe_jax.errors import DataFormatError


def test_summarise_is_mean_and_sample_sd_widened_to_the_range():
  b = summarise([0.60, 0.64, 0.71])
  assert b.mean == pytest.approx(np.mean([0.60, 0.64, 0.71]))
  assert b.sd == pytest.approx(np.std([0.60, 0.64, 0.71], ddof=1))
  assert b.lo == pytest.approx(b.mean - 2 * b.sd) and b.hi == pytest.approx(b.mean + 2 * b.sd)
  assert b.holds(0.60) and b.holds(0.71) and not b.holds(0.90)
  one = summarise([0.5, math.nan])
  assert (one.sd, one.n, one.lo, one.hi) == (0.0, 1, 0.5, 0.5)
  assert summarise([]).n == 0


def test_flatten_and_over_seeds_follow_dotted_keys():
  runs = [{"methods": {"maxprob": {"arithmetic": {"pr_auc": x, "name": "s"}}}, "ok": True} for x in (0.5, 0.7)]
  assert flatten(runs[0]) == {"methods.maxprob.arithmetic.pr_auc": 0.5}
  bands = over_seeds(runs)
  assert bands["methods.maxprob.arithmetic.pr_auc"].mean == pytest.approx(0.6)


def test_band_file_round_trips_and_refuses_a_damaged_one(tmp_path):
  f = BandFile("reprobe", (0, 1, 2), "Intel(R) Xeon(R) Processor (AVX-512+AMX)",
               {"a.b": Band(0.6, 0.05, 0.55, 0.66, 3)})
  path = str(tmp_path / "bands.json")
  f.save(path)
  assert BandFile.load(path) == f
  (tmp_path / "bad.json").write_text('{"job": "x", "seeds": [0], "machine": "m", "bands": {"a": {"mean": 1}}}')
  with pytest.raises(DataFormatError, match=r"bad\.json: not a band file"):
    BandFile.load(str(tmp_path / "bad.json"))


def test_comparison_marks_values_outside_their_band():
  f = BandFile("reprobe", (0, 1, 2), "m", {"x": Band(0.6, 0.01, 0.59, 0.61, 3), "y": Band(0.3, 0.1, 0.2, 0.4, 3)})
  table = comparison_markdown({"x": 0.7, "y": 0.35, "z": 0.1}, f, ["x", "y", "z"])
  lines = table.splitlines()
  assert "**outside**" in lines[2] and lines[3].endswith("| inside |") and "(no band)" in lines[4]
