"""Training entry point: `python train.py --config=configs/<job>.py [--config.a.b=value ...]`.

Jobs: target_synthetic (build the built-in default target LM and its report).
"""

from __future__ import annotations

import sys

from absl import app, logging
from ml_collections import config_flags

from reprobe_jax.errors import ReprobeError

_CONFIG = config_flags.DEFINE_config_file("config", "configs/target_synthetic.py", "Job configuration.")


def run_target_synthetic(config) -> None:
  from reprobe_jax.cli_progress import ProgressBars
  from reprobe_jax.synthetic.build import build, config_from_dict, load_report, report_markdown
  cfg = config_from_dict(config)
  with ProgressBars() as bars:
    out = build(cfg, config.workdir, progress=bars.update)
  report = load_report(out)
  print(f"\nBuilt {out} ({report['model_parameters'] / 1e6:.2f}M parameters; timings "
        + ", ".join(f"{k} {v:.0f}" for k, v in report.get("timings_s", {}).items()) + ")")
  print(report_markdown(report))


def build_target(config):
  """The target LM for a job: the built-in synthetic one (built or reused) or `config.target_path`."""
  from reprobe_jax.models import load_pretrained
  if "target_path" in config and config.target_path:
    return load_pretrained(config.target_path)
  from reprobe_jax.cli_progress import ProgressBars
  from reprobe_jax.synthetic.build import build, config_from_dict
  with ProgressBars() as bars:
    out = build(config_from_dict(config.target), config.target.workdir, progress=bars.update)
  return load_pretrained(f"{out}/model")


def run_reprobe(config) -> None:
  from reprobe_jax import pipeline
  from reprobe_jax.cli_progress import ProgressBars
  lm = build_target(config)
  cfg = pipeline.config_from_dict(config)
  with ProgressBars() as bars:
    probes = pipeline.train_probes(lm, cfg, config.workdir, progress=bars.update)
  print("\n| feature set | epochs | best val PR-AUC |\n|---|---|---|")
  for name, (_, _, _, history) in probes.items():
    print(f"| {name} | {len(history)} | {max(h['val_pr_auc'] for h in history):.3f} |")


JOBS = {"target_synthetic": run_target_synthetic, "reprobe": run_reprobe}


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax and grain log every checkpoint at INFO
  config = _CONFIG.value
  if config.job not in JOBS:
    print(f"error: config.job={config.job!r} is not one of {sorted(JOBS)}", file=sys.stderr)
    sys.exit(2)
  try:
    JOBS[config.job](config)
  except ReprobeError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
