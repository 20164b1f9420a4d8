"""The built-in default target: synthetic problems -> scripted traces -> tokenizer -> tiny LM -> export -> report.

`build(cfg)` runs the graph of stages problems -> model -> report into `<workdir>/<config hash>/`; a stage whose
output exists is skipped, so a rerun reuses the model, an interrupted build resumes (training restarts from its last
orbax checkpoint), and a changed config builds afresh in a new folder. Outputs:
  problems_train.jsonl, problems_eval.jsonl   the problems (reprobe_jax.tasks schema)
  model/                                      config.json + model.safetensors + tokenizer (HF format)
  samples_eval.jsonl                          the trained model's own samples at T=1.0 with exact labels
  report.json, report.md                      per family and format: step error rate, accuracy, length, ...
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import zlib
from typing import Mapping, Sequence

import numpy as np

from reprobe_jax.io.atomic import atomic_open, seal_folder, write_json, write_jsonl
from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.eval.bands import TARGET_COLUMNS
from reprobe_jax.eval.machine import describe
from reprobe_jax.models import LanguageModel, ModelConfig, load_pretrained
from reprobe_jax.io.readers import read_json, read_jsonl
from reprobe_jax.io.seal import check_folder
from reprobe_jax.synthetic.interrupt import interrupted_examples
from reprobe_jax.jobs.graph import Graph, GraphRun, Stage
from reprobe_jax.jobs.runs import Progress, Run, no_progress
from reprobe_jax.jobs.target_config import FAMILIES, SyntheticBuildConfig
from reprobe_jax.synthetic import evaluate
from reprobe_jax.synthetic.tokenizer import build_tokenizer, chat_prompt
from reprobe_jax.synthetic.train_lm import encode_examples, train_lm
from reprobe_jax.tasks import Problem, make_problems
from reprobe_jax.tasks.formats import MODES, user_prompt
from reprobe_jax.tasks.io import read_problems, write_problems
from reprobe_jax.tasks.traces import solve_many


def _problems(cfg: SyntheticBuildConfig):
  train, held = [], []
  weights = dict(cfg.family_weights)
  for family in FAMILIES:
    for d in cfg.difficulties:
      train += make_problems(
        family, int(round(cfg.train_problems_per_difficulty * weights.get(family, 1.0))), cfg.seed, d
      )
  seen = {p.question for p in train}
  per = -(-cfg.eval_problems_per_family // len(cfg.difficulties))
  for family in FAMILIES:
    fam = []
    for d in cfg.difficulties:  # a disjoint seed, and no question that training saw
      # Short arithmetic chains are a small space that training covers densely, so draw candidates generously.
      fam += [p for p in make_problems(family, 8 * per, cfg.seed + 1_000_003, d) if p.question not in seen][:per]
    held += fam[: cfg.eval_problems_per_family]
  return train, held


def thinking_subset(problems, fraction: float):
  """The problems (a `fraction` of them, chosen by a hash of the id, so the same ones for any order) that get a
  thinking-mode training trace."""
  if not 0.0 < fraction <= 1.0:
    raise ConfigError(f"thinking_fraction must be in (0, 1], found {fraction}")
  return [p for p in problems if zlib.crc32(p.id.encode()) % 10_000 < fraction * 10_000]


@dataclasses.dataclass(frozen=True)
class TargetJob:
  """What every stage of a build reads: its config, its folder (`<workdir>/<config key>`) and the progress
  callback."""

  cfg: SyntheticBuildConfig
  run: Run
  tick: Progress = no_progress


@dataclasses.dataclass(frozen=True)
class BuildProblems:
  """The problems the target is trained on and the held-out ones its report samples."""

  train: list[Problem]
  held: list[Problem]


def problems(job: TargetJob) -> BuildProblems:
  """problems_train.jsonl and problems_eval.jsonl, made where missing and read back."""
  run = job.run

  def make():
    train, held = _problems(job.cfg)
    write_problems(run.path("problems_train.jsonl"), train, seal=True)
    write_problems(run.path("problems_eval.jsonl"), held, seal=True)

  run.stage("problems_s", ["problems_train.jsonl", "problems_eval.jsonl"], make)
  return BuildProblems(
    read_problems(run.path("problems_train.jsonl"), sealed=True),
    read_problems(run.path("problems_eval.jsonl"), sealed=True),
  )


def model(job: TargetJob, problems: BuildProblems) -> str:
  """The trained target in Hugging Face format (`model/`), trained where missing (resuming from its last orbax
  checkpoint): scripted traces of the training problems, a tokenizer fitted to them, the tiny LM. Returns its
  folder."""
  cfg, run = job.cfg, job.run
  model_dir = run.path("model")
  if run.sealed("model/config.json"):
    check_folder(model_dir, "trained target")
    return model_dir
  with run.timed("data_s"):
    pairs, interrupted = [], []
    for mode in MODES:
      chosen = problems.train if mode == "line" else thinking_subset(problems.train, cfg.thinking_fraction)
      traces = solve_many(chosen, mode, cfg.seed, cfg.noise)
      pairs += [(user_prompt(p, mode), t.text) for p, t in zip(chosen, traces)]
      if mode == "thinking" and cfg.interrupt_share:
        interrupted = interrupted_examples(
          chosen,
          [t.text for t in traces],
          share=cfg.interrupt_share,
          seed=cfg.seed,
          guess_share=cfg.interrupt_guess_share,
        )
    tokenizer = build_tokenizer((chat_prompt_text(q) + a for q, a in pairs), cfg.vocab_size)
    examples = [(chat_prompt(tokenizer, q), a) for q, a in pairs]
    examples += [(chat_prompt(tokenizer, e.user) + e.prefix, e.answer + "}") for e in interrupted]
    weights = [cfg.prompt_loss_weight] * len(pairs) + [0.0] * len(interrupted)
    data = encode_examples(
      tokenizer,
      examples,
      cfg.buckets,
      prompt_weight=weights,
      response_weight=[1.0] * len(pairs) + [cfg.interrupt_loss_weight] * len(interrupted),
    )
  shape = cfg.model
  model_cfg = ModelConfig(
    family="llama",
    vocab_size=len(tokenizer),
    hidden_size=shape.hidden_size,
    intermediate_size=shape.intermediate_size,
    num_layers=shape.num_layers,
    num_heads=shape.num_heads,
    num_kv_heads=shape.num_kv_heads,
    head_dim=shape.hidden_size // shape.num_heads,
    max_position_embeddings=shape.max_position_embeddings,
    tie_word_embeddings=True,
    rms_norm_eps=1e-5,
    bos_token_id=tokenizer.bos_token_id,
    eos_token_ids=(tokenizer.eos_token_id,),
    pad_token_id=tokenizer.pad_token_id,
  )
  with run.timed("train_s"):
    lm, losses = train_lm(
      model_cfg,
      data,
      cfg.train,
      run.path("train"),
      on_step=lambda i, loss: job.tick(f"train (loss {loss:.3f})", i, cfg.train.steps),
    )
  write_json(run.path("train_losses.json"), losses, indent=None)
  lm.tokenizer = tokenizer
  lm.save_pretrained(model_dir)
  seal_folder(model_dir, last="config.json")  # its seal marks the stage done
  return model_dir


def report(job: TargetJob, problems: BuildProblems, model: str) -> str:
  """The target's own samples on the held-out problems (samples_eval.jsonl) and their report (report.json,
  report.md), made where missing. Returns the build folder."""
  cfg, run = job.cfg, job.run
  if not run.sealed("report.json"):
    lm = load_pretrained(model)
    with run.timed("eval_s"):
      records = _sample_all(lm, problems.held, cfg, job.tick)
      write_jsonl(run.path("samples_eval.jsonl"), records, seal=True)
    out = make_report(records, cfg, lm)
    out["timings_s"] = run.timings()
    with atomic_open(run.path("report.md")) as f:
      f.write(report_markdown(out))
    write_json(run.path("report.json"), out, indent=2, seal=True)  # last: its seal marks the stage done
  return run.directory


GRAPH = Graph(
  Stage("problems", problems),
  Stage("model", model, needs=("problems",)),
  Stage("report", report, needs=("problems", "model")),
)


def build(cfg: SyntheticBuildConfig, workdir: str, *, progress: Progress | None = None) -> str:
  """Runs (or resumes) the build; returns the output folder that holds `model/` and `report.json`."""
  run = Run(os.path.join(os.path.abspath(workdir), cfg.key()))
  write_json(run.path("build_config.json"), dataclasses.asdict(cfg), indent=2)
  return GraphRun(GRAPH, TargetJob(cfg, run, progress or no_progress))["report"]


def chat_prompt_text(user: str) -> str:
  """Tokenizer-free chat framing for the tokenizer's training corpus (the template's text, not its ids)."""
  return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def _sample_all(lm: LanguageModel, held, cfg: SyntheticBuildConfig, tick: Progress) -> list[dict]:
  total = len(held) * len(MODES)
  done = 0
  records = []
  limits = dict(cfg.max_new_tokens)
  for mode in MODES:
    for family in FAMILIES:
      problems = [p for p in held if p.domain == family]

      def on_batch(n):
        nonlocal done
        done += n
        tick("sample held-out problems", done, total)

      samples = evaluate.sample_responses(
        lm,
        problems,
        mode,
        temperature=cfg.eval_temperature,
        max_new_tokens=limits[mode],
        seed=cfg.seed,
        on_batch=on_batch,
      )
      records += evaluate.label_samples(problems, samples)
  return records


def make_report(records: list[dict], cfg: SyntheticBuildConfig, lm: LanguageModel) -> dict:
  groups = {}
  for mode in MODES:
    for family in FAMILIES:
      rs = [r for r in records if r["mode"] == mode and r["domain"] == family]
      groups[f"{family}/{mode}"] = evaluate.summarise_samples(rs)
  return {
    "config_key": cfg.key(),
    "model_parameters": lm.config.num_params,
    "temperature": cfg.eval_temperature,
    "machine": str(describe()),
    "groups": groups,
    "by_difficulty": evaluate.summarise_by_difficulty(records),
  }


def report_markdown(report: dict) -> str:
  cols = ["samples", *TARGET_COLUMNS, "right_to_wrong_rate"]
  lines = ["| family/format | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
  for name, g in report["groups"].items():
    cells = []
    for c in cols:
      v = g.get(c)
      cells.append("" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v)))
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  if report.get("by_difficulty"):
    lines += ["", difficulty_markdown([report["by_difficulty"]])]
  return "\n".join(lines) + "\n"


DIFFICULTY_COLUMNS = ("step_error_rate", "aligned_error_rate", "confident_error_share", "final_accuracy")


def difficulty_markdown(reports: Sequence[Mapping[str, Mapping]]) -> str:
  """The per-difficulty table of one or more builds' `summarise_by_difficulty` (mean +- sd over builds, with
  `samples` per build), rows in the first build's order."""
  lines = [
    "| family/format/difficulty | samples | " + " | ".join(DIFFICULTY_COLUMNS) + " |",
    "|" + "---|" * (len(DIFFICULTY_COLUMNS) + 2),
  ]
  for name in reports[0]:
    rows = [r[name] for r in reports if name in r]
    cells = [str(rows[0]["samples"])]
    for c in DIFFICULTY_COLUMNS:
      v = np.array([r.get(c, np.nan) for r in rows], float)
      v = v[np.isfinite(v)]
      cells.append("" if not v.size else f"{v.mean():.3f}" if v.size == 1 else f"{v.mean():.3f} +- {v.std(ddof=1):.3f}")
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def load_report(out: str) -> dict:
  """The build's report.json (`make_report`); DataFormatError naming the file when it is damaged."""
  path = os.path.join(out, "report.json")
  report = read_json(path, "target report", sealed=True)
  groups = report.get("groups")
  if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
    raise DataFormatError(f"{path}: target report needs a 'groups' object of objects, found {groups!r:.80}")
  if isinstance(report.get("model_parameters"), bool) or not isinstance(report.get("model_parameters"), int):
    raise DataFormatError(
      f"{path}: target report needs an integer 'model_parameters', found {report.get('model_parameters')!r:.80}"
    )
  return report


def read_samples(out: str) -> list[dict]:
  return [rec for _, rec in read_jsonl(os.path.join(out, "samples_eval.jsonl"), sealed=True)]


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m reprobe_jax.jobs.target <build folder> [...]`: the per-difficulty table of the builds' own
  held-out samples (`samples_eval.jsonl`), mean +- sd over the folders given (e.g. the three build seeds)."""
  ap = argparse.ArgumentParser(prog="python -m reprobe_jax.jobs.target", description=main.__doc__)
  ap.add_argument("builds", nargs="+", help="build folders (artifacts/target_synthetic/<key>)")
  args = ap.parse_args(argv)
  for out in args.builds:
    if not os.path.isfile(os.path.join(out, "samples_eval.jsonl")):
      raise SystemExit(f"{out}: no samples_eval.jsonl (not a finished build folder)")
  print(difficulty_markdown([evaluate.summarise_by_difficulty(read_samples(out)) for out in args.builds]), end="")


if __name__ == "__main__":
  main()
