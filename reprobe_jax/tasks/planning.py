"""Planning (out of domain): walk a small generated house of numbered rooms along a shortest route.

A step is one move, "move from 4 to 7". It is correct when it starts in the room the previous written
move ended in (or the start room), goes through a door that exists, and ends one door closer to the goal (a step
of some shortest route); a move that adds "(the goal)" must also end in the goal. The answer is the number of moves
the walk took; the true answer is the length of a shortest route (the goal room itself is stated in the question,
so it would be no test).
"""

from __future__ import annotations

import collections
import functools
import re
from typing import Any, NamedTuple

import numpy as np

from reprobe_jax.tasks.family import SyntheticFamily
from reprobe_jax.tasks.base import register_task, Problem, State, family_rng, integer_text

# Rooms are numbered 1..12 (at most 7 per house). The checker takes any lower-case word or number as a room name;
# the generator numbers them because the tiny built-in model copies number tokens (it does so in every arithmetic
# step) but, within its CPU-minutes budget, never learned to copy room words (docs/tasks.md, "planning").
ROOMS = tuple(str(i) for i in range(1, 13))
_N_ROOMS = {1: 5, 2: 6, 3: 7}
_DISTANCE = {1: (1, 2), 2: (2, 3), 3: (3, 4)}  # inclusive range of the shortest-route length per difficulty
_ROOM = r"(?:room\s+)?([a-z]+|\d+)"
GOAL_MARK = " (the goal)"  # TaskFamily.done_mark: a move may say it ends in the goal
_STEP = re.compile(
  rf"^\s*move\s+from\s+(?:the\s+)?{_ROOM}\s+to\s+(?:the\s+)?{_ROOM}\s*(\(the\s+goal\))?\s*\.?\s*$", re.IGNORECASE
)
_INF = 10**9


@functools.lru_cache(maxsize=4096)
def _graph(doors: tuple[tuple[str, str], ...], goal: str) -> tuple[dict[str, frozenset[str]], dict[str, int]]:
  """Adjacency and door-distance to the goal (breadth-first search); cached because checkers call it per step."""
  adj: dict[str, set[str]] = collections.defaultdict(set)
  for a, b in doors:
    adj[a].add(b)
    adj[b].add(a)
  dist = {goal: 0}
  queue = collections.deque([goal])
  while queue:
    room = queue.popleft()
    for nb in sorted(adj[room]):
      if nb not in dist:
        dist[nb] = dist[room] + 1
        queue.append(nb)
  return {k: frozenset(v) for k, v in adj.items()}, dist


class Move(NamedTuple):
  """A parsed move: from `start` to `end`; `claims_goal` when it says it ends in the goal ('... (the goal)')."""

  start: str
  end: str
  claims_goal: bool = False


def graph(problem: Problem) -> tuple[dict[str, frozenset[str]], dict[str, int]]:
  """(adjacency, distance to goal) of a planning problem."""
  return _graph(tuple(tuple(d) for d in problem.data["doors"]), problem.data["goal"])


