"""Training entry point: `python train.py --config=configs/<job>.py [--config.a.b=value ...]`.

Jobs: target_synthetic (build the built-in default target LM and its report), reprobe (trajectories, labels,
features and probes on a target model, and the PRM baseline when `config.prm.enabled`).
"""

from __future__ import annotations

from absl import app
from ml_collections import config_flags

from reprobe_jax.cli import ProgressBars, parse_flags, reprobe_setup, run_job, workdir_of

_CONFIG = config_flags.DEFINE_config_file("config", "configs/target_synthetic.py", "Job configuration.")


def run_target_synthetic(config) -> None:
  from reprobe_jax.synthetic.build import build, config_from_dict, load_report, report_markdown
  cfg = config_from_dict(config)
  with ProgressBars() as bars:
    out = build(cfg, workdir_of(config), progress=bars.update)
  report = load_report(out)
  print(f"\nBuilt {out} ({report['model_parameters'] / 1e6:.2f}M parameters; timings "
        + ", ".join(f"{k} {v:.0f}" for k, v in report.get("timings_s", {}).items()) + ")")
  print(report_markdown(report))


def run_reprobe(config) -> None:
  from reprobe_jax import pipeline
  from reprobe_jax.prm.train import history as prm_history
  prm = pipeline.prm_config_from_dict(config.get("prm"))  # checked before the target is built
  lm, cfg, workdir = reprobe_setup(config)
  with ProgressBars() as bars:
    probes = pipeline.train_probes(lm, cfg, workdir, progress=bars.update)
    if prm is not None:
      pipeline.train_prm_stage(lm, cfg, prm, workdir, progress=bars.update)
  print("\n| feature set | epochs | best val PR-AUC |\n|---|---|---|")
  for name, (_, _, _, history) in probes.items():
    print(f"| {name} | {len(history)} | {max(h['val_pr_auc'] for h in history):.3f} |")
  if prm is not None:
    folder = pipeline.prm_folder(workdir, prm)
    history = prm_history(folder)
    print(f"| PRM baseline | {len(history)} | {max(h['val_pr_auc'] for h in history):.3f} |")
    print(f"\nPRM in {folder}/model (load_prm); TensorBoard: {folder}/train/tb")
  print(f"\nProbes in {workdir}/probe; TensorBoard: tensorboard --logdir {workdir}/probe")


def main(argv):
  del argv
  run_job(_CONFIG.value, {"target_synthetic": run_target_synthetic, "reprobe": run_reprobe})


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
