"""Tasks (docs/tasks.md): the task interface and its registry (`Task`, `TASKS`, `register_task`, `get_task`); the
synthetic families with exact step checkers, scripted training traces and worked examples; the math task over the
user's problems (`MathTask`, registered as 'math') with its answers (`extract_answer`, `judge_answer` /
`is_equivalent`); readers of public data files (`read_dataset`: GSM8K, MATH, plain JSONL, ProcessBench, PRM800K).

Each task's module registers its instance when imported; this package imports the built-in ones, so `get_task(name)`
finds every built-in task and `get_family(name)` every synthetic family.
"""

from __future__ import annotations

from reprobe_jax.tasks import formats, io, traces
from reprobe_jax.tasks.arithmetic import Arithmetic
from reprobe_jax.tasks.base import (
  DIFFICULTIES,
  FAMILIES,
  TASKS,
  Problem,
  Task,
  TaskFamily,
  first_error,
  get_family,
  get_task,
  register_task,
)
from reprobe_jax.tasks.formats import (
  check_response,
  check_thinking,
  classify_paragraph,
  step_texts_for_check,
  user_prompt,
)
from reprobe_jax.tasks.response import parse_line, parse_thinking, render_line, render_thinking
from reprobe_jax.tasks.family import SyntheticFamily
from reprobe_jax.tasks.dataset_records import Dataset, LabelledSolution, MathProblem
from reprobe_jax.tasks.datasets import read_dataset
from reprobe_jax.tasks.generate import make_problems
from reprobe_jax.tasks.io import read_problems, write_problems
from reprobe_jax.tasks.math import AnswerVerdict, extract_answer, is_equivalent, judge_answer
from reprobe_jax.tasks.math_task import MathTask
from reprobe_jax.tasks.planning import Planning
from reprobe_jax.tasks.qa import MultiHopQA
from reprobe_jax.tasks.traces import Trace, TraceNoise, solve, solve_many


__all__ = [
  "AnswerVerdict",
  "DIFFICULTIES",
  "Dataset",
  "FAMILIES",
  "TASKS",
  "Task",
  "MathTask",
  "get_task",
  "register_task",
  "Arithmetic",
  "MultiHopQA",
  "Planning",
  "Problem",
  "TaskFamily",
  "SyntheticFamily",
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
