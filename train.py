"""Training entry point: `python train.py --config=configs/<job>.py [--config.a.b=value ...]`.

Jobs: target_synthetic (build the built-in default target LM and its report).
"""

from __future__ import annotations

import sys

from absl import app
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


JOBS = {"target_synthetic": run_target_synthetic}


def main(argv):
  del argv
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
