"""The built-in target's report by difficulty: worked examples on hand-made records (reprobe_jax.synthetic)."""

from __future__ import annotations

import pytest

from reprobe_jax.errors import DataFormatError
from reprobe_jax.synthetic import evaluate
from reprobe_jax.jobs import target as build


def _rec(pid, labels, aligned, min_prob, correct, mode="line"):
  return {
    "id": pid,
    "domain": pid.split("-")[0],
    "mode": mode,
    "labels": labels,
    "aligned_labels": aligned,
    "step_min_prob": min_prob,
    "correct": correct,
    "num_tokens": 10,
    "answer": "3",
    "finish_reason": "eos",
  }


RECORDS = [
  _rec("planning-d1-s7-00000", [1.0, 0.0], [1.0, 0.0, 0.0], [0.9, 0.8, 0.7], True),
  _rec("planning-d1-s7-00001", [1.0, 1.0], [1.0, 1.0, 1.0], [0.2, 0.6, 0.9], False),
  _rec("planning-d2-s7-00000", [0.0, 0.0, None], [0.0, 0.0, 0.0, None], [0.9, 0.9, 0.9, 0.9], True),
  _rec("arithmetic-d3-s7-00000", [0.0], [0.0, 1.0], [0.9, 0.4], False),
]


def test_difficulty_of_reads_make_problems_ids():
  assert evaluate.difficulty_of("qa-d3-s1000003-00012") == 3
  assert evaluate.difficulty_of("planning-d1-s5") == 1  # a single `generate` call's id
  with pytest.raises(DataFormatError, match="names no difficulty"):
    evaluate.difficulty_of("imported-problem-7")


def test_summarise_by_difficulty_worked_example():
  out = evaluate.summarise_by_difficulty(RECORDS)
  assert list(out) == ["arithmetic/line/d3", "planning/line/d1", "planning/line/d2"]
  d1 = out["planning/line/d1"]
  # planning d1: checker steps 1,0,1,1 -> 3/4 wrong; probe steps 1,0,0,1,1,1 -> 4/6; the wrong probe steps' lowest
  # token probabilities 0.9, 0.2, 0.6, 0.9 -> 3 of 4 above 0.5; one of two answers right.
  assert d1["samples"] == 2 and d1["step_error_rate"] == pytest.approx(0.75)
  assert d1["aligned_error_rate"] == pytest.approx(4 / 6)
  assert d1["confident_error_share"] == pytest.approx(0.75)
  assert d1["final_accuracy"] == pytest.approx(0.5)
  assert out["planning/line/d2"]["step_error_rate"] == 0.0  # unknown labels (None) left out
  # Each group is the same summary as the whole-family one, computed on that difficulty's records alone.
  assert out["planning/line/d1"] == evaluate.summarise_samples(RECORDS[:2])


def test_difficulty_markdown_gives_mean_and_sd_over_builds():
  a = evaluate.summarise_by_difficulty(RECORDS)
  b = evaluate.summarise_by_difficulty([dict(r, labels=[0.0] * len(r["labels"])) for r in RECORDS])
  table = build.difficulty_markdown([a, b])
  row = next(line for line in table.splitlines() if line.startswith("| planning/line/d1 |"))
  # step error 0.75 and 0.0: mean 0.375, sample sd 0.530
  assert row.split(" | ")[1:3] == ["2", "0.375 +- 0.530"]
  single = build.difficulty_markdown([a])
  assert "| planning/line/d1 | 2 | 0.750 | 0.667 | 0.750 | 0.500 |" in single


def test_by_difficulty_cli_refuses_a_folder_that_is_no_build(tmp_path):
  with pytest.raises(SystemExit, match="no samples_eval.jsonl"):
    build.main([str(tmp_path)])
