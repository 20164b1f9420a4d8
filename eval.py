"""Evaluation entry point: `python eval.py --config=configs/<job>.py [--config.a.b=value ...]`.

Jobs: reprobe (PR-AUC of the probes against the uncertainty baselines; trains whatever is missing first).
"""

from __future__ import annotations

import os
import sys

from absl import app, logging
from ml_collections import config_flags

from reprobe_jax.errors import ReprobeError

_CONFIG = config_flags.DEFINE_config_file("config", "configs/reprobe_synthetic.py", "Job configuration.")


def run_reprobe(config) -> None:
  from reprobe_jax import pipeline
  from reprobe_jax.cli_progress import ProgressBars
  from train import build_target
  lm = build_target(config)
  with ProgressBars() as bars:
    metrics = pipeline.evaluate(lm, pipeline.config_from_dict(config), config.workdir, progress=bars.update)
  print("\nStep-level PR-AUC (positive = incorrect step):\n")
  print(pipeline.table_markdown(metrics))
  print(f"Wrote {os.path.join(config.workdir, 'metrics.json')}, table.md and pr_curves.png")


JOBS = {"reprobe": run_reprobe}


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
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
