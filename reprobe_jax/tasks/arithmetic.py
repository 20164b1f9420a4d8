"""Arithmetic chains (the in-domain 'math' family): a start value and 2-4 operations on small integers.

The question labels each operation with the step that applies it ("Start at 12. Step 1: * 3. Step 2: + 4.
..."); a step applies its operation to the previous written result: "12 * 3 = 36". Every number of a generated chain
stays in 0..30; only +, - and * are used, so a wrong value propagated through later steps still gives integers.

A model can sample a number of any length ("= 999...9"): the checker reads numbers of up to Python's int-string
limit (4300 digits); a step with a longer number is unparseable (label NaN), and an answer of any length is compared
as a canonical digit string. A problem record whose chain reaches a value past that limit is refused.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from reprobe_jax.io.readers import shown
from reprobe_jax.tasks.family import SyntheticFamily
from reprobe_jax.tasks.base import register_task, Problem, State, advance_pointer, family_rng, integer_text, read_int

_OPS = ("+", "-", "*")
_WORDS = {"+": "+ {b}", "-": "- {b}", "*": "* {b}"}
_N_OPS = {1: (2, 3), 2: (3, 3), 3: (3, 4)}  # inclusive range of operations per difficulty
# Small ranges keep the table of facts (about 390 distinct a op b) within what a tiny model trained for minutes on
# two CPU cores can learn, while it still makes real mistakes.
_MAX_VALUE = 30
_MAX_ADD = 6  # operands of + and -
_MAX_MUL = 3
# A step may name its procedure first and write the columns procedure's tens and units ("by columns, 17 + 5 = 10 + 2
# = 12"; world v3, docs/tasks.md "Worlds"); the checker judges the result whatever the procedure.
_STEP = re.compile(
  r"^\s*(?:(?i:by)\s+[A-Za-z]+\s*,\s*)?(-?\d+)\s*([-+*x×−])\s*(\d+)\s*=\s*(?:-?\d+\s*\+\s*-?\d+\s*=\s*)?(-?\d+)\s*\.?\s*$"
)
_CANON = {"x": "*", "×": "*", "−": "-"}
_MAX_DIGITS = 4300  # Python's default int-string limit: a problem's values stay below it
_TOO_LONG = 10**_MAX_DIGITS


def apply(op: str, a: int, b: int) -> int:
  """The result of `a op b`."""
  if op == "+":
    return a + b
  if op == "-":
    return a - b
  return a * b


def _feasible(v: int) -> list[tuple[str, int, int]]:
  """(op, lowest operand, highest operand) that keep the result in 0.._MAX_VALUE from value v."""
  out = []
  if v < _MAX_VALUE:
    out.append(("+", 1, min(_MAX_ADD, _MAX_VALUE - v)))
  if v >= 1:
    out.append(("-", 1, min(_MAX_ADD, v)))
  if 1 <= v <= _MAX_VALUE // 2:
    out.append(("*", 2, min(_MAX_MUL, _MAX_VALUE // v)))
  return out


class Arithmetic(SyntheticFamily):
  """Start value plus operations; state = (index of the next operation, previous written result)."""

  name = "arithmetic"
  step_hint = "like '12 * 3 = 36'"
  step_rule = "one operation per step"
  flip_kinds = ("result",)

  def generate(self, seed: int, difficulty: int) -> Problem:
    """A chain of 2-3 (difficulty 1), 3 (2) or 3-4 (3) operations whose values all stay in 0..30."""
    rng = family_rng(self.name, seed, difficulty)
    lo, hi = _N_OPS[difficulty]
    n_ops = int(rng.integers(lo, hi + 1))
    start = int(rng.integers(1, 21))
    ops: list[list[Any]] = []
    v = start
    while len(ops) < n_ops:
      op, b_lo, b_hi = _feasible(v)[int(rng.integers(len(_feasible(v))))]
      b = int(rng.integers(b_lo, b_hi + 1))
      # An operation used twice would make a skipped one indistinguishable from a done one.
      if [op, b] in ops:
        continue
      ops.append([op, b])
      v = apply(op, v, b)
    # Each operation is labelled with the step that applies it ("Step 2: + 6."), written as the steps write their
    # own number and operation, so step k finds its operation by its label instead of by counting along a list:
    # the built-in tiny model learns that lookup several times faster (docs/tasks.md, "arithmetic").
    text = f"Start at {start}. " + " ".join(
      f"Step {k}: {_WORDS[op].format(b=b)}." for k, (op, b) in enumerate(ops, start=1)
    )
    return Problem(
      id=f"{self.name}-d{difficulty}-s{seed}",
      domain=self.name,
      question=f"{text} What is the final result?",
      answer=str(v),
      data={"start": start, "ops": ops, "difficulty": difficulty},
    )

  def validate(self, problem: Problem, where: str) -> None:
    data = problem.data
    if not isinstance(data.get("start"), int) or isinstance(data.get("start"), bool):
      raise self.data_error(where, f"'start' must be an integer, found {shown(data.get('start'))}")
    ops = data.get("ops")
    if not isinstance(ops, list) or not ops:
      raise self.data_error(where, f"'ops' must be a non-empty list of [op, number] pairs, found {ops!r}")
    for i, item in enumerate(ops):
      # A step writes its operand unsigned ("12 - 3 = 9"), so a negative one could never be checked.
      if (
        not isinstance(item, list)
        or len(item) != 2
        or item[0] not in _OPS
        or not isinstance(item[1], int)
        or isinstance(item[1], bool)
        or item[1] < 0
      ):
        raise self.data_error(where, f"ops[{i}] must be [op, integer >= 0] with op one of + - *, found {shown(item)}")
    v = data["start"]
    for i, (op, b) in enumerate(ops):
      v = apply(op, v, b)
      if abs(v) >= _TOO_LONG:  # past it str(v) raises, and a longer chain could grow without bound
        raise self.data_error(where, f"the chain's value after ops[{i}] has more than {_MAX_DIGITS} digits")
    if self.normalize_answer(problem.answer) != str(v):
      answer = problem.answer if len(problem.answer) <= 60 else problem.answer[:57] + "..."
      raise self.data_error(where, f"answer {answer!r} does not match the chain's result {v}")

  def max_steps(self, problem: Problem) -> int:
    return len(problem.data["ops"])

  def keys(self, problem: Problem) -> list[tuple[str, int]]:
    return [(op, b) for op, b in problem.data["ops"]]

  def initial_state(self, problem: Problem) -> State:
    return (0, problem.data["start"])

  def parse_step(self, body: str) -> tuple[int, str, int, int] | None:
    m = _STEP.match(body or "")
    if m is None:
      return None
    op = _CANON.get(m.group(2), m.group(2))
    a, b, r = read_int(m.group(1)), read_int(m.group(3)), read_int(m.group(4))
    return None if None in (a, b, r) else (a, op, b, r)

  def step_key(self, parsed: Any) -> tuple[str, int] | None:
    return None if parsed is None else (parsed[1], parsed[2])

  def judge_step(self, problem: Problem, state: State, parsed: Any, next_parsed: Any | None) -> tuple[bool, State]:
    """Correct iff it is the next operation, applied to the previous written result, computed right."""
    p, v = state
    a, op, b, r = parsed
    matched, p_next = advance_pointer(self.keys(problem), p, (op, b), self.step_key(next_parsed))
    return matched and a == v and r == apply(op, a, b), (p_next, r)

  def is_done(self, problem: Problem, state: State) -> bool:
    return state[0] >= len(problem.data["ops"])

  def state_answer(self, problem: Problem, state: State) -> str:
    return str(state[1])

  def match_score(self, problem: Problem, state: State, parsed: Any) -> int:
    p, v = state
    keys = self.keys(problem)
    same_op = p < len(keys) and (parsed[1], parsed[2]) == keys[p]
    return 2 if same_op and parsed[0] == v else int(same_op or parsed[0] == v)

  def normalize_answer(self, answer: str) -> str | None:
    return integer_text(answer.strip().rstrip(".").replace(",", "").strip())

  @staticmethod
  def _body(a: int, op: str, b: int, r: int) -> str:
    return f"{a} {op} {b} = {r}"

  def honest_step(self, problem: Problem, state: State, rng: np.random.Generator | None) -> tuple[str, State]:
    p, v = state
    op, b = problem.data["ops"][p]
    r = apply(op, v, b)
    return self._body(v, op, b, r), (p + 1, r)

  def error_step(self, problem: Problem, state: State, kind: str, rng: np.random.Generator) -> tuple[str, State] | None:
    """'result': off by 1-3; 'operand': the problem's number misread by 1-3; 'operation': wrong operator with the
    right number; 'skip': the operation after the next one is applied instead."""
    p, v = state
    keys = self.keys(problem)
    op, b = keys[p]
    # A wrong key equal to a later operation would read as a skip, not as the error meant here.
    later = set(keys[p:])
    if kind == "result":
      right = apply(op, v, b)
      deltas = [d for d in (-3, -2, -1, 1, 2, 3) if right + d >= 0] or [1, 2, 3]
      r = right + int(rng.choice(deltas))
      return self._body(v, op, b, r), (p + 1, r)
    if kind == "operand":
      low = 2 if op == "*" else 1
      choices = [b + d for d in (-3, -2, -1, 1, 2, 3) if b + d >= low and (op, b + d) not in later]
      if not choices:
        return None
      wrong = int(rng.choice(choices))
      r = apply(op, v, wrong)
      return self._body(v, op, wrong, r), (p + 1, r)
    if kind == "operation":
      # 2 + 2 == 2 * 2: an error that leaves the value right would not propagate, which is what it is for.
      choices = [o for o in _OPS if o != op and (o, b) not in later and apply(o, v, b) != apply(op, v, b)]
      if not choices:
        return None
      wrong = str(rng.choice(choices))
      r = apply(wrong, v, b)
      return self._body(v, wrong, b, r), (p + 1, r)
    if kind == "skip":
      if p + 1 >= len(keys) or keys[p + 1] == keys[p]:
        return None
      op2, b2 = keys[p + 1]
      r = apply(op2, v, b2)
      return self._body(v, op2, b2, r), (p + 2, r)
    return None

  def bug_step(self, problem: Problem, state: State, noise: Any) -> tuple[str, str, State] | None:
    """'carry': `a + b` whose units cross a ten is written without the carry (17 + 5 = 12); 'borrow': `a - b` whose
    units need a borrow takes the smaller units digit from the larger (23 - 5 = 22). Both are bugs of Brown and
    Burton's BUGGY catalogue; the condition is in the operands, which the model reads as it writes the result."""
    p, v = state
    op, b = self.keys(problem)[p]
    if op == "+" and "carry" in noise.bugs and v % 10 + b >= 10:
      return "carry", self._body(v, op, b, v + b - 10), (p + 1, v + b - 10)
    if op == "-" and "borrow" in noise.bugs and v >= 10 and v % 10 < b:
      r = v - v % 10 + (b - v % 10)
      return "borrow", self._body(v, op, b, r), (p + 1, r)
    return None

  procedures = ("columns", "counting", "recall")

  def with_procedure(self, body: str, procedure: str) -> str:
    """The step as `procedure` writes it: its name first, and for 'columns' on a two-digit value the tens and the
    units column before the result ("by columns, 17 + 5 = 10 + 12 = 22"; without the carry "... = 10 + 2 = 12"), so
    the route it took is in the tokens right before its result."""
    parsed = self.parse_step(body)
    if procedure == "columns" and parsed is not None and parsed[0] >= 10:
      a, op, b, r = parsed
      tens = a - a % 10
      if op == "-" and r < tens:  # the borrow: one ten fewer, ten more units
        tens -= 10
      if op == "*":
        tens *= b
      body = f"{a} {op} {b} = {tens} + {r - tens} = {r}"
    return f"by {procedure}, {body}"

  def procedure_bug(self, problem: Problem, state: State, procedure: str) -> tuple[str, str, State] | None:
    """World v3's strategy forks (docs/tasks.md): the procedure's misconception where its condition holds, else None.
    'columns' on a two-digit value drops the carry of a units column that crosses a ten (17 + 5 = 10 + 2 = 12, 14 * 3
    = 30 + 2 = 32) and takes the smaller units digit from the larger where a borrow is needed (23 - 5 = 20 + 2 =
    22); 'counting' and 'recall' have none. The condition is in the operands, which the model has read when it
    writes the units column."""
    if procedure != "columns":
      return None
    p, v = state
    op, b = self.keys(problem)[p]
    r = None
    if op == "+" and v >= 10 and v % 10 + b >= 10:
      r = v + b - 10
    elif op == "-" and v >= 10 and v % 10 < b:
      r = v - v % 10 + (b - v % 10)
    elif op == "*" and v >= 10 and (v % 10) * b >= 10:
      r = (v - v % 10) * b + (v % 10) * b % 10
    if r is None or r == apply(op, v, b) or r < 0:
      return None
    return procedure, self._body(v, op, b, r), (p + 1, r)

  def error_rates(self, noise: Any) -> list[tuple[str, float]]:
    return [
      ("result", noise.p_wrong_result),
      ("operand", noise.p_wrong_operand),
      ("operation", noise.p_wrong_operation),
      ("skip", noise.p_skip),
    ]


register_task(Arithmetic())
