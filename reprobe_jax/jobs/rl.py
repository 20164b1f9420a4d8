"""The RL job (docs/method.md, "The RL loop"): train a method from the start policy, then evaluate it on held-out
problems (docs/method.md §B3 at k samples, in and out of domain); and the comparison of methods over seeds.

    summary = run(lm, rl_cfg, probe_cfg, eval_cfg, workdir)          # <workdir>/<key>/{train_state,tb,eval,...}
    table = compare(lm, rl_cfg, probe_cfg, eval_cfg, methods, seeds, workdir)

Each is a graph of stages: a run is policy -> evaluation -> summary; a comparison is start_eval (the start policy,
evaluated once) -> runs (every method x seed) -> report. Every run folder is keyed by what it depends on (the
configs and the start model), so a rerun resumes: training from its latest checkpoint, the evaluation from its
finished stages.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Sequence

from reprobe_jax.errors import ConfigError
from reprobe_jax.eval.machine import describe
from reprobe_jax.fields import check_seeds, plain, replace_fields
from reprobe_jax.io.atomic import atomic_open, write_json
from reprobe_jax.jobs import rl_report as report_lib
from reprobe_jax.jobs import spae
from reprobe_jax.jobs.graph import Graph, GraphRun, Stage
from reprobe_jax.jobs.runs import Progress, no_progress, run_key
from reprobe_jax.jobs.spae import SPAEJobConfig
from reprobe_jax.models import LanguageModel
from reprobe_jax.rl.loop import (
  RLConfig,
  RLResult,
  check_probe_room,
  check_run,
  config_key,
  data_fingerprint,
  default_mesh,
  signature,
  train_rl,
)
from reprobe_jax.spae.potential import ProbeConfig
from reprobe_jax.spae.prober import Prober
from reprobe_jax.trajectories import check_thinking_template, prompt_text

EVAL_MODES = ("plain",)


def rl_config_from_dict(d) -> RLConfig:
  """The CLI's `config.rl` section -> RLConfig, checked whole (ConfigError naming `config.rl.<field>`)."""
  return replace_fields(RLConfig(), plain(d), root="config.rl")


def check(lm, cfg: RLConfig, pcfg: ProbeConfig, ecfg: SPAEJobConfig, *, where: str = "") -> None:
  """Everything a run needs from the model and the configs, before it creates anything (ConfigError naming the
  field; `where` 'config' names the CLI's config.rl.* and config.eval.*): the training run (`check_run`), and room in
  the context for the held-out evaluation's longest prompt + its max_new_tokens + the probe's suffix and answer."""
  if not isinstance(ecfg, SPAEJobConfig):
    raise ConfigError(f"RL job: expected an SPAEJobConfig for the evaluation, got {type(ecfg).__name__}")
  check_run(lm, cfg, pcfg, mesh=default_mesh(lm), where=f"{where}.rl" if where else "")
  problems = [p for d in ecfg.run_domains for p in spae.problems_of(ecfg, d)]
  texts = [prompt_text(lm, p, "thinking", ecfg.few_shot) for p in problems]
  check_thinking_template(texts[0], "thinking", where=f"{where}.eval" if where else "SPAEJobConfig")
  field = f"{where}.eval.max_new_tokens" if where else "SPAEJobConfig.max_new_tokens"
  check_probe_room(Prober(lm, pcfg), lm.encode(texts), [p.answer for p in problems], ecfg.max_new_tokens, field)


def eval_config(cfg: RLConfig, ecfg: SPAEJobConfig) -> SPAEJobConfig:
  """The held-out evaluation of a run: `ecfg`, on a data run (`cfg.data`) over the same file's `ecfg.split` (the
  test split: problems the RL prompts, drawn from its train split, never hold) unless `ecfg` names a file itself."""
  if cfg.data.enabled and not ecfg.data.enabled:
    return dataclasses.replace(ecfg, data=cfg.data)
  return ecfg


