"""The user's data for every job (docs/own-data.md): `DataConfig` names a file and its format, `load_data` reads it
(`tasks.datasets.read_dataset`, every record checked first) and splits it into train / val / test over grain data
sources with a deterministic shuffle, and `PromptOrder` is the endless shuffled order an RL run draws its prompts
from, resumable at any position.

Splits are by problem: every labelled solution of a problem lands in the split of its problem, so no question is
seen in training and in test. The same config always gives the same splits, on any machine.
"""

from __future__ import annotations

import dataclasses
import os

import grain

from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.fields import SEED, Int, OneOf, Real, check_fields, field_name
from reprobe_jax.tasks.base import Problem
from reprobe_jax.tasks.dataset_records import LabelledSolution, MathProblem
from reprobe_jax.tasks.datasets import FORMATS, read_dataset
from reprobe_jax.tasks.hf_source import is_hf_source
from reprobe_jax.tasks.math_task import MathTask

SPLITS = ("train", "val", "test")
STEP_LABELLED = ("processbench", "prm800k")  # formats whose records are solutions with step labels
DATA_TASK = MathTask.name  # the task of every data file's problems (`MathProblem.to_problem`)


def no_data_file(field: str) -> ConfigError:
  """The error of a config that asks for the data file's task (DATA_TASK) but names no file: what to name."""
  return ConfigError(
    f"{field}: {DATA_TASK!r} is the task of a data file, and config.data.path names none: name a file with "
    f"--config.data.path=<file> --config.data.format=<{' | '.join(FORMATS.names())}>"
  )


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """A data file for a job. path: the file ('' = the built-in synthetic world), or a Hugging Face `datasets` folder
  or hub id in the local cache, `::split` to pick a split (`tasks.hf_source`, with the `hf` extra); format: how its
  records read, one of gsm8k | math | jsonl | processbench | prm800k; limit: use the first
  `limit` problems of the shuffled file (0: all); seed: the shuffle's; val / test: the fractions of the problems in
  those splits (the rest is train; 0 leaves a split empty, and a job that needs it refuses to start)."""

  path: str = ""
  format: str = "jsonl"
  limit: int = 0
  seed: int = 0
  val: float = 0.1
  test: float = 0.2

  def __post_init__(self):
    check_fields(
      self,
      {
        "format": OneOf(tuple(FORMATS.names())),
        "limit": Int(0),
        "seed": SEED,
        "val": Real(0.0, 1.0),
        "test": Real(0.0, 1.0),
      },
    )
    if not isinstance(self.path, str):
      raise ConfigError(f"{field_name(self, 'path')}: expected a path (a string), got {self.path!r}")
    if self.val + self.test > 1.0:
      raise ConfigError(
        f"{field_name(self, 'val')} + {field_name(self, 'test')} = {self.val + self.test:g}: the split fractions "
        "must leave room for train (at most 1 together)"
      )

  @property
  def enabled(self) -> bool:
    """Whether a file is named (else the job runs on the synthetic world)."""
    return bool(self.path)

  @property
  def step_labelled(self) -> bool:
    """Whether the file holds solutions with step labels (reader mode: docs/own-data.md)."""
    return self.format in STEP_LABELLED


@dataclasses.dataclass(frozen=True)
class DataSplits:
  """What `load_data` gives: per split, the problems (of the math task) and the labelled solutions of those
  problems (empty unless the format is step-labelled), and the file it came from."""

  path: str
  format: str
  problems: dict[str, tuple[Problem, ...]]
  solutions: dict[str, tuple[LabelledSolution, ...]]

  def ids(self) -> dict[str, list[str]]:
    """The problem ids of each split (what a run stores to say which problems it used)."""
    return {s: [p.id for p in self.problems[s]] for s in SPLITS}


