"""The CLI layer shared by train.py and eval.py: progress bars, the target model, one-line errors."""

from __future__ import annotations

import sys
from typing import Callable

from absl import logging
from tqdm.auto import tqdm

from reprobe_jax.errors import ReprobeError


class ProgressBars:
  """Context manager; `update(stage, done, total)` moves the bar of that stage (the label's first word)."""

  def __init__(self):
    self.bars: dict[str, tqdm] = {}

  def update(self, stage: str, done: int, total: int) -> None:
    key = stage.split(" ")[0]
    bar = self.bars.get(key)
    if bar is None:
      bar = self.bars[key] = tqdm(total=total, desc=key, dynamic_ncols=True)
    bar.set_description(stage, refresh=False)
    bar.update(done - bar.n)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    for bar in self.bars.values():
      bar.close()


def build_target(config):
  """The target LM of a job: `config.target_path` if set, else the built-in synthetic one (built or reused)."""
  from reprobe_jax.models import load_pretrained
  if config.get("target_path"):
    return load_pretrained(config.target_path)
  from reprobe_jax.synthetic.build import build, config_from_dict, load_report, report_markdown
  with ProgressBars() as bars:
    out = build(config_from_dict(config.target), config.target.workdir, progress=bars.update)
  print(f"\nTarget model {out}/model, its own samples on held-out problems (T=1.0):\n")
  print(report_markdown(load_report(out)))
  return load_pretrained(f"{out}/model")


def run_dir(config, lm) -> str:
  """`<config.workdir>/<hash>`: one folder per (job config, target model, problems and prompts), so a rebuilt
  target, a changed config or a changed task generator starts afresh while a rerun of the same one resumes and
  reuses its cached stages (`pipeline.run_folder`)."""
  from reprobe_jax import pipeline
  return pipeline.run_folder(config.workdir, lm, pipeline.config_from_dict(config))


def reprobe_setup(config):
  """(target model, ReprobeConfig, run folder) of a reprobe job: the common start of its train and eval runs. The
  config is checked before the target is built, so a bad setting fails in a second, not after a build."""
  from reprobe_jax import pipeline
  cfg = pipeline.config_from_dict(config)
  lm = build_target(config)
  return lm, cfg, pipeline.run_folder(config.workdir, lm, cfg)


def run_job(config, jobs: dict[str, Callable]) -> None:
  """Runs `jobs[config.job]`; a ReprobeError is printed in one line and exits 1."""
  logging.set_verbosity(logging.WARNING)  # orbax and grain log every checkpoint at INFO
  if config.job not in jobs:
    print(f"error: config.job={config.job!r} is not one of {sorted(jobs)}", file=sys.stderr)
    sys.exit(2)
  try:
    jobs[config.job](config)
  except ReprobeError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