def run_folder(root: str, lm, cfg: RLConfig, pcfg: ProbeConfig, ecfg: SPAEJobConfig) -> str:
  """`<root>/<key>`, the key a hash of the RL, probe and evaluation configs and of the start model (and on a data
  run of the file's train and evaluation problems)."""
  ecfg = eval_config(cfg, ecfg)
  return os.path.join(
    root,
    run_key({**signature(lm, cfg, pcfg), "eval": config_key(ecfg)}, data_fingerprint(cfg), spae.data_fingerprint(ecfg)),
  )


def evaluate_policy(
  lm, params, ecfg: SPAEJobConfig, pcfg: ProbeConfig, workdir: str, progress: Progress | None = None
) -> dict:
  """docs/method.md §B3's metrics of the policy with `params` on ecfg's held-out problems (plain decoding, every
  boundary probed): {'in_domain' / 'out_of_domain': TrajectoryMetrics JSON}; cached in workdir by the policy's
  fingerprint."""
  policy = copy.copy(lm)
  policy.params = params
  res = spae.evaluate(policy, ecfg, pcfg, workdir, progress=progress, modes=EVAL_MODES)
  return {g: v["plain"] for g, v in res["groups"].items()}


@dataclasses.dataclass(frozen=True)
class RLJob:
  """What every stage of one method's run reads: the start policy, the RL, probe and evaluation configs, the run
  folder and the progress callback."""

  lm: LanguageModel
  cfg: RLConfig
  pcfg: ProbeConfig
  ecfg: SPAEJobConfig
  folder: str
  tick: Progress = no_progress


def policy(job: RLJob) -> RLResult:
  """The trained policy (resumed from the folder's latest checkpoint)."""
  label = f"train {job.cfg.advantage} s{job.cfg.seed}"
  return train_rl(job.lm, job.cfg, job.pcfg, job.folder, on_step=lambda s, m: job.tick(label, s, job.cfg.steps))


def evaluation(job: RLJob, policy: RLResult) -> dict:
  """The trained policy's held-out metrics (`evaluate_policy`, cached in `<folder>/eval`)."""
  return evaluate_policy(job.lm, policy.params, job.ecfg, job.pcfg, os.path.join(job.folder, "eval"), progress=job.tick)


def summary(job: RLJob, policy: RLResult, evaluation: dict) -> dict:
  """The run's summary (also summary.json): the method, seed, evaluation metrics, per-step training metrics and
  the median stage times per step."""
  out = {
    "method": job.cfg.advantage,
    "seed": job.cfg.seed,
    "steps": policy.step,
    "machine": str(describe()),
    "eval": evaluation,
    "train": policy.metrics,
    "stage_seconds": report_lib.stage_seconds(policy.metrics),
  }
  write_json(os.path.join(job.folder, "summary.json"), out, seal=True)
  return out


GRAPH = Graph(
  Stage("policy", policy),
  Stage("evaluation", evaluation, needs=("policy",)),
  Stage("summary", summary, needs=("policy", "evaluation")),
)


def run(
  lm,
  cfg: RLConfig,
  pcfg: ProbeConfig,
  ecfg: SPAEJobConfig,
  workdir: str,
  *,
  progress: Progress | None = None,
  where: str = "",
) -> dict:
  """Trains (or resumes) one method and evaluates the result; returns (and writes summary.json) the run's summary.
  Every check (`check`, its errors named from `where`) runs before the run folder is made: a run refused writes
  nothing."""
  ecfg = eval_config(cfg, ecfg)
  check(lm, cfg, pcfg, ecfg, where=where)
  return _run(lm, cfg, pcfg, ecfg, workdir, progress)


def _run(lm, cfg: RLConfig, pcfg: ProbeConfig, ecfg: SPAEJobConfig, workdir: str, progress: Progress | None) -> dict:
  folder = run_folder(workdir, lm, cfg, pcfg, ecfg)
  os.makedirs(folder, exist_ok=True)
  write_json(
    os.path.join(folder, "config.json"),
    {"rl": config_key(cfg), "probe": dataclasses.asdict(pcfg), "eval": config_key(ecfg)},
    seal=True,
  )
  return GraphRun(GRAPH, RLJob(lm, cfg, pcfg, ecfg, folder, progress or no_progress))["summary"]


