"""Problem records, the task interface and its registry, and the synthetic families' base class.

A task (`Task`) is what a job needs to know about a kind of problem: how to ask it (the user message, worked
examples), how to read a response (steps and the final answer, in either response format of docs/method.md §A1),
whether an answer is right (equivalence with the reference), and, where it can, whether each step is right (an exact
checker: the rule-based annotator of docs/method.md §A2(a)). Tasks are registered by name in `TASKS`; a problem's
`domain` names its task, so user code adds a kind of problem by registering a `Task` (`register_task`).

A synthetic family (`TaskFamily`) is a task with a generator, a scripted solver and an exact checker. A family is a small state machine over the steps of a solution. `judge_step` takes the state left by the steps
*as written* and one parsed step, and says whether that step follows validly; the state it returns is built from
what the step wrote, right or wrong, so an error is counted where it happens and later steps that build correctly
on a wrong value are correct.
"""

from __future__ import annotations

import abc

import copy
import dataclasses
import math
import re
import unicodedata
import zlib
from typing import Any, Hashable, Sequence

import numpy as np

from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.registry import Registry

DIFFICULTIES = (1, 2, 3)
_FIELDS = (("id", str), ("domain", str), ("question", str), ("answer", str), ("data", dict))

State = Hashable  # a family's checker state: a small tuple, compared with ==


@dataclasses.dataclass(frozen=True)
class Problem:
  """One task instance: the question states it fully; `data` holds what the checker needs (JSON-serialisable)."""

  id: str
  domain: str
  question: str
  answer: str
  # A dict cannot be hashed; the id already identifies the problem.
  data: dict = dataclasses.field(default_factory=dict, hash=False)

  def to_json(self) -> dict:
    """The JSONL record of this problem (docs/tasks.md gives the schema)."""
    return {
      "id": self.id,
      "domain": self.domain,
      "question": self.question,
      "answer": self.answer,
      "data": copy.deepcopy(self.data),
    }

  @classmethod
  def from_json(cls, record: Any, where: str = "<record>") -> Problem:
    """Builds a Problem from a JSON record, raising DataFormatError that starts with `where` on any defect.

    Unknown top-level keys are ignored, so records may carry extra fields (split, source, ...).
    """
    if not isinstance(record, dict):
      raise DataFormatError(f"{where}: expected a JSON object, found {type(record).__name__}")
    values = {}
    for name, kind in _FIELDS:
      if name not in record:
        raise DataFormatError(f"{where}: missing field {name!r} (a problem needs id, domain, question, answer, data)")
      value = record[name]
      if not isinstance(value, kind):
        raise DataFormatError(f"{where}: field {name!r} must be {kind.__name__}, found {type(value).__name__}")
      values[name] = value
    if not values["id"]:
      raise DataFormatError(f"{where}: field 'id' is empty")
    if values["domain"] not in TASKS:
      raise DataFormatError(
        f"{where}: field 'domain' names no registered task: {values['domain']!r} (registered: "
        f"{', '.join(TASKS.names())}; `reprobe_jax.tasks.register_task` adds one)"
      )
    problem = cls(**values)
    get_task(problem.domain).validate(problem, where)
    return problem


def advance_pointer(keys: Sequence[Hashable], p: int, key: Hashable, next_key: Hashable | None) -> tuple[bool, int]:
  """Matches a written step's key (operation, relation) against the expected sequence `keys` at position `p`.

  Returns (matched, new p). A key from later in the sequence is a skip: the pointer jumps past it, so the steps
  after a skip are judged against the operations that really follow. A key from nowhere is either an invented
  step (the next written step is the expected one, so the pointer stays) or a wrong version of the expected step
  (the pointer moves on). When keys[p] == keys[p+1] the two readings coincide, and the pointer moves on.
  """
  n = len(keys)
  if p < n and key == keys[p]:
    return True, p + 1
  for q in range(p + 1, n):
    if keys[q] == key:
      return False, q + 1
  if p < n and next_key == keys[p] and (p + 1 >= n or next_key != keys[p + 1]):
    return False, p
  return False, min(p + 1, n)


def first_error(labels: Sequence[float]) -> int | None:
  """Index of the first incorrect step (label 1), ProcessBench style; None when no step is labelled incorrect.

  NaN (unknown) labels are passed over: they are neither an error nor evidence of correctness.
  """
  for i, label in enumerate(labels):
    if not math.isnan(label) and label >= 0.5:
      return i
  return None


