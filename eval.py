"""Evaluation entry point: `python eval.py --config=configs/<job>.py [--config.a.b=value ...]`.

Jobs: reprobe (PR-AUC of the probes against the uncertainty baselines; trains whatever is missing first).
"""

from __future__ import annotations

import os

from absl import app
from ml_collections import config_flags

from reprobe_jax.cli import ProgressBars, parse_flags, reprobe_setup, run_job

_CONFIG = config_flags.DEFINE_config_file("config", "configs/reprobe_synthetic.py", "Job configuration.")


def run_reprobe(config) -> None:
  from reprobe_jax import pipeline
  from reprobe_jax.report import table_markdown
  lm, cfg, workdir = reprobe_setup(config)
  with ProgressBars() as bars:
    metrics = pipeline.evaluate(lm, cfg, workdir, progress=bars.update)
  print("\nStep-level PR-AUC (positive = incorrect step):\n")
  print(table_markdown(metrics))
  timings = metrics.get("timings_s", {})
  if timings:
    print("Stage times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
  print(f"Wrote {os.path.join(workdir, 'metrics.json')}, table.md, pr_curves.png; TensorBoard: {workdir}/probe")


def main(argv):
  del argv
  run_job(_CONFIG.value, {"reprobe": run_reprobe})


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
