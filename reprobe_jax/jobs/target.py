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
import hashlib
import json
import os
import zlib
from typing import Mapping, Sequence

import numpy as np

from reprobe_jax.io.atomic import atomic_open, write_json, write_jsonl
from reprobe_jax.fields import Int, OneOf, Pairs, Real, Seq, check_fields, field_name, plain, replace_fields, \
    sorted_pairs
from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.eval.machine import describe
from reprobe_jax.models import LanguageModel, ModelConfig, load_pretrained
from reprobe_jax.io.readers import read_json, read_jsonl
from reprobe_jax.synthetic.interrupt import interrupted_examples
from reprobe_jax.jobs.graph import Graph, GraphRun, Stage
from reprobe_jax.jobs.runs import Progress, Run, no_progress, run_key
from reprobe_jax.synthetic import evaluate
from reprobe_jax.synthetic.tokenizer import build_tokenizer, chat_prompt
from reprobe_jax.synthetic.train_lm import TrainLMConfig, encode_examples, train_lm
from reprobe_jax.tasks import DIFFICULTIES, Problem, make_problems
from reprobe_jax.tasks.formats import MODES, user_prompt
from reprobe_jax.tasks.io import read_problems, write_problems
from reprobe_jax.tasks.traces import TraceNoise, solve_many

FAMILIES = ("arithmetic", "planning", "qa")


@dataclasses.dataclass(frozen=True)
class TinyLMShape:
  hidden_size: int = 192
  intermediate_size: int = 512
  num_layers: int = 4
  num_heads: int = 4
  num_kv_heads: int = 2
  max_position_embeddings: int = 1024

  def __post_init__(self):
    check_fields(self, {name: Int(1) for name in (f.name for f in dataclasses.fields(self))})
    head_dim, rest = divmod(self.hidden_size, self.num_heads)
    if rest or head_dim % 2:  # rotary embeddings rotate pairs of a head's dimensions
      raise ConfigError(f"{field_name(self, 'num_heads')}: expected a divisor of hidden_size={self.hidden_size} "
                        f"that leaves an even head size, got {self.num_heads}")
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(f"{field_name(self, 'num_kv_heads')}: expected a divisor of num_heads={self.num_heads}, "
                        f"got {self.num_kv_heads}")


# What TrainLMConfig's fields must be (checked where the build config holds one).
TRAIN_LM_RULES = {"steps": Int(1), "batch_size": Int(1), "seed": Int(0), "checkpoint_every": Int(1)}


@dataclasses.dataclass(frozen=True)
class SyntheticBuildConfig:
  """Everything that decides the built model; its hash names the output folder."""

  seed: int = 0
  train_problems_per_difficulty: int = 600  # per difficulty (1, 2, 3), times the family's weight
  # In-domain arithmetic gets more of the budget than the out-of-domain families (whose prompts are also longer).
  family_weights: tuple[tuple[str, float], ...] = (("arithmetic", 2.0), ("planning", 1.0), ("qa", 1.0))
  prompt_loss_weight: float = 0.2
  # Share of the training problems that also get a thinking-mode trace (every problem gets a line-mode one). The
  # in-domain line-mode skill is what the quality band measures and it needs most of the budget; re-checking is
  # learned from far fewer thinking traces.
  thinking_fraction: float = 1.0
  # Share of the thinking traces that also teach answering when interrupted at a boundary (the SPAE target's
  # skill, synthetic/interrupt.py); 0 = none (and the field stays out of the config's hash, so older builds keep
  # their folders). interrupt_guess_share: how often an unfinished chain answers another problem's answer instead
  # of its running value.
  interrupt_share: float = 0.0
  interrupt_guess_share: float = 0.25
  interrupt_loss_weight: float = 4.0  # the weight of an interrupted answer's tokens in the loss (a trace's: 1)
  eval_problems_per_family: int = 64
  difficulties: tuple[int, ...] = (1, 2, 3)
  noise: TraceNoise = TraceNoise()
  vocab_size: int = 1024
  model: TinyLMShape = TinyLMShape()
  train: TrainLMConfig = TrainLMConfig()
  buckets: tuple[int, ...] = (128, 192, 256, 384)
  eval_temperature: float = 1.0
  max_new_tokens: tuple[tuple[str, int], ...] = (("line", 96), ("thinking", 192))

  def __post_init__(self):
    check_fields(self, {"seed": Int(0), "train_problems_per_difficulty": Int(1),
                        "family_weights": Pairs(OneOf(FAMILIES), Real(0.0)), "prompt_loss_weight": Real(0.0),
                        "thinking_fraction": Real(0.0, 1.0, low_open=True), "eval_problems_per_family": Int(1),
                        "interrupt_share": Real(0.0, 1.0), "interrupt_guess_share": Real(0.0, 1.0),
                        "interrupt_loss_weight": Real(0.0, low_open=True),
                        "difficulties": Seq(OneOf(DIFFICULTIES)), "vocab_size": Int(1), "buckets": Seq(Int(1)),
                        "eval_temperature": Real(0.0), "max_new_tokens": Pairs(OneOf(MODES), Int(1), MODES)})
    for name, cls in (("noise", TraceNoise), ("model", TinyLMShape), ("train", TrainLMConfig)):
      if not isinstance(getattr(self, name), cls):
        raise ConfigError(f"{field_name(self, name)}: expected a {cls.__name__}, got {getattr(self, name)!r}")
    check_fields(self.train, TRAIN_LM_RULES, where=field_name(self, "train"))

  def key(self) -> str:
    """Hash of the config and of what the task code makes from it (a changed generator, prompt or solver
    rebuilds instead of reusing a model trained on other data)."""
    return run_key(without_unused_interrupts(dataclasses.asdict(self)), _task_code_fingerprint(self))


