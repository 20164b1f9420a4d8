"""The rows of a test-time-scaling table (docs/method.md §A7): which method each row is, in the paper's order, and
where its numbers sit in the tts job's metrics (`results[domain][cell][budget][selection]`). The job's tables
(`reprobe_jax.jobs.tts_report`) and the shipped bands' grids (`reprobe_jax.eval.bands`) both read them here."""

from __future__ import annotations

from typing import Iterator

STRATEGY_TITLES = {"best_of_n": "Best-of-N", "beam": "Beam search", "dvts": "DVTS"}


def rows(per: dict) -> Iterator[tuple[str, str, str]]:
  """(row title, cell name, selection) of every method of one domain's cells, in the paper's table order."""
  yield "Greedy", "greedy", "first"
  bon = sorted(k for k in per if k.startswith("best_of_n["))
  if bon:
    yield "Majority vote", bon[0], "majority"
  for cell in bon:
    yield f"Best-of-N, {cell[len('best_of_n[') : -1]}", cell, "best"
  for cell in bon:
    yield f"Weighted vote, {cell[len('best_of_n[') : -1]}", cell, "weighted"
  for strategy in ("beam", "dvts"):
    for cell in sorted(k for k in per if k.startswith(f"{strategy}[")):
      yield f"{STRATEGY_TITLES[strategy]}, {cell[len(strategy) + 1 : -1]}", cell, "best"
  if bon:
    yield "pass@N (upper bound)", bon[0], "pass@n"


def budget_key(cell: dict, budget: int) -> str | None:
  """The key of `budget` in one cell's results: greedy is one trajectory at every budget (its only key, '1'); a
  search has no entry below its smallest budget."""
  if str(budget) in cell:
    return str(budget)
  return "1" if len(cell) == 1 and "1" in cell else None


def at(cell: dict, budget: int) -> dict | None:
  """One cell's summary at `budget`, or None where the cell has no entry there (a search at N = 1)."""
  k = budget_key(cell, budget)
  return None if k is None else cell[k]
