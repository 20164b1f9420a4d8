"""Training traces: the scripted solver with realistic imperfection (docs/tasks.md, "Noise model").

A model trained on these traces should make the mistakes docs/method.md §A2 and §B3 measure: wrong steps whose errors
propagate to later steps and to the final answer, redundant re-checking after the answer is established (thinking
mode), occasional right-to-wrong flips during re-checking, and occasional real fixes of an earlier error.

Every trace is labelled by the checker, and `solve` only returns traces where the checker's labels agree with
what the noise did: label 1.0 exactly where `injected` names an error.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Sequence

import numpy as np

from reprobe_jax.errors import ConfigError
from reprobe_jax.steps.labels import labels_to_json
import reprobe_jax.tasks.formats as formats
from reprobe_jax.tasks.response import parse_line, parse_thinking, render_line, render_thinking
from reprobe_jax.tasks.base import Problem, State, TaskFamily, get_family

_RETRIES = 8
# Every buggy procedure a family implements (TaskFamily.bug_step), by name.
BUG_KINDS = {
  "carry": "arithmetic: a + b that crosses a ten is written without the carry (17 + 5 = 12)",
  "borrow": "arithmetic: a - b that needs a borrow subtracts the smaller units digit from the larger (23 - 5 = 22)",
  "inverse": "qa: the mentor relation is read backwards (the mentor of X is the person X mentors)",
}
# World v3's procedures (docs/tasks.md, "Strategy forks"), by name: a step names the one it uses ("by columns, ..."),
# and each has its own misconception under a condition of the operands (`TaskFamily.procedure_bug`).
PROCEDURE_KINDS = {
  "columns": "arithmetic: digit by digit; drops a carry (17 + 5 = 12, 14 * 3 = 32) and a borrow (23 - 5 = 22)",
  "counting": "arithmetic: counts on or back; no misconception (slips only)",
  "recall": "arithmetic: the fact from memory; no misconception (slips only)",
}


@dataclasses.dataclass(frozen=True)
class TraceNoise:
  """Per-step error rates of the scripted solver and the thinking-mode re-check behaviour.

  Per-step rates are the chance that one step is written wrong in that way; a family reads only its own
  (arithmetic: result/operand/operation/skip, about 8% per step in all; planning: illegal/detour, 8%; qa:
  entity/relation/skip, 8%). A kind that is impossible at a step (no later hop to skip to) leaves the step right.
  """

  p_wrong_result: float = 0.04  # arithmetic: result off by 1-3
  p_wrong_operand: float = 0.02  # arithmetic: the problem's number misread by 1-3
  p_wrong_operation: float = 0.01  # arithmetic: another operator with the right number
  p_skip: float = 0.01  # arithmetic, qa: the next operation / hop is skipped
  p_illegal_move: float = 0.03  # planning: a move through a door that does not exist
  p_detour: float = 0.05  # planning: a real door that does not get closer to the goal
  p_wrong_entity: float = 0.05  # qa: a lookup names the wrong person
  p_wrong_relation: float = 0.02  # qa: another relation is followed
  # Thinking mode: after the answer is established, re-check 1..max_recheck earlier steps with this chance;
  # common on purpose, so a model trained on these traces re-checks in well over 30% of correct trajectories.
  p_recheck: float = 0.6
  max_recheck: int = 3
  p_r2w: float = 0.1  # given a re-check of a right answer: 'find' a non-existent error and switch to a wrong answer
  p_w2r: float = 0.3  # given a re-check of a trace with an error: find the first error and fix it
  # Buggy procedures (docs/tasks.md): systematic misconceptions, each applied with p_bug wherever its condition
  # holds. `bugs` names the ones in use (arithmetic: 'carry', 'borrow'; qa: 'inverse').
  p_bug: float = 0.9
  bugs: tuple[str, ...] = ("carry", "borrow", "inverse")
  # Strategy forks (world v3): (procedure, weight) pairs; every step of a family that has these procedures names
  # one, drawn by weight, and its misconception fires with p_bug where its condition holds. () = no forks (world v2).
  procedures: tuple[tuple[str, float], ...] = ()

  def __post_init__(self):
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.name.startswith("p_") and not 0.0 <= value <= 1.0:
        raise ConfigError(f"TraceNoise.{f.name} must be in [0, 1], found {value}")
    unknown = sorted(set(self.bugs) - set(BUG_KINDS))
    if unknown:
      raise ConfigError(f"TraceNoise.bugs: unknown bug(s) {unknown}; known: {list(BUG_KINDS)}")
    names = [name for name, _ in self.procedures]
    unknown = sorted(set(names) - set(PROCEDURE_KINDS))
    if unknown:
      raise ConfigError(f"TraceNoise.procedures: unknown procedure(s) {unknown}; known: {list(PROCEDURE_KINDS)}")
    if len(set(names)) != len(names):
      raise ConfigError(f"TraceNoise.procedures: a procedure is named twice in {names}")
    bad = [(name, w) for name, w in self.procedures if not (math.isfinite(w) and w > 0)]
    if bad:
      raise ConfigError(f"TraceNoise.procedures: weights must be finite and above 0, found {bad}")
    if self.max_recheck < 1:
      raise ConfigError(f"TraceNoise.max_recheck must be at least 1, found {self.max_recheck}")
    for family, total in (
      ("arithmetic", self.p_wrong_result + self.p_wrong_operand + self.p_wrong_operation + self.p_skip),
      ("planning", self.p_illegal_move + self.p_detour),
      ("qa", self.p_wrong_entity + self.p_wrong_relation + self.p_skip),
    ):
      if total > 1.0:
        raise ConfigError(f"TraceNoise: the {family} per-step error rates sum to {total:.3f}, more than 1")

  @classmethod
  def clean(cls) -> TraceNoise:
    """No errors, no re-checks: the reference solution in either format."""
    return cls(**{f.name: 0.0 for f in dataclasses.fields(cls) if f.name.startswith("p_")}, bugs=())


# The built-in worlds (docs/tasks.md, "Worlds"): v2's bugs fire wherever their condition holds, so samples share
# them; v3 forks every arithmetic step among three procedures, of which the most likely goes wrong where a column
# carries or borrows, so samples disagree, the right answer wins votes by two routes, and greedy decoding follows
# the procedure that goes wrong. Both re-check after the answer as v2 does (docs/tasks.md measures how much).
WORLDS = {
  "v2": TraceNoise(),
  "v3": TraceNoise(bugs=("inverse",), p_bug=0.95, procedures=(("columns", 0.45), ("counting", 0.3), ("recall", 0.25))),
}


@dataclasses.dataclass(frozen=True)
class Trace:
  """One scripted response and its labels.

  steps: line-mode step bodies, or thinking-mode paragraphs (as `parse_thinking` returns them).
  labels: the checker's labels per step (1.0 incorrect, 0.0 correct, NaN unknown).
  kinds: 'step', 'reflect' or 'other' per step ('step' throughout in line mode).
  injected: the noise behind each label 1.0 (an error kind, 'repeat' for a re-check that repeats a wrong step,
    'r2w' for a right-to-wrong flip, 'unfinished' for a conclusion of an incomplete walk), else None.
  answer_paragraph: thinking mode, index of the paragraph that first completes the chain (the answer is established
    there), None if it never completes; line mode, None.
  """

  problem_id: str
  mode: str
  text: str
  steps: list[str]
  labels: list[float]
  answer: str | None
  correct: bool
  kinds: list[str]
  injected: list[str | None]
  answer_paragraph: int | None = None
  rechecked: bool = False
  r2w: bool = False
  w2r: bool = False

  def to_json(self) -> dict:
    """A JSONL record (NaN labels written as null)."""
    record = dataclasses.asdict(self)
    record["labels"] = labels_to_json(self.labels)
    return record


def _draw_kind(rates: Sequence[tuple[str, float]], rng: np.random.Generator) -> str | None:
  u = rng.random()
  for kind, p in rates:
    if u < p:
      return kind
    u -= p
  return None


def _procedures(family: TaskFamily, noise: TraceNoise | None) -> list[tuple[str, float]]:
  """The (procedure, weight) forks of `noise` this family has (world v3), else []."""
  return [] if noise is None else [(n, w) for n, w in noise.procedures if n in family.procedures]


def _draw_procedure(
  family: TaskFamily, problem: Problem, state: State, procs, rng: np.random.Generator, *, clean: bool = False
) -> str | None:
  """A procedure drawn by weight (None without forks); `clean`: among those whose misconception does not apply at
  `state` (a solution that has just found an error redoes the step with a procedure that gets it right)."""
  if clean:
    procs = [(n, w) for n, w in procs if family.procedure_bug(problem, state, n) is None]
  if not procs:
    return None
  weights = np.array([w for _, w in procs], float)
  return procs[int(rng.choice(len(procs), p=weights / weights.sum()))][0]


def _named(family: TaskFamily, procedure: str | None, body: str) -> str:
  return body if procedure is None else family.with_procedure(body, procedure)


def _walk(
  family: TaskFamily,
  problem: Problem,
  state: State,
  rng: np.random.Generator,
  noise: TraceNoise | None,
  limit: int,
  procs: Sequence[tuple[str, float]] = (),
) -> tuple[list[str], list[str | None], list[tuple[State, State]], State]:
  """Writes steps from `state` until the chain is complete: (bodies, injected kinds, (before, after) states, state).

  After a wrong step the walk goes on honestly from the wrong written value, so the error propagates. With
  procedure forks (`procs`, world v3) every step names the procedure it uses; without noise (a clean redo) only
  procedures that get the step right are drawn.
  """
  bodies, injected, snapshots = [], [], []
  rates = [] if noise is None else family.error_rates(noise)
  while not family.is_done(problem, state) and len(bodies) < limit:
    procedure = _draw_procedure(family, problem, state, procs, rng, clean=noise is None) if procs else None
    # A buggy procedure is drawn before the slips: where its condition holds it fires with p_bug, every time the
    # solver meets that condition, which is what makes it a confident mistake of the trained model.
    bug = None if noise is None or procedure is None else family.procedure_bug(problem, state, procedure)
    if bug is None and noise is not None and noise.p_bug > 0.0:
      bug = family.bug_step(problem, state, noise)
    if bug is not None and rng.random() < noise.p_bug:
      kind, body, new = bug
    else:
      kind = _draw_kind(rates, rng)
      out = None if kind is None else family.error_step(problem, state, kind, rng)
      if out is None:
        kind = None
        out = family.honest_step(problem, state, rng)
      body, new = out
    bodies.append(_named(family, procedure, body))
    injected.append(kind)
    snapshots.append((state, new))
    state = new
  return bodies, injected, snapshots, state


def _draft_line(family: TaskFamily, problem: Problem, rng: np.random.Generator, noise: TraceNoise) -> Trace:
  bodies, injected, _, state = _walk(
    family, problem, family.initial_state(problem), rng, noise, family.max_steps(problem), _procedures(family, noise)
  )
  answer = family.state_answer(problem, state)
  text = render_line(bodies, answer)
  steps, parsed_answer = parse_line(text)
  labels = family.check_steps(problem, steps)
  return Trace(
    problem_id=problem.id,
    mode="line",
    text=text,
    steps=steps,
    labels=labels,
    answer=parsed_answer,
    correct=family.check_answer(problem, parsed_answer),
    kinds=["step"] * len(steps),
    injected=injected,
  )


def _draft_thinking(family: TaskFamily, problem: Problem, rng: np.random.Generator, noise: TraceNoise) -> Trace:
  paragraphs: list[str] = []
  injected: list[str | None] = []

  def conclude(state: State) -> None:
    paragraphs.append(formats.conclude_paragraph(family.state_answer(problem, state)))
    injected.append(None if family.is_done(problem, state) else "unfinished")

  limit = family.max_steps(problem)
  procs = _procedures(family, noise)
  bodies, kinds, snapshots, state = _walk(family, problem, family.initial_state(problem), rng, noise, limit, procs)
  for i, (body, kind) in enumerate(zip(bodies, kinds)):
    paragraphs.append(formats.work_paragraph(body, i + 1))
    injected.append(kind)
  answer_paragraph = len(paragraphs) - 1 if bodies and family.is_done(problem, state) else None
  conclude(state)
  rechecked = r2w = w2r = False
  if snapshots and rng.random() < noise.p_recheck:
    wrong = [j for j, kind in enumerate(kinds) if kind is not None]
    right_now = family.check_answer(problem, family.state_answer(problem, state))
    flip = None
    if wrong and rng.random() < noise.p_w2r:
      flip = ("fix", wrong[0])
    elif right_now and not wrong and rng.random() < noise.p_r2w:
      flip = ("r2w", int(rng.integers(len(snapshots))))
    n_plain = int(rng.integers(1, noise.max_recheck + 1)) - (flip is not None)
    targets = [int(j) for j in rng.choice(len(snapshots), size=min(n_plain, len(snapshots)), replace=False)]
    for j in targets:
      # A plain re-check repeats the earlier step as written: right if it was right, wrong if it was wrong.
      parsed = family.parse_step(bodies[j])
      if formats.match_snapshot(family, problem, snapshots, parsed) != j:
        continue  # the checker would read it as a re-check of another step; leave it out
      paragraphs.append(formats.reflect_paragraph(bodies[j], int(rng.integers(len(formats.REFLECT_PREFIXES)))))
      injected.append(None if kinds[j] is None else "repeat")
    if flip is not None:
      how, j = flip
      before, after = snapshots[j]
      if how == "fix":
        out = family.honest_step(problem, before, rng)
      else:
        out = next(
          (o for o in (family.error_step(problem, before, k, rng) for k in family.flip_kinds) if o is not None), None
        )
      if out is not None and procs:  # the re-check names its procedure too (one that gets a fix right)
        out = (_named(family, _draw_procedure(family, problem, before, procs, rng, clean=how == "fix"), out[0]), out[1])
      if (
        out is not None
        and out[1] != after
        and formats.match_snapshot(family, problem, snapshots, family.parse_step(out[0])) == j
      ):
        body, new = out
        paragraphs.append(formats.reflect_paragraph(body, int(rng.integers(len(formats.REFLECT_PREFIXES)))))
        injected.append(None if how == "fix" else "r2w")
        # The solution changes its mind at step j and redoes the rest from there, honestly.
        redo, _, _, state = _walk(family, problem, new, rng, None, limit, procs)
        for k, body in enumerate(redo, start=j + 2):  # the chain goes on after its (j+1)-th step
          paragraphs.append(formats.work_paragraph(body, k))
          injected.append(None)
        conclude(state)
        right_after = family.check_answer(problem, family.state_answer(problem, state))
        r2w = how == "r2w" and not right_after
        w2r = how == "fix" and right_after
  rechecked = any(formats.classify_paragraph(problem, p) == "reflect" for p in paragraphs)
  answer = family.state_answer(problem, state)
  text = render_thinking(paragraphs, answer)
  steps, parsed_answer = parse_thinking(text)
  labels = formats.check_thinking(problem, steps)
  return Trace(
    problem_id=problem.id,
    mode="thinking",
    text=text,
    steps=steps,
    labels=labels,
    answer=parsed_answer,
    correct=family.check_answer(problem, parsed_answer),
    kinds=[formats.classify_paragraph(problem, p) for p in steps],
    injected=injected,
    answer_paragraph=answer_paragraph,
    rechecked=rechecked,
    r2w=r2w,
    w2r=w2r,
  )


def agrees(trace: Trace) -> bool:
  """Whether the checker's labels say exactly what the noise did (1.0 where `injected` names an error)."""
  pairs = zip(trace.labels, trace.injected)
  return len(trace.labels) == len(trace.injected) and all(
    not math.isnan(label) and (label == 1.0) == (kind is not None) for label, kind in pairs
  )