INTERRUPT_FIELDS = ("interrupt_share", "interrupt_guess_share", "interrupt_loss_weight")


def without_unused_interrupts(d: Mapping) -> dict:
  """A build config's fields (a dict) without the interrupted-thinking ones when they are off (interrupt_share 0):
  they were added later, so a build without interruptions keeps the key it had before, and so do the bands made
  with it (`reprobe_jax.jobs.bands.band_key`)."""
  d = dict(d)
  if not d.get("interrupt_share"):
    for name in INTERRUPT_FIELDS:
      d.pop(name, None)
  return d


def _task_code_fingerprint(cfg: "SyntheticBuildConfig") -> str:
  """A few problems of every family and difficulty, their prompts and noisy traces in both formats, hashed."""
  h = hashlib.sha256()
  for family in FAMILIES:
    for d in cfg.difficulties:
      problems = make_problems(family, 4, cfg.seed, d)
      for mode in MODES:
        for p, t in zip(problems, solve_many(problems, mode, cfg.seed, cfg.noise)):
          h.update(json.dumps([p.to_json(), user_prompt(p, mode), t.text]).encode())
  return h.hexdigest()


def config_from_dict(c, root: str = "config") -> SyntheticBuildConfig:
  """The CLI's ml_collections ConfigDict -> the frozen build config (library code never sees a ConfigDict),
  checked whole; errors name fields under `root` (e.g. 'config.target' when a ReProbe job builds its target)."""
  d = plain(c)
  d.pop("job", None)
  d.pop("workdir", None)
  train = d.pop("train", {})
  if isinstance(train, Mapping):  # the training seed follows the build's seed unless the config sets it
    train = {"seed": d.get("seed", SyntheticBuildConfig.seed), **train}
  return replace_fields(SyntheticBuildConfig(), {**d, "train": train},
                        convert={"family_weights": sorted_pairs, "max_new_tokens": sorted_pairs}, root=root)


