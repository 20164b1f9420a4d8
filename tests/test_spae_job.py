"""The SPAE evaluation job end to end on a tiny random model: files, resume, config errors."""

from __future__ import annotations

import json
import os

import pytest

from reprobe_jax.errors import ConfigError
from reprobe_jax.jobs import spae as job
from reprobe_jax.models import SamplingParams
from reprobe_jax.spae.potential import ProbeConfig


def _cfg(**kw):
  base = dict(
    problems=2,
    domains=("arithmetic", "qa"),
    in_domain=("arithmetic",),
    difficulties=(1,),
    samples=2,
    max_new_tokens=24,
    batch_size=4,
  )
  base.update(kw)
  return job.SPAEJobConfig(**base)


def test_job_writes_its_report_and_resumes(synthetic_lm, tmp_path, monkeypatch):
  cfg, pcfg = _cfg(), ProbeConfig(samples=2, max_tokens=3)
  result = job.evaluate(synthetic_lm, cfg, pcfg, str(tmp_path))
  folder = result["directory"]
  for name in (
    "metrics.json",
    "table.md",
    "curves_in_domain.png",
    "curves_out_of_domain.png",
    "displacement_in_domain.png",
    "rows_arithmetic_plain.jsonl",
    "rows_qa_truncated.jsonl",
  ):
    assert os.path.exists(os.path.join(folder, name)), name
  with open(os.path.join(folder, "metrics.json")) as f:
    stored = json.load(f)
  for group in ("in_domain", "out_of_domain"):
    for mode in job.MODES:
      m = stored["groups"][group][mode]
      assert m["trajectories"] == 4  # one domain per group, 2 problems x 2 samples
      assert 0.0 <= m["acc_at_k"] <= 1.0
  with open(os.path.join(folder, "rows_arithmetic_plain.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert len(rows) == 4 and all(len(r["cuts"]) == len(r["acc"]) == len(r["conf"]) for r in rows)

  def fail(*a, **k):
    raise AssertionError("a finished stage was decoded again")

  monkeypatch.setattr(job, "decode_domain", fail)  # a rerun reads every stage back
  again = job.evaluate(synthetic_lm, cfg, pcfg, str(tmp_path))
  assert again["groups"] == result["groups"]


def test_job_config_is_checked_with_field_names():
  with pytest.raises(ConfigError, match="domains"):
    job.job_config_from_dict({"domains": ("chess",)})
  with pytest.raises(ConfigError, match="samples"):
    job.job_config_from_dict({"samples": 0})
  with pytest.raises(ConfigError, match="reading"):
    job.probe_config_from_dict({"reading": "top20"})
  assert job.job_config_from_dict({"problems": 5}).problems == 5


@pytest.mark.parametrize(
  "sampling, match",
  [
    ({"temperature": 0}, r"^config\.spae\.sampling\.temperature: expected a finite number > 0\.0, got 0\.0$"),
    ({"temperature": float("nan")}, r"^config\.spae\.sampling\.temperature: expected a finite number >= 0\.0"),
    ({"top_p": 0.0}, r"^config\.spae\.sampling\.top_p: expected a finite number in \(0\.0, 1\.0\]"),
    ({"top_k": -1}, r"^config\.spae\.sampling\.top_k: expected an int >= 0, got -1$"),
  ],
)
def test_job_sampling_is_checked_at_its_path(sampling, match):
  with pytest.raises(ConfigError, match=match):
    job.job_config_from_dict({"sampling": sampling})


def test_job_sampling_is_never_greedy():
  """The trajectories are sampled: temperature 0 is refused where SamplingParams alone would take it."""
  with pytest.raises(ConfigError, match=r"^SPAEJobConfig\.sampling\.temperature: expected a finite number > 0\.0"):
    job.SPAEJobConfig(sampling=SamplingParams(temperature=0.0))
  got = job.job_config_from_dict({"sampling": {"top_p": 0.9}}).sampling
  assert got == SamplingParams(temperature=0.6, top_k=0, top_p=0.9)  # the others keep the job's defaults
