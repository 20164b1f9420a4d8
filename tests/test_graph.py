"""The stage graph every job is made of: each stage runs at most once per run, after the stages it needs, and gets
their results; a graph with a stage declared twice or a need declared later is refused when it is made."""

from __future__ import annotations

import collections

import pytest

from reprobe_jax.jobs.graph import Graph, GraphRun, Stage


def counted(graph: Graph) -> tuple[Graph, collections.Counter]:
  """The graph with each stage's calls counted in the returned Counter (by stage name)."""
  calls = collections.Counter()

  def wrap(stage):
    def count(*args):
      calls[stage.name] += 1
      return stage.fn(*args)

    return count

  return graph.wrapped(wrap), calls


def _graph(log: list) -> Graph:
  def stage(name):
    def fn(job, *needs):
      log.append(name)
      return (name, job, needs)

    return fn

  return Graph(
    Stage("a", stage("a")),
    Stage("b", stage("b"), needs=("a",)),
    Stage("c", stage("c"), needs=("a",)),
    Stage("d", stage("d"), needs=("c", "b")),
  )


def test_each_stage_runs_once_after_what_it_needs_with_their_results():
  log = []
  run = GraphRun(_graph(log), "job")
  name, job, (c, b) = run["d"]
  assert (name, job) == ("d", "job") and c[0] == "c" and b[0] == "b" and c[2] == (run["a"],) == b[2]
  assert log == ["a", "c", "b", "d"]  # the needs in the order the stage names them, 'a' once for both
  run["b"], run["d"]
  assert log == ["a", "c", "b", "d"]
  assert GraphRun(_graph(log), "other")["b"][1] == "other" and log[-2:] == ["a", "b"]  # a new run starts afresh


def test_a_stage_runs_only_when_something_asks_for_it():
  log = []
  run = GraphRun(_graph(log), None)
  run["b"]
  assert log == ["a", "b"]
  with pytest.raises(KeyError, match=r"no stage 'e'.*\['a', 'b', 'c', 'd'\]"):
    run["e"]


def test_wrapped_stages_see_every_call():
  log = []
  graph, calls = counted(_graph(log))
  run = GraphRun(graph, None)
  run["d"], run["d"], run["b"]
  assert calls == {"a": 1, "b": 1, "c": 1, "d": 1} and log == ["a", "c", "b", "d"]


def test_bad_graphs_are_refused_when_made():
  noop = lambda job, *a: None  # noqa: E731
  with pytest.raises(ValueError, match="'a' is declared twice"):
    Graph(Stage("a", noop), Stage("a", noop))
  with pytest.raises(ValueError, match=r"'a' needs \['b'\], which are not declared before it"):
    Graph(Stage("a", noop, needs=("b",)), Stage("b", noop))
  with pytest.raises(ValueError, match=r"'a' needs \['a'\]"):
    Graph(Stage("a", noop, needs=("a",)))
