"""Training entry point: `python train.py --config=configs/<job>.py [--config.a.b=value ...]`.

Jobs: target_synthetic (build the built-in default target LM and its report), reprobe (trajectories, labels,
features and probes on a target model, and the PRM baseline when `config.prm.enabled`), rl (one RL method from the
target's thinking mode, then its held-out evaluation), rl_compare (GRPO, DAPO, RF-B and SPAE over seeds).
"""

from __future__ import annotations

import os

from absl import app
from ml_collections import config_flags

from reprobe_jax.jobs import reprobe, rl, target, target_config
from reprobe_jax.eval.bands import BandFile, over_seeds
from reprobe_jax.jobs.bands import band_key, check_seeds
from reprobe_jax.jobs.cli import (
  ProgressBars,
  build_target,
  job_section,
  parse_flags,
  reprobe_setup,
  run_job,
  workdir_of,
)
from reprobe_jax.jobs.reprobe_config import prm_config_from_dict, prm_folder
from reprobe_jax.jobs.spae import job_config_from_dict, probe_config_from_dict
from reprobe_jax.prm.train import history as prm_history

_CONFIG = config_flags.DEFINE_config_file("config", "configs/target_synthetic.py", "Job configuration.")


def run_target_synthetic(config) -> None:
  cfg = target_config.config_from_dict(config)
  with ProgressBars() as bars:
    out = target.build(cfg, workdir_of(config), progress=bars.update)
  report = target.load_report(out)
  print(
    f"\nBuilt {out} ({report['model_parameters'] / 1e6:.2f}M parameters; timings "
    + ", ".join(f"{k} {v:.0f}" for k, v in report.get("timings_s", {}).items())
    + ")"
  )
  print(target.report_markdown(report))


def run_reprobe(config) -> None:
  prm = prm_config_from_dict(config.get("prm"))  # checked before the target is built
  lm, cfg, workdir = reprobe_setup(config)
  with ProgressBars() as bars:
    run = reprobe.start(lm, cfg, workdir, prm=prm, progress=bars.update)
    probes = run["probes"]
    run["prm"]
  print("\n| feature set | epochs | best val PR-AUC |\n|---|---|---|")
  for name, probe in probes.items():
    print(f"| {name} | {len(probe.history)} | {probe.best_val_pr_auc:.3f} |")
  if prm is not None:
    folder = prm_folder(workdir, prm)
    history = prm_history(folder)
    print(f"| PRM baseline | {len(history)} | {max(h['val_pr_auc'] for h in history):.3f} |")
    print(f"\nPRM in {folder}/model (load_prm); TensorBoard: {folder}/train/tb")
  print(f"\nProbes in {workdir}/probe; TensorBoard: tensorboard --logdir {workdir}/probe")


def _rl_setup(config):
  """(start policy, RLConfig, ProbeConfig, eval SPAEJobConfig): every field checked before the target is built."""
  rl_cfg = job_section(config, "rl", rl.rl_config_from_dict, ("advantage", "seed", "data"))
  pcfg = probe_config_from_dict(config.get("probe", {}))
  ecfg = job_section(config, "eval", job_config_from_dict, ("data",))  # a data run evaluates on its test split
  return build_target(config), rl_cfg, pcfg, ecfg


def run_rl(config) -> None:
  lm, rl_cfg, pcfg, ecfg = _rl_setup(config)
  with ProgressBars() as bars:
    s = rl.run(lm, rl_cfg, pcfg, ecfg, workdir_of(config), progress=bars.update, where="config")
  folder = rl.run_folder(workdir_of(config), lm, rl_cfg, pcfg, ecfg)
  print(
    f"\n{rl_cfg.advantage}, seed {rl_cfg.seed}, {s['steps']} steps; seconds per step: "
    + ", ".join(f"{k} {v:.2f}" for k, v in s["stage_seconds"].items())
  )
  print("| group | Acc@k | Len@k | checking | R2W |\n|---|---|---|---|---|")
  for g, m in s["eval"].items():
    cell = lambda x, scale=1.0: "n/a" if x is None else f"{scale * x:.1f}"
    print(
      f"| {g} | {cell(m['acc_at_k'], 100)} | {cell(m['len_at_k'])} | {cell(m['checking_tokens'])} | "
      f"{cell(m['r2w'], 100)} |"
    )
  print(f"\nWrote {folder}/summary.json; TensorBoard: tensorboard --logdir {folder}/tb")


def run_rl_compare(config) -> None:
  seeds = check_seeds(config.get("seeds"))
  lm, rl_cfg, pcfg, ecfg = _rl_setup(config)
  with ProgressBars() as bars:
    s = rl.compare(
      lm, rl_cfg, pcfg, ecfg, config.methods, seeds, workdir_of(config), progress=bars.update, where="config"
    )
  print("\n" + s["table"])
  # every number of every method's runs over the seeds, as the other seeds jobs' band files
  per_seed = [{m: s["runs"][m][i] for m in s["methods"]} for i in range(len(seeds))]
  band_file = BandFile(
    job="rl_compare", seeds=seeds, machine=s["machine"], config_key=band_key(config), bands=over_seeds(per_seed)
  )
  band_file.save(os.path.join(s["directory"], "bands.json"))
  shipped = f" (copy it to {config.bands} to make it the shipped bands)" if config.get("bands") else ""
  print(f"Wrote {s['directory']}/table.md, summary.json, curves.png, bands.json{shipped}")


def main(argv):
  del argv
  run_job(
    _CONFIG.value,
    {"target_synthetic": run_target_synthetic, "reprobe": run_reprobe, "rl": run_rl, "rl_compare": run_rl_compare},
  )


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
