"""SmolLM2-135M-Instruct end to end on the user's own data: the four math configs (ReProbe with self-annotated
labels, the test-time-scaling grid, SPAE's potentials, two RL steps) through train.py / eval.py, as a user runs
them, on a GSM8K-format file written here (tests/data/gsm8k_mini.jsonl, 20 problems), at smaller budgets than the
configs' defaults so the whole file runs in about 10 minutes on 2 CPU cores. docs/own-data.md reports the numbers
of the configs at their default sizes.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from test_gguf_smollm2 import needs_smollm2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "gsm8k_mini.jsonl")
# Ten problems (train 7, val 1, test 2), one sample each, short budgets: every stage runs, none at full size.
SMALL = [f"--config.data.path={DATA}", "--config.data.format=gsm8k", "--config.data.limit=10"]
REPROBE_SMALL = [
  "--config.trajectories.samples=1",
  "--config.trajectories.max_new_tokens=96",
  "--config.judge.self_judge.max_new_tokens=96",
  "--config.train.epochs=1",
]

pytestmark = [pytest.mark.slow, needs_smollm2]


def _run(script: str, config: str, workdir: str, *flags: str) -> str:
  cmd = [sys.executable, script, f"--config=configs/{config}.py", f"--config.workdir={workdir}", *SMALL, *flags]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
  assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
  return proc.stdout


def _one(pattern: str) -> dict:
  found = glob.glob(pattern, recursive=True)
  assert len(found) == 1, f"expected one file matching {pattern}, found {found}"
  with open(found[0]) as f:
    return json.load(f)


def test_reprobe_then_tts_on_a_gsm8k_file(tmp_path):
  workdir = str(tmp_path / "reprobe")
  out = _run("eval.py", "reprobe_math", workdir, *REPROBE_SMALL)
  assert "Outcome accuracy:" in out
  metrics = _one(f"{workdir}/*/metrics.json")
  outcome = metrics["outcome"]
  assert outcome["trajectories"] == 2 and 0.0 <= outcome["accuracy"] <= 1.0  # 2 test problems x 1 sample
  # the probes and the baselines are scored on the test split's steps, labelled by the target judging itself
  assert {"probe[hidden]", "probe[hidden+logit]", "perplexity", "maxprob"} <= set(metrics["methods"])
  records = [json.loads(line) for f in glob.glob(f"{workdir}/*/trajectories_*.jsonl") for line in open(f)]
  assert records and all(r["annotator"] == "judge:self" for r in records)
  assert any(label is not None for r in records for label in r["labels"])  # some verdicts parse
  # the TTS grid reuses the ReProbe run in the same workdir (same config sections), then searches
  _run("eval.py", "tts_math", workdir, *REPROBE_SMALL, "--config.tts.budgets=(1, 2)", "--config.tts.max_steps=4")
  grid = _one(f"{workdir}/*/tts/*/metrics.json")
  per = grid["results"]["math"]
  assert "greedy" in per and any(k.startswith("best_of_n[probe") for k in per)


def test_spae_and_two_rl_steps_on_a_gsm8k_file(tmp_path):
  spae_dir = str(tmp_path / "spae")
  _run("eval.py", "spae_math", spae_dir, "--config.spae.problems=2", "--config.spae.samples=2")
  plain = _one(f"{spae_dir}/*/metrics.json")["domains"]["math"]["plain"]
  assert plain["problems"] == 2 and plain["trajectories"] == 4 and 0.0 <= plain["acc_at_k"] <= 1.0
  rl_dir = str(tmp_path / "rl")
  _run("train.py", "rl_math", rl_dir, "--config.eval.problems=2", "--config.eval.samples=1")
  summary = _one(f"{rl_dir}/*/summary.json")
  assert summary["steps"] == 2 and len(summary["train"]["loss"]) == 2
  assert summary["train"]["data_position"][-1] > summary["train"]["data_position"][0] > 0  # it read on in the file
