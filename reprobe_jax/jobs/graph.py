"""A job as a graph of stages, each computed at most once per run.

A stage is a named function of the job (its inputs: the model, the configs, the run folder, the progress callback)
and of the results of the stages it names, in that order:

    GRAPH = Graph(Stage("problems", problems),
                  Stage("trajectories", trajectories, needs=("problems",)),
                  Stage("probes", probes, needs=("trajectories",)))
    run = GraphRun(GRAPH, job)
    run["probes"]   # problems, then trajectories, then probes; each result kept for the next request

A stage declares only stages declared before it, so a graph has no cycle and its declaration order is a valid
order to run it in. The results handed between stages are typed records, never tuples or parsed strings. What a
stage writes to disk is skipped when it is already there (`runs.Run.stage`): memoising here keeps one run from
computing or reading anything twice, the run folder keeps reruns from computing anything again.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Stage:
  """`fn(job, *results of needs)` computes the stage's result."""

  name: str
  fn: Callable[..., Any]
  needs: tuple[str, ...] = ()


class Graph:
  """Named stages in declaration order; each may need only stages declared before it."""

  def __init__(self, *stages: Stage):
    self.stages: dict[str, Stage] = {}
    for stage in stages:
      if stage.name in self.stages:
        raise ValueError(f"stage {stage.name!r} is declared twice")
      unknown = [n for n in stage.needs if n not in self.stages]
      if unknown:
        raise ValueError(f"stage {stage.name!r} needs {unknown}, which are not declared before it")
      self.stages[stage.name] = stage

  def wrapped(self, wrap: Callable[[Stage], Callable[..., Any]]) -> Graph:
    """The same graph with each stage's function replaced by `wrap(stage)` (e.g. one that counts its calls)."""
    return Graph(*(dataclasses.replace(s, fn=wrap(s)) for s in self.stages.values()))


class GraphRun:
  """One run of a graph for one job: `run[name]` is that stage's result, computed on first request (after the
  stages it needs, in the order it names them) and kept for every later request."""

  def __init__(self, graph: Graph, job: Any):
    self.graph = graph
    self.job = job
    self._results: dict[str, Any] = {}

  def __getitem__(self, name: str) -> Any:
    if name not in self._results:
      if name not in self.graph.stages:
        raise KeyError(f"no stage {name!r}; the stages are {list(self.graph.stages)}")
      stage = self.graph.stages[name]
      args = [self[n] for n in stage.needs]
      self._results[name] = stage.fn(self.job, *args)
    return self._results[name]