class Planning(SyntheticFamily):
  """Shortest-route walking; state = (current room as written, moves written so far)."""

  name = "planning"
  step_hint = "one door per step, like 'move from 4 to 7'"
  step_rule = "one door per step"
  done_mark = GOAL_MARK
  flip_kinds = ("detour", "illegal")

  def generate(self, seed: int, difficulty: int) -> Problem:
    """A connected house of 5/6/7 rooms (difficulty extra doors) with start and goal 1-2/2-3/3-4 doors apart."""
    rng = family_rng(self.name, seed, difficulty)
    lo, hi = _DISTANCE[difficulty]
    while True:  # redraw the house until a start/goal pair at the wanted distance exists
      rooms = [str(r) for r in rng.choice(ROOMS, size=_N_ROOMS[difficulty], replace=False)]
      edges = set()
      for i in range(1, len(rooms)):  # a random spanning tree keeps the house connected
        j = int(rng.integers(i))
        edges.add(tuple(sorted((rooms[i], rooms[j]))))
      extra = 0
      while extra < difficulty:  # extra doors make alternative routes and dead ends worth avoiding
        a, b = (str(x) for x in rng.choice(rooms, size=2, replace=False))
        edge = tuple(sorted((a, b)))
        if edge not in edges:
          edges.add(edge)
          extra += 1
      doors = sorted(edges)
      goal = rooms[int(rng.integers(len(rooms)))]
      _, dist = _graph(tuple(doors), goal)
      starts = sorted(r for r in rooms if lo <= dist[r] <= hi)
      if starts:
        break
    start = starts[int(rng.integers(len(starts)))]
    adj, _ = _graph(tuple(doors), goal)
    # Each room's doors are listed the way a step writes a move ("from 4 to 7 or 9"), rooms and their doors in a
    # random order: finding where the walk can go is then one look-up of "from <room> to" in the question, which
    # the tiny built-in model learns; from an unordered list of door pairs it mostly named doors that do not exist
    # (docs/tasks.md, "planning"). Which door is closer to the goal it still has to work out.
    listed = []
    for i in rng.permutation(len(rooms)):
      room = rooms[int(i)]
      nbs = sorted(adj[room])
      nbs = [nbs[int(j)] for j in rng.permutation(len(nbs))]
      listed.append(f"from {room} to {' or '.join(nbs)}")
    # The task comes first and opens like the other families' questions ("Start at X."), so the start room stands
    # where an arithmetic chain's start value does and a step copies it the same way.
    question = (
      f"Start at {start}. Go to room {goal} by a shortest route, one door per move. Doors: "
      f"{'; '.join(listed)}. How many moves is that?"
    )
    return Problem(
      id=f"{self.name}-d{difficulty}-s{seed}",
      domain=self.name,
      question=question,
      answer=str(dist[start]),
      data={
        "rooms": sorted(rooms),
        "doors": [list(d) for d in doors],
        "start": start,
        "goal": goal,
        "difficulty": difficulty,
      },
    )

  def first_step_question(self, problem: Problem) -> str:
    """'..., one door per move.' becomes '..., one door per move, the first from 5.' (the start room): which door
    leads closer to the goal is still to be found."""
    return problem.question.replace(
      "one door per move.", f"one door per move, the first from {problem.data['start']}.", 1
    )

  def validate(self, problem: Problem, where: str) -> None:
    data = problem.data
    rooms = data.get("rooms")
    if (
      not isinstance(rooms, list)
      or not rooms
      or not all(isinstance(r, str) and re.fullmatch(r"[a-z]+|\d+", r) for r in rooms)
    ):
      raise self.data_error(where, f"'rooms' must be a non-empty list of lower-case words or numbers, found {rooms!r}")
    doors = data.get("doors")
    if not isinstance(doors, list) or not all(
      isinstance(d, list) and len(d) == 2 and d[0] in rooms and d[1] in rooms for d in doors
    ):
      raise self.data_error(where, f"'doors' must be a list of [room, room] pairs of listed rooms, found {doors!r}")
    for name in ("start", "goal"):
      if data.get(name) not in rooms:
        raise self.data_error(where, f"'{name}' must be one of the rooms, found {data.get(name)!r}")
    _, dist = graph(problem)
    if data["start"] not in dist:
      raise self.data_error(where, f"the goal {data['goal']!r} cannot be reached from {data['start']!r}")
    if self.normalize_answer(problem.answer) != str(dist[data["start"]]):
      raise self.data_error(where, f"answer {problem.answer!r} is not the shortest route length {dist[data['start']]}")

  def max_steps(self, problem: Problem) -> int:
    # Detours can lengthen a noisy walk; past this bound the solver stops and answers with what it has.
    return 2 * len(problem.data["rooms"]) + 4

  def initial_state(self, problem: Problem) -> State:
    return (problem.data["start"], 0)

  def parse_step(self, body: str) -> Move | None:
    m = _STEP.match(body or "")
    return None if m is None else Move(m.group(1).lower(), m.group(2).lower(), m.group(3) is not None)

  def judge_step(self, problem: Problem, state: State, parsed: Any, next_parsed: Any | None) -> tuple[bool, State]:
    """Correct iff it starts where the walk is, the door exists, it ends one door closer to the goal, and it says
    '(the goal)' only when it ends there."""
    room, count = state
    a, b, claims_goal = parsed
    adj, dist = graph(problem)
    ok = (
      a == room
      and b in adj.get(a, ())
      and dist.get(b, _INF) == dist.get(a, _INF) - 1
      and (not claims_goal or b == problem.data["goal"])
    )
    return ok, (b, count + 1)

  def is_done(self, problem: Problem, state: State) -> bool:
    return state[0] == problem.data["goal"]

  def state_answer(self, problem: Problem, state: State) -> str:
    return str(state[1])

  def match_score(self, problem: Problem, state: State, parsed: Any) -> int:
    return 2 if parsed[0] == state[0] else 0

  def normalize_answer(self, answer: str) -> str | None:
    m = re.fullmatch(r"(\d+)(\s*moves?)?", answer.strip().rstrip(".").strip(), re.IGNORECASE)
    return None if m is None else integer_text(m.group(1))  # no int(): an answer of any length is compared

  def honest_step(self, problem: Problem, state: State, rng: np.random.Generator | None) -> tuple[str, State]:
    room, count = state
    adj, dist = graph(problem)
    closer = sorted(nb for nb in adj[room] if dist[nb] == dist[room] - 1)
    nb = closer[0] if rng is None else closer[int(rng.integers(len(closer)))]
    return f"move from {room} to {nb}", (nb, count + 1)

  def error_step(self, problem: Problem, state: State, kind: str, rng: np.random.Generator) -> tuple[str, State] | None:
    """'illegal': through a door that does not exist; 'detour': through a real door that does not get closer."""
    room, count = state
    adj, dist = graph(problem)
    if kind == "illegal":
      choices = sorted(r for r in problem.data["rooms"] if r != room and r not in adj[room])
    elif kind == "detour":
      choices = sorted(nb for nb in adj[room] if dist[nb] >= dist[room])
    else:
      return None
    if not choices:
      return None
    nb = choices[int(rng.integers(len(choices)))]
    return f"move from {room} to {nb}", (nb, count + 1)

  def error_rates(self, noise: Any) -> list[tuple[str, float]]:
    return [("illegal", noise.p_illegal_move), ("detour", noise.p_detour)]


register_task(Planning())
