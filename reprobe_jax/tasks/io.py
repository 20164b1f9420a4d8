"""JSONL files of problems (schema in docs/tasks.md): reads that name the bad line and field, atomic writes."""

from __future__ import annotations

import os
from typing import Iterable

from reprobe_jax.io.atomic import write_jsonl
from reprobe_jax.errors import DataFormatError
from reprobe_jax.io.readers import read_jsonl
from reprobe_jax.tasks.base import Problem


def read_problems(path: str | os.PathLike, *, sealed: bool = False) -> list[Problem]:
  """The problems of a JSONL file, validated; DataFormatError naming 'path:line' and the field on any defect (and,
  when `sealed`, when the file does not match its seal: a job's own stored problems)."""
  path = os.fspath(path)
  problems, seen = [], {}
  for number, record in read_jsonl(path, sealed=sealed):
    where = f"{path}:{number}"
    problem = Problem.from_json(record, where=where)
    if problem.id in seen:
      raise DataFormatError(f"{where}: duplicate id {problem.id!r} (first on line {seen[problem.id]})")
    seen[problem.id] = number
    problems.append(problem)
  return problems


def write_problems(path: str | os.PathLike, problems: Iterable[Problem], *, seal: bool = False) -> None:
  """Writes problems as JSONL, atomically (and sealed when asked)."""
  write_jsonl(path, problems, seal=seal)