def read_int(digits: str) -> int | None:
  """The integer a step writes (an optional '-' and decimal digits), or None when it has more digits than Python
  converts (its int-string limit, 4300 by default): a checker reads such a number as no number, so the step is
  unparseable (label NaN) instead of crashing the labelling."""
  try:
    return int(digits)
  except ValueError:
    return None


def integer_text(text: str) -> str | None:
  """The canonical decimal form of an integer answer ('007' -> '7', '-0' -> '0', Unicode digits -> ASCII), or None
  when `text` is not '-'? digits; no int() conversion, so an answer of any length is compared, never a crash."""
  m = re.fullmatch(r"(-?)(\d+)", text)
  if m is None:
    return None
  digits = "".join(str(unicodedata.decimal(c)) for c in m.group(2)).lstrip("0") or "0"
  return ("-" if m.group(1) and digits != "0" else "") + digits


def family_rng(name: str, seed: int, difficulty: int) -> np.random.Generator:
  """The generator for one (family, seed, difficulty): the same triple always gives the same stream."""
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ConfigError(f"seed must be a non-negative integer, found {seed!r}")
  if difficulty not in DIFFICULTIES:
    raise ConfigError(f"difficulty must be one of {DIFFICULTIES}, found {difficulty!r}")
  # crc32, not hash(): Python salts str hashes per process, which would break determinism across runs.
  return np.random.default_rng([int(seed), int(difficulty), zlib.crc32(name.encode())])


class Task(abc.ABC):
  """A kind of problem, as every job sees it (module docstring). Subclasses give `validate`, `user_prompt` and
  `normalize_answer`; the rest has defaults: responses read by the response formats' parsers
  (`tasks.response`), answers compared through `normalize_answer`, no worked examples and no exact step checker.
  """

  name: str = ""
  # Whether `judge_steps` labels steps exactly (the rule-based annotator of docs/method.md §A2(a)); a task without
  # gives NaN step labels, and its step labels come from an LLM judge or a file (docs/own-data.md).
  exact_steps: bool = False

  @abc.abstractmethod
  def validate(self, problem: Problem, where: str) -> None:
    """Raises DataFormatError naming `where` and the field when `problem` is not one this task can pose and check."""
    ...

  @abc.abstractmethod
  def user_prompt(self, problem: Problem, mode: str, *, example: bool = True, first_step: bool = False) -> str:
    """The user message: the question and how to lay out the steps and the answer in response format `mode`.

    example: the format instruction may show a made-up step (left out after worked examples, which show it);
    first_step: spell out where the first step starts when the question leaves it implicit.
    """
    ...

  def worked_examples(
    self, mode: str, k: int, *, first_step: bool = False, goal_mark: bool = False
  ) -> list[tuple[str, str]]:
    """k (user message, assistant response) pairs shown before the problem as earlier chat turns; ConfigError
    when the task has fewer than k."""
    if k:
      raise ConfigError(f"task {self.name!r} has no worked examples; asked for {k}")
    return []

  def parse_response(self, text: str, mode: str) -> tuple[list[str], str | None]:
    """(the response's steps, its final answer as written or None) in response format `mode`."""
    from reprobe_jax.tasks.response import parse_line, parse_thinking

    return parse_line(text) if mode == "line" else parse_thinking(text)

  @abc.abstractmethod
  def normalize_answer(self, answer: str) -> str | None:
    """The canonical form of an answer (equal forms, equal answers; the key answers are voted on by), or None
    when `answer` is not an answer of this task."""
    ...

  def is_equivalent(self, predicted: str, reference: str) -> bool:
    """Whether two answers are the same answer (by default: equal canonical forms)."""
    given = self.normalize_answer(predicted)
    return given is not None and given == self.normalize_answer(reference)

  def check_answer(self, problem: Problem, answer: str | None) -> bool:
    """Whether `answer` equals the problem's true answer (not the answer the written steps imply): the outcome
    label every task has."""
    return answer is not None and self.is_equivalent(answer, problem.answer)

  def judge_steps(self, problem: Problem, steps: Sequence[str], mode: str) -> list[float]:
    """Per-step labels (1.0 incorrect, 0.0 correct, NaN unknown; docs/method.md §A2) of `steps` as
    `parse_response` cut them; all NaN for a task without an exact checker (`exact_steps` False)."""
    return [math.nan] * len(steps)

  def reference_steps(self, problem: Problem) -> list[str]:
    """A correct solution's steps, shown to an LLM judge (docs/method.md §A2(b)); [] when the task has none."""
    return []


