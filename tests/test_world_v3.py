"""World v3's strategy forks (docs/tasks.md, "Worlds"): procedures named in the steps, their misconceptions under
conditions of the operands, the checker reading them, and the build config's `world`."""

import collections
import dataclasses

import numpy as np
import pytest

from configs import target_synthetic
from reprobe_jax.errors import ConfigError
from reprobe_jax.jobs.target_config import SyntheticBuildConfig, config_from_dict
from reprobe_jax.tasks import Problem, get_family, make_problems
from reprobe_jax.tasks.formats import check_thinking, classify_paragraph
from reprobe_jax.tasks.traces import WORLDS, TraceNoise, solve, solve_many

ARITH = get_family("arithmetic")


def _problem(start, ops):
  v = start
  for op, b in ops:
    v = {"+": v + b, "-": v - b, "*": v * b}[op]
  return Problem(id="p", domain="arithmetic", question="q", answer=str(v), data={"start": start, "ops": ops})


@pytest.mark.parametrize(
  "start, op, b, procedure, written",
  [
    (17, "+", 5, "columns", 12),  # the carry dropped
    (23, "-", 5, "columns", 22),  # the smaller units digit from the larger
    (14, "*", 3, "columns", 32),  # 4 * 3 = 12: the 1 not carried into the tens
    (15, "*", 2, "columns", 20),
  ],
)
def test_procedure_bugs_worked_examples(start, op, b, procedure, written):
  p = _problem(start, [[op, b]])
  kind, body, state = ARITH.procedure_bug(p, (0, start), procedure)
  assert (kind, body, state) == (procedure, f"{start} {op} {b} = {written}", (1, written))
  assert ARITH.check_steps(p, [f"by {procedure}, {body}"]) == [1.0]


@pytest.mark.parametrize(
  "start, op, b, procedure",
  [
    (12, "+", 5, "columns"),  # 2 + 5 stays below ten
    (25, "-", 3, "columns"),  # no borrow
    (7, "*", 3, "columns"),  # one digit: no column to carry into
    (7, "+", 5, "columns"),
    (12, "*", 2, "columns"),
    (17, "+", 5, "counting"),  # the other procedures have no misconception
    (23, "-", 5, "recall"),
  ],
)
def test_procedure_bugs_need_their_condition(start, op, b, procedure):
  assert ARITH.procedure_bug(_problem(start, [[op, b]]), (0, start), procedure) is None


def test_checker_reads_the_procedure_name():
  p = _problem(17, [["+", 5], ["*", 2]])
  assert ARITH.parse_step("by columns, 17 + 5 = 22") == (17, "+", 5, 22)
  assert ARITH.parse_step("by columns, 17 + 5 = 10 + 2 = 12") == (17, "+", 5, 12)
  assert ARITH.parse_step("17 + 5 = 10 + = 12") is None
  # The columns procedure writes a two-digit value's tens and units column before the result.
  for body, written in [
    ("17 + 5 = 22", "by columns, 17 + 5 = 10 + 12 = 22"),
    ("17 + 5 = 12", "by columns, 17 + 5 = 10 + 2 = 12"),  # the carry dropped
    ("23 - 5 = 18", "by columns, 23 - 5 = 10 + 8 = 18"),  # the borrow
    ("23 - 5 = 22", "by columns, 23 - 5 = 20 + 2 = 22"),
    ("14 * 3 = 42", "by columns, 14 * 3 = 30 + 12 = 42"),
    ("7 + 5 = 12", "by columns, 7 + 5 = 12"),  # one column
  ]:
    assert ARITH.with_procedure(body, "columns") == written
    assert ARITH.parse_step(written) == ARITH.parse_step(body)
  assert ARITH.with_procedure("17 + 5 = 22", "recall") == "by recall, 17 + 5 = 22"
  assert ARITH.parse_step("By Counting , 17 + 5 = 22") == (17, "+", 5, 22)
  assert ARITH.parse_step("by columns 17 + 5 = 22") is None  # the comma belongs to the name
  assert ARITH.parse_step("17 X 5 = 85") is None  # the name's case rule does not reach the operator
  # The error propagates as before: 12 * 2 = 24 builds right on the written 12.
  assert ARITH.check_steps(p, ["by columns, 17 + 5 = 12", "by recall, 12 * 2 = 24"]) == [1.0, 0.0]
  paragraphs = [
    "Step 1: by counting, 17 + 5 = 22.",
    "Step 2: by recall, 22 * 2 = 44.",
    "So the answer is 44.",
    "Wait, let me check: by counting, 17 + 5 = 22.",
  ]
  assert [classify_paragraph(p, x) for x in paragraphs] == ["step", "step", "other", "reflect"]
  assert check_thinking(p, paragraphs) == [0.0, 0.0, 0.0, 0.0]


