"""JSONL files of problems (schema in docs/tasks.md): atomic writes, and reads that name the bad line
(`reprobe_jax.io.readers.read_jsonl`, re-exported here)."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

from reprobe_jax.io.atomic import atomic_open
from reprobe_jax.errors import DataFormatError
from reprobe_jax.io.readers import read_jsonl
from reprobe_jax.tasks.base import Problem


def write_jsonl(path: str | os.PathLike, records: Iterable[Any]) -> None:
  """Writes one JSON object per line; records are dicts or objects with `to_json()` (Problem, Trace).

  The file appears complete or not at all: lines go to a temporary file in the same folder, which replaces `path`
  only after every record was written (os.replace is atomic on one file system).
  """
  with atomic_open(path, "w", encoding="utf-8") as f:
    for record in records:
      obj = record.to_json() if hasattr(record, "to_json") else record
      # allow_nan=False: NaN is not JSON, and other readers would reject the file later.
      f.write(json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n")


def read_problems(path: str | os.PathLike) -> list[Problem]:
  """The problems of a JSONL file, validated; DataFormatError naming 'path:line' and the field on any defect."""
  path = os.fspath(path)
  problems, seen = [], {}
  for number, record in read_jsonl(path):
    where = f"{path}:{number}"
    problem = Problem.from_json(record, where=where)
    if problem.id in seen:
      raise DataFormatError(f"{where}: duplicate id {problem.id!r} (first on line {seen[problem.id]})")
    seen[problem.id] = number
    problems.append(problem)
  return problems


def write_problems(path: str | os.PathLike, problems: Iterable[Problem]) -> None:
  """Writes problems as JSONL, atomically."""
  write_jsonl(path, problems)