@dataclasses.dataclass(frozen=True)
class CompareJob:
  """What every stage of a comparison reads: the start policy, the configs every run shares, the methods and seeds,
  the workdir (the runs' folders are inside it) and the progress callback."""

  lm: LanguageModel
  cfg: RLConfig
  pcfg: ProbeConfig
  ecfg: SPAEJobConfig
  methods: tuple[str, ...]
  seeds: tuple[int, ...]
  workdir: str
  tick: Progress = no_progress


def start_eval(job: CompareJob) -> dict:
  """The start policy's held-out metrics (evaluated once for every method)."""
  return evaluate_policy(
    job.lm, job.lm.params, job.ecfg, job.pcfg, os.path.join(job.workdir, "start_eval"), progress=job.tick
  )


def runs(job: CompareJob) -> dict[str, list[dict]]:
  """{method: the summary of its run with each seed}, from the same start policy, prompts and steps."""
  per: dict[str, list[dict]] = {m: [] for m in job.methods}
  for seed in job.seeds:
    for m in job.methods:
      per[m].append(
        _run(  # every run was checked before the comparison started
          job.lm, dataclasses.replace(job.cfg, advantage=m, seed=seed), job.pcfg, job.ecfg, job.workdir, job.tick
        )
      )
  return per


def comparison(job: CompareJob, start_eval: dict, runs: dict[str, list[dict]]) -> dict:
  """Writes `<workdir>/compare_<key>/{table.md, summary.json, curves.png}` and returns the summary (with its
  folder and table)."""
  out = os.path.join(
    job.workdir,
    "compare_"
    + run_key(
      {
        **signature(job.lm, job.cfg, job.pcfg),  # the start model too: each world's comparison in its own folder
        "methods": job.methods,
        "seeds": job.seeds,
        "eval": config_key(job.ecfg),
      },
      data_fingerprint(job.cfg),
      spae.data_fingerprint(job.ecfg),
    ),
  )
  os.makedirs(out, exist_ok=True)
  table = report_lib.compare_markdown(start_eval, runs, k=job.ecfg.samples)
  result = {"machine": str(describe()), "start": start_eval, "runs": runs, "methods": job.methods, "seeds": job.seeds}
  write_json(os.path.join(out, "summary.json"), result)
  with atomic_open(os.path.join(out, "table.md")) as f:
    f.write(table)
  report_lib.plot_curves(runs, os.path.join(out, "curves.png"))
  return {**result, "directory": out, "table": table}


COMPARE_GRAPH = Graph(
  Stage("start_eval", start_eval), Stage("runs", runs), Stage("comparison", comparison, needs=("start_eval", "runs"))
)


def compare(
  lm,
  cfg: RLConfig,
  pcfg: ProbeConfig,
  ecfg: SPAEJobConfig,
  methods: Sequence[str],
  seeds: Sequence[int],
  workdir: str,
  *,
  progress: Progress | None = None,
  where: str = "",
) -> dict:
  """Every method x seed from the same start policy, prompts and steps; the start policy evaluated once; writes
  <workdir>/compare_<key>/{table.md, summary.json, curves.png} and returns the summary. Every run is checked
  (`check`) before any work: an unknown method, a bad seed or a run that cannot fit writes nothing."""
  methods, seeds = tuple(methods), tuple(check_seeds(seeds, "compare: seeds"))
  ecfg = eval_config(cfg, ecfg)
  if not methods or not seeds:
    raise ConfigError(f"compare: need at least one method and one seed, got methods={methods} seeds={seeds}")
  for m in methods:
    for seed in seeds:  # an unknown name fails here, listing the known ones
      check(lm, dataclasses.replace(cfg, advantage=m, seed=seed), pcfg, ecfg, where=where)
  job = CompareJob(lm, cfg, pcfg, ecfg, methods, seeds, workdir, progress or no_progress)
  return GraphRun(COMPARE_GRAPH, job)["comparison"]