# Every task registers one instance under its name when its module is imported (the package imports the built-in
# ones); the synthetic families are also in FAMILIES.
TASKS: Registry[Task] = Registry("task")


def register_task(task: Task) -> Task:
  """Registers `task` under `task.name` (a family also as a family) and returns it; ConfigError when the name is
  taken or `task` is not a Task."""
  if not isinstance(task, Task):
    raise ConfigError(f"register_task needs a Task instance, got {type(task).__name__}")
  TASKS.register(task.name, task)
  if isinstance(task, TaskFamily):
    FAMILIES.register(task.name, task)
  return task


def get_task(name: str) -> Task:
  """The task called `name` (one of TASKS); ConfigError naming the registered ones otherwise."""
  return TASKS.get(name)


class TaskFamily(Task):
  """Base class of a task family: generator, scripted solver and exact step checker (docs/method.md §A2(a)).

  Subclasses implement the state machine (`initial_state`, `parse_step`, `step_key`, `judge_step`, `is_done`,
  `state_answer`, `match_score`), the solver moves (`honest_step`, `error_step`, `error_rates`), `generate`,
  `validate` and `normalize_answer`; checking, prompts and reference solutions are shared here, and
  `tasks.family.SyntheticFamily` adds exact labels in both response formats and worked examples.
  """

  exact_steps = True
  step_hint: str = ""  # one sentence for the prompt: how a step is written, with a made-up example
  step_rule: str = ""  # the same without the example, for prompts whose worked examples already show the format
  flip_kinds: tuple[str, ...] = ()  # error kinds a right-to-wrong re-check may use, in order of preference
  # What a step may end with to say it completes the chain (planning: ' (the goal)'); the checker accepts it and
  # judges a false claim wrong. Worked examples carry it under `TrajectoryConfig.goal_mark`; '' for none.
  done_mark: str = ""
  # World v3's strategy forks (docs/tasks.md): the procedures a step may name ("by columns, ..."), each with the
  # misconception `procedure_bug` gives; () for a family without forks.
  procedures: tuple[str, ...] = ()

  # --- generation -------------------------------------------------------------------------------------------

  @abc.abstractmethod
  def generate(self, seed: int, difficulty: int) -> Problem:
    """A problem that depends only on (seed, difficulty); difficulty in 1..3."""
    ...

  @abc.abstractmethod
  def validate(self, problem: Problem, where: str) -> None:
    """Raises DataFormatError naming `where` and the field when `problem.data` is not what the checker needs."""
    ...

  @abc.abstractmethod
  def max_steps(self, problem: Problem) -> int:
    """An upper bound on the length of a (possibly erroneous) scripted solution, so solving always ends."""
    ...

  def first_step_question(self, problem: Problem) -> str:
    """The question with its first step's starting point spelled out where the question leaves it implicit
    (`TrajectoryConfig.first_step`); this default, for families whose question already gives it, is the question."""
    return problem.question

  # --- checker state machine --------------------------------------------------------------------------------

  @abc.abstractmethod
  def initial_state(self, problem: Problem) -> State: ...

  @abc.abstractmethod
  def parse_step(self, body: str) -> Any | None:
    """The parsed step, or None when the text is not a step of this family."""
    ...

  def step_key(self, parsed: Any) -> Hashable | None:
    """What identifies which operation a parsed step performs (for `advance_pointer`'s look-ahead)."""
    return None

  @abc.abstractmethod
  def judge_step(self, problem: Problem, state: State, parsed: Any, next_parsed: Any | None) -> tuple[bool, State]:
    """(step is correct, state after the step as written); `next_parsed` is the next parsed step, if any."""
    ...

  @abc.abstractmethod
  def is_done(self, problem: Problem, state: State) -> bool: ...

  @abc.abstractmethod
  def state_answer(self, problem: Problem, state: State) -> str:
    """The answer the steps written so far imply (meaningful once `is_done`)."""
    ...

  @abc.abstractmethod
  def match_score(self, problem: Problem, state: State, parsed: Any) -> int:
    """How well a re-check step fits an earlier step taken from `state`: 2 exactly, 1 partly, 0 not at all."""
    ...

  @abc.abstractmethod
  def normalize_answer(self, answer: str) -> str | None:
    """The canonical form of an answer string, or None when it is not an answer of this family."""
    ...

  # --- scripted solver moves ---------------------------------------------------------------------------------

  @abc.abstractmethod
  def honest_step(self, problem: Problem, state: State, rng: np.random.Generator | None) -> tuple[str, State]:
    """The correct next step from `state` (ties broken by `rng`, or deterministically when it is None)."""
    ...

  @abc.abstractmethod
  def error_step(self, problem: Problem, state: State, kind: str, rng: np.random.Generator) -> tuple[str, State] | None:
    """A wrong next step of the given kind from `state`, or None when that kind is impossible here."""
    ...

  @abc.abstractmethod
  def error_rates(self, noise: Any) -> list[tuple[str, float]]:
    """(error kind, per-step probability) pairs this family reads from a TraceNoise."""
    ...

  def bug_step(self, problem: Problem, state: State, noise: Any) -> tuple[str, str, State] | None:
    """(bug kind, body, state) when one of this family's buggy procedures applies at `state` and gives another step
    than the honest one, else None. A bug is a systematic misconception under a condition the question makes
    visible (docs/tasks.md, "Buggy procedures"): the scripted solver applies it with `noise.p_bug` wherever the
    condition holds, so a model trained on the traces writes those wrong steps with high confidence."""
    return None

  def with_procedure(self, body: str, procedure: str) -> str:
    """A step body as `procedure` writes it (world v3): its name first."""
    return f"by {procedure}, {body}"

  def procedure_bug(self, problem: Problem, state: State, procedure: str) -> tuple[str, str, State] | None:
    """(bug kind, body without the procedure's name, state) when `procedure` (one of `procedures`) goes wrong at
    `state`, else None (docs/tasks.md, "Strategy forks")."""
    return None

  # --- shared -------------------------------------------------------------------------------------------------

  def reference_steps(self, problem: Problem) -> list[str]:
    """The scripted solver's correct step bodies (no '- Step k:' prefix)."""
    state = self.initial_state(problem)
    steps = []
    while not self.is_done(problem, state):
      if len(steps) >= self.max_steps(problem):
        raise DataFormatError(f"problem {problem.id}: the reference solution does not reach the goal")
      body, state = self.honest_step(problem, state, None)
      steps.append(body)
    return steps

  def check_steps(self, problem: Problem, steps: Sequence[str]) -> list[float]:
    """Per-step labels (docs/method.md §A2(a)): 1.0 incorrect, 0.0 correct, NaN when the step is empty or unparseable.

    A step is correct when it follows validly from the problem and the previous steps as written. An unparseable
    step leaves the state unchanged.
    """
    parsed = [self.parse_step(s) for s in steps]
    state = self.initial_state(problem)
    labels = []
    for i, step in enumerate(parsed):
      if step is None:
        labels.append(math.nan)
        continue
      following = next((q for q in parsed[i + 1 :] if q is not None), None)
      ok, state = self.judge_step(problem, state, step, following)
      labels.append(0.0 if ok else 1.0)
    return labels

  def user_prompt(self, problem: Problem, mode: str, *, example: bool = True, first_step: bool = False) -> str:
    """The question (with its first step's start spelled out when `first_step`), then the family's step hint (its
    made-up example left out unless `example`) and the response format's layout."""
    question = self.first_step_question(problem) if first_step else problem.question
    hint = self.step_hint if example or not self.step_rule else self.step_rule
    # Kept short: the built-in tiny model reads every prompt token on two CPU cores, many thousand times.
    if mode == "line":
      how = f"Solve step by step, one '- Step k:' line each ({hint}), then '<Answer>: ...'."
    else:
      how = f"Think in <think> paragraphs ({hint}), then '**Final Answer**' and \\boxed{{}}."
    return f"{question}\n\n{how}"

  first_error = staticmethod(first_error)

  def data_error(self, where: str, message: str) -> DataFormatError:
    """A DataFormatError that names the record and this family."""
    return DataFormatError(f"{where}: {self.name} data: {message}")


# The synthetic families (generators and scripted solvers), registered by `register_task`.
FAMILIES: Registry[TaskFamily] = Registry("synthetic task family")


def get_family(name: str) -> TaskFamily:
  """The synthetic family called `name` (one of FAMILIES); ConfigError naming the known ones otherwise."""
  return FAMILIES.get(name)
