"""Task families with exact step checkers, answer formats and scripted training traces (docs/tasks.md); math
answers (`extract_answer`, `judge_answer` / `is_equivalent`) and readers of public data files (`read_dataset`:
GSM8K, MATH, plain JSONL, ProcessBench, PRM800K).

Each family's module registers its instance in `FAMILIES` (`tasks.base`) when imported; this package imports them
all, so `get_family(name)` finds every built-in family.
"""

from __future__ import annotations

import numpy as np

from reprobe_jax.errors import ConfigError
from reprobe_jax.tasks import formats, io, traces
from reprobe_jax.tasks.arithmetic import Arithmetic
from reprobe_jax.tasks.base import DIFFICULTIES, DOMAINS, FAMILIES, Problem, TaskFamily, first_error, get_family
from reprobe_jax.tasks.formats import (
  check_response,
  check_thinking,
  classify_paragraph,
  parse_line,
  parse_thinking,
  render_line,
  render_thinking,
  step_texts_for_check,
  user_prompt,
)
from reprobe_jax.tasks.dataset_records import Dataset, LabelledSolution, MathProblem
from reprobe_jax.tasks.datasets import read_dataset
from reprobe_jax.tasks.io import read_problems, write_problems
from reprobe_jax.tasks.math import AnswerVerdict, extract_answer, is_equivalent, judge_answer
from reprobe_jax.tasks.planning import Planning
from reprobe_jax.tasks.qa import MultiHopQA
from reprobe_jax.tasks.traces import Trace, TraceNoise, solve, solve_many


def make_problems(family: str | TaskFamily, n: int, seed: int, difficulty: int) -> list[Problem]:
  """`n` distinct problems (no two with the same question), deterministic in (family, seed, difficulty).

  Ids are '{family}-d{difficulty}-s{seed}-{i:05d}', unique within a call and across seeds.
  """
  fam = get_family(family) if isinstance(family, str) else family
  if n < 0:
    raise ConfigError(f"n must be non-negative, found {n}")
  fam.generate(seed, difficulty)  # validates seed and difficulty before the loop
  # Each item's seed comes from a seed sequence, so problems of different base seeds do not overlap.
  child_seeds = np.random.SeedSequence([seed, difficulty]).generate_state(max(4 * n, 16), dtype=np.uint64)
  problems: list[Problem] = []
  questions: set[str] = set()
  for child in child_seeds:
    if len(problems) == n:
      break
    problem = fam.generate(int(child), difficulty)
    if problem.question in questions:
      continue  # small families repeat; a duplicate would leak between train and test splits
    questions.add(problem.question)
    problems.append(
      Problem(
        id=f"{fam.name}-d{difficulty}-s{seed}-{len(problems):05d}",
        domain=problem.domain,
        question=problem.question,
        answer=problem.answer,
        data=problem.data,
      )
    )
  if len(problems) < n:
    raise ConfigError(
      f"could only make {len(problems)} distinct {fam.name} problems at difficulty {difficulty}, asked for {n}"
    )
  return problems


__all__ = [
  "AnswerVerdict",
  "DIFFICULTIES",
  "Dataset",
  "DOMAINS",
  "FAMILIES",
  "Arithmetic",
  "MultiHopQA",
  "Planning",
  "Problem",
  "TaskFamily",
  "Trace",
  "TraceNoise",
  "LabelledSolution",
  "MathProblem",
  "check_response",
  "check_thinking",
  "classify_paragraph",
  "extract_answer",
  "first_error",
  "formats",
  "get_family",
  "io",
  "is_equivalent",
  "judge_answer",
  "make_problems",
  "parse_line",
  "parse_thinking",
  "read_dataset",
  "read_problems",
  "render_line",
  "render_thinking",
  "solve",
  "solve_many",
  "step_texts_for_check",
  "traces",
  "user_prompt",
  "write_problems",
]