def test_v3_traces_fork_and_the_labels_agree():
  noise = WORLDS["v3"]
  problems = [q for d in (1, 2, 3) for q in make_problems("arithmetic", 60, 7, d)]
  traces = solve_many(problems, "line", seed=3, noise=noise, samples=4)
  named = collections.Counter(step.split(",")[0] for t in traces for step in t.steps)
  total = sum(named.values())
  assert set(named) == {"by columns", "by counting", "by recall"}
  for name, weight in noise.procedures:  # drawn by weight (about 2,800 steps: within 0.04)
    assert abs(named[f"by {name}"] / total - weight) < 0.04
  by_problem = collections.defaultdict(set)
  for t in traces:
    by_problem[t.problem_id].add(t.answer)
    checked = ARITH.check_steps(next(q for q in problems if q.id == t.problem_id), t.steps)
    assert checked == t.labels  # the procedure names change nothing the checker reads
  # Samples of one problem disagree far more often than in v2, where every sample shares the same bug.
  v2 = solve_many(problems, "line", seed=3, noise=WORLDS["v2"], samples=4)
  v2_answers = collections.defaultdict(set)
  for t in v2:
    v2_answers[t.problem_id].add(t.answer)
  assert np.mean([len(a) for a in by_problem.values()]) > np.mean([len(a) for a in v2_answers.values()]) + 0.3


def test_columns_goes_wrong_where_a_column_carries():
  rng = np.random.default_rng(0)
  p = _problem(17, [["+", 5]])
  only_columns = dataclasses.replace(
    WORLDS["v3"],
    procedures=(("columns", 1.0),),
    **{f: 0.0 for f in ("p_wrong_result", "p_wrong_operand", "p_wrong_operation", "p_skip")},
  )
  answers = collections.Counter(solve(p, ARITH, rng, "line", only_columns).answer for _ in range(200))
  assert answers["12"] > 170 and answers["12"] + answers["22"] == 200  # p_bug = 0.95 of 200


def test_thinking_fix_names_a_procedure_that_gets_it_right():
  noise = dataclasses.replace(WORLDS["v3"], p_recheck=1.0, p_w2r=1.0)
  problems = [q for d in (1, 2, 3) for q in make_problems("arithmetic", 80, 11, d)]
  fixed = [t for t in solve_many(problems, "thinking", seed=5, noise=noise) if t.w2r]
  assert fixed
  for t in fixed:
    p = next(q for q in problems if q.id == t.problem_id)
    assert t.correct and check_thinking(p, t.steps) == t.labels
    assert all(s.split(":", 1)[-1].strip().lower().startswith("by ") for s, k in zip(t.steps, t.kinds) if k != "other")


def test_trace_noise_checks_its_procedures():
  with pytest.raises(ConfigError, match="unknown procedure"):
    TraceNoise(procedures=(("abacus", 1.0),))
  with pytest.raises(ConfigError, match="named twice"):
    TraceNoise(procedures=(("columns", 1.0), ("columns", 2.0)))
  with pytest.raises(ConfigError, match="above 0"):
    TraceNoise(procedures=(("columns", 0.0),))


def test_build_config_world():
  v2 = config_from_dict(target_synthetic.get_config("v2"))
  assert v2.world == "v2" and v2.noise == TraceNoise() == SyntheticBuildConfig().noise
  c = target_synthetic.get_config()  # the built-in default is v3
  assert config_from_dict(c).noise == WORLDS["v3"]
  c.noise.p_bug = 0.8  # an override applies on top of the world's noise
  v3 = config_from_dict(c)
  assert v3.noise == dataclasses.replace(WORLDS["v3"], p_bug=0.8)
  assert v3.key() != v2.key()
  c.world = "v4"
  with pytest.raises(ConfigError, match="config.world"):
    config_from_dict(c)
  with pytest.raises(ConfigError, match="world"):
    SyntheticBuildConfig(world="v4")
