"""The RL job (issue 17): train a method from the start policy, then evaluate it on held-out problems (METHOD B3 at
k samples, in and out of domain); and the comparison of methods over seeds.

    summary = run(lm, rl_cfg, probe_cfg, eval_cfg, workdir)          # <workdir>/<key>/{train_state,tb,eval,...}
    table = compare(lm, rl_cfg, probe_cfg, eval_cfg, methods, seeds, workdir)

Every run folder is keyed by what it depends on (the configs and the start model), so a rerun resumes: training
from its latest checkpoint, the evaluation from its finished stages.
"""

from __future__ import annotations

import copy
import dataclasses
import os

from reprobe_jax.jobs import runs
from reprobe_jax.io.atomic import atomic_open
from reprobe_jax.errors import ConfigError
from reprobe_jax.eval.machine import describe
from reprobe_jax.jobs import rl_report as report
from reprobe_jax.rl.loop import RLConfig, signature, train_rl
from reprobe_jax.jobs.runs import Progress, no_progress
from reprobe_jax.jobs import spae as spae_job
from reprobe_jax.jobs.spae import SPAEJobConfig
from reprobe_jax.spae.potential import ProbeConfig

EVAL_MODES = ("plain",)


def run_folder(root: str, lm, cfg: RLConfig, pcfg: ProbeConfig, ecfg: SPAEJobConfig) -> str:
  return os.path.join(root, runs.run_key({**signature(lm, cfg, pcfg), "eval": dataclasses.asdict(ecfg)}))


def evaluate_policy(lm, params, ecfg: SPAEJobConfig, pcfg: ProbeConfig, workdir: str,
                    progress: Progress | None = None) -> dict:
  """METHOD B3's metrics of the policy with `params` on ecfg's held-out problems (plain decoding, every boundary
  probed): {'in_domain' / 'out_of_domain': TrajectoryMetrics JSON}; cached in workdir by the policy's fingerprint."""
  policy = copy.copy(lm)
  policy.params = params
  res = spae_job.evaluate(policy, ecfg, pcfg, workdir, progress=progress, modes=EVAL_MODES)
  return {g: v["plain"] for g, v in res["groups"].items()}


def run(lm, cfg: RLConfig, pcfg: ProbeConfig, ecfg: SPAEJobConfig, workdir: str, *,
        progress: Progress | None = None) -> dict:
  """Trains (or resumes) one method and evaluates the result; returns (and writes summary.json) the run's summary:
  the method, seed, evaluation metrics, per-step training metrics and mean stage times per step."""
  tick = progress or no_progress
  folder = run_folder(workdir, lm, cfg, pcfg, ecfg)
  os.makedirs(folder, exist_ok=True)
  runs.write_json(os.path.join(folder, "config.json"), {"rl": dataclasses.asdict(cfg),
                                                        "probe": dataclasses.asdict(pcfg),
                                                        "eval": dataclasses.asdict(ecfg)})
  label = f"train {cfg.advantage} s{cfg.seed}"
  result = train_rl(lm, cfg, pcfg, folder, on_step=lambda s, m: tick(label, s, cfg.steps))
  ev = evaluate_policy(lm, result.params, ecfg, pcfg, os.path.join(folder, "eval"), progress=progress)
  summary = {"method": cfg.advantage, "seed": cfg.seed, "steps": result.step, "machine": str(describe()),
             "eval": ev, "train": result.metrics, "stage_seconds": report.stage_seconds(result.metrics)}
  runs.write_json(os.path.join(folder, "summary.json"), summary)
  return summary


def compare(lm, cfg: RLConfig, pcfg: ProbeConfig, ecfg: SPAEJobConfig, methods, seeds, workdir: str, *,
            progress: Progress | None = None) -> dict:
  """Every method x seed from the same start policy, prompts and steps; the start policy evaluated once; writes
  <workdir>/compare_<key>/{table.md, summary.json, curves.png} and returns the summary."""
  methods, seeds = tuple(methods), tuple(seeds)
  if not methods or not seeds:
    raise ConfigError(f"compare: need at least one method and one seed, got methods={methods} seeds={seeds}")
  for m in methods:
    dataclasses.replace(cfg, advantage=m)  # an unknown name fails here, listing the known ones, before any work
  start = evaluate_policy(lm, lm.params, ecfg, pcfg, os.path.join(workdir, "start_eval"), progress=progress)
  per: dict[str, list[dict]] = {m: [] for m in methods}
  for seed in seeds:
    for m in methods:
      per[m].append(run(lm, dataclasses.replace(cfg, advantage=m, seed=seed), pcfg, ecfg, workdir,
                        progress=progress))
  out = os.path.join(workdir, "compare_" + runs.run_key({"rl": dataclasses.asdict(cfg), "methods": methods,
                                                          "seeds": seeds, "eval": dataclasses.asdict(ecfg)}))
  os.makedirs(out, exist_ok=True)
  table = report.compare_markdown(start, per, k=ecfg.samples)
  summary = {"machine": str(describe()), "start": start, "runs": per, "methods": methods, "seeds": seeds}
  runs.write_json(os.path.join(out, "summary.json"), summary)
  with atomic_open(os.path.join(out, "table.md")) as f:
    f.write(table)
  report.plot_curves(per, os.path.join(out, "curves.png"))
  summary["directory"] = out
  summary["table"] = table
  return summary