def draft(
  problem: Problem, family: TaskFamily | str, rng: np.random.Generator, mode: str, noise: TraceNoise = TraceNoise()
) -> Trace:
  """One scripted trace without the agreement guarantee of `solve` (exposed for tests and diagnostics)."""
  formats._check_mode(mode)
  if isinstance(family, str):
    family = get_family(family)
  if family.name != problem.domain:
    raise ConfigError(f"problem {problem.id} is {problem.domain!r}, but the family is {family.name!r}")
  make = _draft_line if mode == "line" else _draft_thinking
  return make(family, problem, rng, noise)


def solve(
  problem: Problem, family: TaskFamily | str, rng: np.random.Generator, mode: str, noise: TraceNoise = TraceNoise()
) -> Trace:
  """A scripted response to `problem` in `mode` ('line' or 'thinking') with `noise`, labelled by the checker.

  The rare draft whose labels would disagree with its injected noise (a wrong step that happens to read as another
  kind of step) is redrawn; after a few tries the clean solution is returned.
  """
  for _ in range(_RETRIES):
    trace = draft(problem, family, rng, mode, noise)
    if agrees(trace):
      return trace
  return draft(problem, family, rng, mode, TraceNoise.clean())


def solve_many(
  problems: Sequence[Problem], mode: str, seed: int, noise: TraceNoise = TraceNoise(), samples: int = 1
) -> list[Trace]:
  """`samples` traces per problem; each problem's traces depend only on its id and `seed`, not on the order."""
  out = []
  for problem in problems:
    rng = np.random.default_rng([seed, zlib.crc32(problem.id.encode())])
    for _ in range(samples):
      out.append(solve(problem, get_family(problem.domain), rng, mode, noise))
  return out