def _problems(cfg: SyntheticBuildConfig):
  train, held = [], []
  weights = dict(cfg.family_weights)
  for family in FAMILIES:
    for d in cfg.difficulties:
      train += make_problems(family, int(round(cfg.train_problems_per_difficulty * weights.get(family, 1.0))),
                             cfg.seed, d)
  seen = {p.question for p in train}
  per = -(-cfg.eval_problems_per_family // len(cfg.difficulties))
  for family in FAMILIES:
    fam = []
    for d in cfg.difficulties:  # a disjoint seed, and no question that training saw
      # Short arithmetic chains are a small space that training covers densely, so draw candidates generously.
      fam += [p for p in make_problems(family, 8 * per, cfg.seed + 1_000_003, d) if p.question not in seen][:per]
    held += fam[:cfg.eval_problems_per_family]
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
    write_problems(run.path("problems_train.jsonl"), train)
    write_problems(run.path("problems_eval.jsonl"), held)

  run.stage("problems_s", ["problems_train.jsonl", "problems_eval.jsonl"], make)
  return BuildProblems(read_problems(run.path("problems_train.jsonl")), read_problems(run.path("problems_eval.jsonl")))


def model(job: TargetJob, problems: BuildProblems) -> str:
  """The trained target in Hugging Face format (`model/`), trained where missing (resuming from its last orbax
  checkpoint): scripted traces of the training problems, a tokenizer fitted to them, the tiny LM. Returns its
  folder."""
  cfg, run = job.cfg, job.run
  model_dir = run.path("model")
  if run.exists("model/config.json"):
    return model_dir
  with run.timed("data_s"):
    pairs, interrupted = [], []
    for mode in MODES:
      chosen = problems.train if mode == "line" else thinking_subset(problems.train, cfg.thinking_fraction)
      traces = solve_many(chosen, mode, cfg.seed, cfg.noise)
      pairs += [(user_prompt(p, mode), t.text) for p, t in zip(chosen, traces)]
      if mode == "thinking" and cfg.interrupt_share:
        interrupted = interrupted_examples(chosen, [t.text for t in traces], share=cfg.interrupt_share,
                                           seed=cfg.seed, guess_share=cfg.interrupt_guess_share)
    tokenizer = build_tokenizer((chat_prompt_text(q) + a for q, a in pairs), cfg.vocab_size)
    examples = [(chat_prompt(tokenizer, q), a) for q, a in pairs]
    examples += [(chat_prompt(tokenizer, e.user) + e.prefix, e.answer + "}") for e in interrupted]
    weights = [cfg.prompt_loss_weight] * len(pairs) + [0.0] * len(interrupted)
    data = encode_examples(tokenizer, examples, cfg.buckets, prompt_weight=weights,
                           response_weight=[1.0] * len(pairs) + [cfg.interrupt_loss_weight] * len(interrupted))
  shape = cfg.model
  model_cfg = ModelConfig(
      family="llama", vocab_size=len(tokenizer), hidden_size=shape.hidden_size,
      intermediate_size=shape.intermediate_size, num_layers=shape.num_layers, num_heads=shape.num_heads,
      num_kv_heads=shape.num_kv_heads, head_dim=shape.hidden_size // shape.num_heads,
      max_position_embeddings=shape.max_position_embeddings, tie_word_embeddings=True,
      rms_norm_eps=1e-5, bos_token_id=tokenizer.bos_token_id, eos_token_ids=(tokenizer.eos_token_id,),
      pad_token_id=tokenizer.pad_token_id)
  with run.timed("train_s"):
    lm, losses = train_lm(model_cfg, data, cfg.train, run.path("train"),
                          on_step=lambda i, loss: job.tick(f"train (loss {loss:.3f})", i, cfg.train.steps))
  write_json(run.path("train_losses.json"), losses, indent=None)
  lm.tokenizer = tokenizer
  lm.save_pretrained(model_dir)
  return model_dir


def report(job: TargetJob, problems: BuildProblems, model: str) -> str:
  """The target's own samples on the held-out problems (samples_eval.jsonl) and their report (report.json,
  report.md), made where missing. Returns the build folder."""
  cfg, run = job.cfg, job.run
  if not run.exists("report.json"):
    lm = load_pretrained(model)
    with run.timed("eval_s"):
      records = _sample_all(lm, problems.held, cfg, job.tick)
      write_jsonl(run.path("samples_eval.jsonl"), records)
    out = make_report(records, cfg, lm)
    out["timings_s"] = run.timings()
    write_json(run.path("report.json"), out, indent=2)
    with atomic_open(run.path("report.md")) as f:
      f.write(report_markdown(out))
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

      samples = evaluate.sample_responses(lm, problems, mode, temperature=cfg.eval_temperature,
                                          max_new_tokens=limits[mode], seed=cfg.seed, on_batch=on_batch)
      records += evaluate.label_samples(problems, samples)
  return records


def make_report(records: list[dict], cfg: SyntheticBuildConfig, lm: LanguageModel) -> dict:
  groups = {}
  for mode in MODES:
    for family in FAMILIES:
      rs = [r for r in records if r["mode"] == mode and r["domain"] == family]
      groups[f"{family}/{mode}"] = evaluate.summarise_samples(rs)
  return {"config_key": cfg.key(), "model_parameters": lm.config.num_params, "temperature": cfg.eval_temperature,
          "machine": str(describe()), "groups": groups,
          "by_difficulty": evaluate.summarise_by_difficulty(records)}


def report_markdown(report: dict) -> str:
  cols = ["samples", "step_error_rate", "aligned_error_rate", "confident_error_share", "final_accuracy",
          "mean_tokens", "recheck_after_answer_share", "right_to_wrong_rate"]
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
  lines = ["| family/format/difficulty | samples | " + " | ".join(DIFFICULTY_COLUMNS) + " |",
           "|" + "---|" * (len(DIFFICULTY_COLUMNS) + 2)]
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
  report = read_json(path, "target report")
  groups = report.get("groups")
  if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
    raise DataFormatError(f"{path}: target report needs a 'groups' object of objects, found {groups!r:.80}")
  if isinstance(report.get("model_parameters"), bool) or not isinstance(report.get("model_parameters"), int):
    raise DataFormatError(f"{path}: target report needs an integer 'model_parameters', found "
                          f"{report.get('model_parameters')!r:.80}")
  return report


def read_samples(out: str) -> list[dict]:
  return [rec for _, rec in read_jsonl(os.path.join(out, "samples_eval.jsonl"))]


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