def load_data(cfg: DataConfig) -> DataSplits:
  """Reads `cfg.path` (every record checked, DataFormatError naming the file, line and field on any defect) and
  splits its problems: shuffled by grain with `cfg.seed`, the first `cfg.limit` kept, then test, val and train in
  that order of the shuffled list (so growing `limit` keeps a problem in its split only when the fractions allow).
  ConfigError when no file is named or a split the fractions ask for would be empty."""
  if not cfg.enabled:
    raise ConfigError(f"{field_name(cfg, 'path')}: no data file named")
  if not os.path.exists(cfg.path) and not is_hf_source(cfg.path):  # a hub id or `folder::split` is no local path
    raise DataFormatError(f"{cfg.path}: no such file or folder ({field_name(cfg, 'path')})")
  data = read_dataset(cfg.path, cfg.format)
  problems = {p.id: p.to_problem() for p in data.problems}
  by_problem: dict[str, list[LabelledSolution]] = {}
  for s in data.solutions:
    by_problem.setdefault(s.problem_id, []).append(s)
    if s.problem_id not in problems:  # ProcessBench ships no reference answers: the solution's problem, unanswered
      problems[s.problem_id] = _unanswered(s)
  ids = sorted(problems)
  order = grain.MapDataset.source(ids).shuffle(seed=cfg.seed)
  chosen = [order[i] for i in range(len(order))][: cfg.limit or None]
  n = len(chosen)
  n_test, n_val = _count(cfg.test, n), _count(cfg.val, n)
  parts = {"test": chosen[:n_test], "val": chosen[n_test : n_test + n_val], "train": chosen[n_test + n_val :]}
  for split, fraction in (("test", cfg.test), ("val", cfg.val), ("train", 1.0 - cfg.val - cfg.test)):
    if fraction > 0 and not parts[split]:
      raise ConfigError(
        f"{cfg.path}: {n} problems leave the {split} split empty ({field_name(cfg, 'limit')}={cfg.limit}, "
        f"val={cfg.val:g}, test={cfg.test:g}); use more problems or other fractions"
      )
  return DataSplits(
    path=cfg.path,
    format=cfg.format,
    problems={s: tuple(problems[i] for i in parts[s]) for s in SPLITS},
    solutions={s: tuple(x for i in parts[s] for x in by_problem.get(i, ())) for s in SPLITS},
  )


def _count(fraction: float, n: int) -> int:
  """Problems in a split of `fraction` of n: rounded, and at least one when the fraction is positive and n > 1."""
  if fraction <= 0 or n == 0:
    return 0
  return max(1, min(n - 1, round(fraction * n))) if n > 1 else 0


def _unanswered(solution: LabelledSolution) -> Problem:
  """The problem of a solution whose file gives no reference answer (ProcessBench): its outcome comes from the
  file's `final_answer_correct`, never from an answer check, so the answer field holds a marker no answer equals."""
  record = MathProblem(solution.problem_id, solution.question, NO_ANSWER, None, solution.source, {})
  return record.to_problem()


NO_ANSWER = "\\text{(no reference answer)}"


@dataclasses.dataclass(frozen=True)
class PromptOrder:
  """The order an RL run draws its prompts in: epoch after epoch of `n` prompt indices, each epoch shuffled anew
  by grain from `seed`. `take(position, k)` is the k indices from `position` on; a run stores the position after
  what it used (its data position) and resumes there, so a resumed run sees the prompts an uninterrupted one does."""

  n: int
  seed: int

  def __post_init__(self):
    if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
      raise ConfigError(f"PromptOrder: n must be a positive int, got {self.n!r}")
    check_fields(self, {"seed": SEED})

  def take(self, position: int, k: int) -> list[int]:
    """The prompt indices at positions [position, position + k) of the endless order."""
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
      raise ConfigError(f"PromptOrder.take: position must be a non-negative int, got {position!r}")
    ds = _epochs(self.n, self.seed)
    return [int(ds[i]) for i in range(position, position + k)]


def _epochs(n: int, seed: int):
  return grain.MapDataset.range(n).shuffle(seed=seed).repeat()
