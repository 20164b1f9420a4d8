"""Task families: deterministic generators, exact checkers (docs/method.md §A2(a)), formats (A1, B1), noisy traces,
JSONL."""

import dataclasses
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reprobe_jax.errors import ConfigError, DataFormatError, ReprobeError
from reprobe_jax.tasks import (
  FAMILIES,
  Problem,
  TraceNoise,
  check_response,
  check_thinking,
  classify_paragraph,
  first_error,
  get_family,
  make_problems,
  parse_line,
  parse_thinking,
  read_problems,
  render_line,
  render_thinking,
  solve,
  solve_many,
  step_texts_for_check,
  user_prompt,
)
from reprobe_jax.io.atomic import write_jsonl
from reprobe_jax.tasks import traces as traces_module
from reprobe_jax.tasks.traces import BUG_KINDS
from reprobe_jax.tasks.arithmetic import apply
from reprobe_jax.tasks.formats import conclude_paragraph, reflect_paragraph, work_paragraph
from reprobe_jax.tasks.planning import graph

NAN = math.nan
families = st.sampled_from(sorted(FAMILIES))
seeds = st.integers(0, 2**32 - 1)
difficulties = st.sampled_from([1, 2, 3])


def same(labels, expected):
  """Label lists equal, NaN matching NaN."""
  return len(labels) == len(expected) and all(
    (math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(labels, expected)
  )


# --- hand-made problems -----------------------------------------------------------------------------------------

# 12 + 5 = 17, 17 * 3 = 51, 51 - 4 = 47, 47 + 10 = 57
ARITH = Problem(
  id="arith",
  domain="arithmetic",
  question="Start with 12. Add 5. Multiply by 3. Subtract 4. Add 10.",
  answer="57",
  data={"start": 12, "ops": [["+", 5], ["*", 3], ["-", 4], ["+", 10]]},
)
ARITH_REF = ["12 + 5 = 17", "17 * 3 = 51", "51 - 4 = 47", "47 + 10 = 57"]

# Distances to the cellar: attic 1, study 1, kitchen 2, hall 2, den 3. Shortest hall -> cellar: 2 moves.
PLAN = Problem(
  id="plan",
  domain="planning",
  question="(walk from the hall to the cellar)",
  answer="2",
  data={
    "rooms": ["attic", "cellar", "den", "hall", "kitchen", "study"],
    "doors": [
      ["hall", "kitchen"],
      ["attic", "kitchen"],
      ["attic", "cellar"],
      ["hall", "study"],
      ["cellar", "study"],
      ["den", "kitchen"],
    ],
    "start": "hall",
    "goal": "cellar",
  },
)
PLAN_REF = ["move from hall to study", "move from study to cellar"]

_BOSS = {"Alice": "Beth", "Beth": "Carl", "Carl": "Dana", "Dana": "Alice"}
_FRIEND = {"Alice": "Carl", "Beth": "Dana", "Carl": "Alice", "Dana": "Beth"}
_RIVAL = {"Alice": "Dana", "Beth": "Alice", "Carl": "Beth", "Dana": "Carl"}
# boss of Alice = Beth, friend of Beth = Dana, boss of Dana = Alice
QA = Problem(
  id="qa",
  domain="qa",
  question="(who is the boss of the friend of the boss of Alice?)",
  answer="Alice",
  data={
    "people": ["Alice", "Beth", "Carl", "Dana"],
    "relations": ["boss", "friend", "rival"],
    "facts": [
      [s, r, o] for r, table in (("boss", _BOSS), ("friend", _FRIEND), ("rival", _RIVAL)) for s, o in table.items()
    ],
    "start": "Alice",
    "hops": ["boss", "friend", "boss"],
  },
)
QA_REF = ["the boss of Alice is Beth", "the friend of Beth is Dana", "the boss of Dana is Alice"]


def test_hand_made_problems_are_valid_and_references_match():
  for problem, ref in ((ARITH, ARITH_REF), (PLAN, PLAN_REF), (QA, QA_REF)):
    family = get_family(problem.domain)
    family.validate(problem, "test")
    assert family.reference_steps(problem) == ref
    assert family.check_steps(problem, ref) == [0.0] * len(ref)
    assert family.check_answer(problem, problem.answer)


# --- determinism and generator properties -----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(families, seeds, difficulties)
def test_generate_is_deterministic_and_json_round_trips(name, seed, difficulty):
  family = get_family(name)
  a, b = family.generate(seed, difficulty), family.generate(seed, difficulty)
  assert a == b and a.data == b.data
  record = json.loads(json.dumps(a.to_json()))
  assert Problem.from_json(record, where="x") == a
  assert a.domain == name and a.question and a.answer


def test_generate_is_independent_of_the_process():
  """crc32 seeding: another interpreter with another string-hash salt makes the same problems."""
  code = (
    "import json; from reprobe_jax.tasks import FAMILIES; "
    "print(json.dumps([f.generate(7, d).to_json() for f in FAMILIES.values() for d in (1, 2, 3)]))"
  )
  env = dict(os.environ, PYTHONHASHSEED="12345")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
  here = [f.generate(7, d).to_json() for f in FAMILIES.values() for d in (1, 2, 3)]
  assert json.loads(out) == here


def test_different_seeds_give_different_problems():
  for name, family in FAMILIES.items():
    questions = {family.generate(seed, 2).question for seed in range(30)}
    assert len(questions) >= 25, name


def test_make_problems_unique_ids_distinct_questions_deterministic():
  for name in FAMILIES:
    a = make_problems(name, 40, seed=3, difficulty=1)
    assert a == make_problems(name, 40, seed=3, difficulty=1)
    assert len({p.id for p in a}) == 40 and len({p.question for p in a}) == 40
    assert {p.id for p in a}.isdisjoint({p.id for p in make_problems(name, 40, seed=4, difficulty=1)})
    assert all(p.id.startswith(f"{name}-d1-s3-") for p in a)


@settings(max_examples=60, deadline=None)
@given(seeds, difficulties)
def test_arithmetic_values_stay_small(seed, difficulty):
  problem = get_family("arithmetic").generate(seed, difficulty)
  ops = problem.data["ops"]
  assert {1: {2, 3}, 2: {3}, 3: {3, 4}}[difficulty] >= {len(ops)}
  v = problem.data["start"]
  assert 1 <= v <= 20
  for op, b in ops:
    assert op in "+-*" and 1 <= b <= (9 if op in "+-" else 3)
    v = apply(op, v, b)
    assert 0 <= v <= 30
  assert problem.answer == str(v)


@settings(max_examples=40, deadline=None)
@given(seeds, difficulties)
def test_planning_and_qa_sizes(seed, difficulty):
  plan = get_family("planning").generate(seed, difficulty)
  _, dist = graph(plan)
  assert len(plan.data["rooms"]) == {1: 5, 2: 6, 3: 7}[difficulty]
  lo, hi = {1: (1, 2), 2: (2, 3), 3: (3, 4)}[difficulty]
  assert dist[plan.data["start"]] == int(plan.answer) and lo <= int(plan.answer) <= hi
  assert plan.data["start"] in plan.question and plan.data["goal"] in plan.question
  adj, _ = graph(plan)  # every room's doors, listed as a step writes a move
  for room, nbs in adj.items():
    listed = next(part for part in plan.question.split("Doors: ")[1].split("; ") if part.startswith(f"from {room} "))
    assert sorted(listed.split(" to ")[1].rstrip(". How many moves is that?").split(" or ")) == sorted(nbs)
  qa = get_family("qa").generate(seed, difficulty)
  assert len(qa.data["hops"]) == {1: 2, 2: 3, 3: 3}[difficulty]
  assert len(qa.data["people"]) == {1: 3, 2: 4, 3: 4}[difficulty] and all(p.isdigit() for p in qa.data["people"])
  assert all(r.isdigit() for r in plan.data["rooms"])
  assert all(a != b for a, b in zip(qa.data["hops"], qa.data["hops"][1:]))
  assert all(f"the {r} of {s} is {o}" in qa.question for s, r, o in qa.data["facts"])


def test_bad_arguments_raise_config_errors():
  with pytest.raises(ConfigError, match="unknown synthetic task family 'geometry'"):
    get_family("geometry")
  with pytest.raises(ConfigError, match="difficulty"):
    get_family("qa").generate(0, 4)
  with pytest.raises(ConfigError, match="seed"):
    get_family("qa").generate(-1, 1)
  with pytest.raises(ConfigError, match="answer mode"):
    user_prompt(ARITH, "sentence")
  with pytest.raises(ConfigError, match="p_r2w"):
    TraceNoise(p_r2w=1.5)
  with pytest.raises(ConfigError, match="planning"):
    TraceNoise(p_illegal_move=0.6, p_detour=0.6)


# --- every checker accepts every reference solution -------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(families, seeds, difficulties)
def test_checkers_accept_reference_solutions_in_both_formats(name, seed, difficulty):
  family = get_family(name)
  problem = family.generate(seed, difficulty)
  ref = family.reference_steps(problem)
  steps, answer = parse_line(render_line(ref, problem.answer))
  assert steps == ref and answer == problem.answer
  assert family.check_steps(problem, steps) == [0.0] * len(ref)
  assert family.check_answer(problem, answer) and first_error(family.check_steps(problem, steps)) is None
  paragraphs = [work_paragraph(s, i + 1) for i, s in enumerate(ref)] + [conclude_paragraph(problem.answer)]
  paragraphs += [reflect_paragraph(s, i) for i, s in enumerate(ref)]
  parsed, answer = parse_thinking(render_thinking(paragraphs, problem.answer))
  assert parsed == paragraphs and answer == problem.answer
  assert check_thinking(problem, parsed) == [0.0] * len(paragraphs)
  checked = check_response(problem, render_thinking(paragraphs, problem.answer), "thinking")
  assert checked.correct and checked.first_error is None


# --- hand-made wrong steps ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "steps,expected",
  [
    (ARITH_REF, [0, 0, 0, 0]),
    # wrong result; the later steps build correctly on 50, so they are correct
    (["12 + 5 = 17", "17 * 3 = 50", "50 - 4 = 46", "46 + 10 = 56"], [0, 1, 0, 0]),
    # wrong operand (the problem's 3 misread as 4)
    (["12 + 5 = 17", "17 * 4 = 68", "68 - 4 = 64", "64 + 10 = 74"], [0, 1, 0, 0]),
    # wrong operation
    (["12 + 5 = 17", "17 + 3 = 20", "20 - 4 = 16", "16 + 10 = 26"], [0, 1, 0, 0]),
    # skipped operation (* 3): the skip is wrong, what follows is judged against the real next operation
    (["12 + 5 = 17", "17 - 4 = 13", "13 + 10 = 23"], [0, 1, 0]),
    # invented operation (+ 2)
    (["12 + 5 = 17", "17 + 2 = 19", "19 * 3 = 57", "57 - 4 = 53", "53 + 10 = 63"], [0, 1, 0, 0, 0]),
    # left operand is not the previous written result
    (["12 + 5 = 17", "18 * 3 = 54", "54 - 4 = 50", "50 + 10 = 60"], [0, 1, 0, 0]),
    # after a wrong result, a step that uses the true value instead of the written one is wrong
    (["12 + 5 = 17", "17 * 3 = 50", "51 - 4 = 47", "47 + 10 = 57"], [0, 1, 1, 0]),
    # operations out of order: a skip, then an invented (displaced) step
    (["12 * 3 = 36", "36 + 5 = 41", "41 - 4 = 37", "37 + 10 = 47"], [1, 1, 0, 0]),
    # an extra step after the chain is complete
    (ARITH_REF + ["57 + 1 = 58"], [0, 0, 0, 0, 1]),
    # unparseable and empty steps are unknown and change nothing
    (["12 + 5 = 17", "I think so", "", "17 * 3 = 51", "51 - 4 = 47", "47 + 10 = 57"], [0, NAN, NAN, 0, 0, 0]),
    # tolerated spellings
    (["12+5=17.", "17 x 3 = 51", "51 − 4 = 47", "47 + 10 = 57"], [0, 0, 0, 0]),
  ],
)
def test_arithmetic_checker(steps, expected):
  assert same(get_family("arithmetic").check_steps(ARITH, steps), [float(x) for x in expected])


@pytest.mark.parametrize(
  "steps,expected",
  [
    (PLAN_REF, [0, 0]),
    (["Move from the hall to the study.", "move from study to cellar"], [0, 0]),
    # illegal move (no door hall-attic), then a legal shortest move from where the walk says it is
    (["move from hall to attic", "move from attic to cellar"], [1, 0]),
    # a real door that is not on a shortest route
    (["move from hall to kitchen", "move from kitchen to attic", "move from attic to cellar"], [1, 0, 0]),
    # a move that does not start where the walk is
    (["move from kitchen to attic", "move from attic to cellar"], [1, 0]),
    # a move that starts where a wrong move should have ended, not where it did
    (["move from hall to kitchen", "move from study to cellar"], [1, 1]),
    # an unknown room, and a move from it
    (["move from hall to garage", "move from garage to cellar"], [1, 1]),
    # a move away from the goal once it is reached
    (PLAN_REF + ["move from cellar to attic"], [0, 0, 1]),
    (["walk to the study", "move from hall to study", "move from study to cellar"], [NAN, 0, 0]),
  ],
)
def test_planning_checker(steps, expected):
  assert same(get_family("planning").check_steps(PLAN, steps), [float(x) for x in expected])


@pytest.mark.parametrize(
  "steps,expected",
  [
    (QA_REF, [0, 0, 0]),
    (["The boss of alice is beth.", "the friend of Beth is Dana", "the boss of Dana is Alice"], [0, 0, 0]),
    # wrong entity; later lookups from Carl are right lookups
    (["the boss of Alice is Carl", "the friend of Carl is Alice", "the boss of Alice is Beth"], [1, 0, 0]),
    # wrong relation (rival is not in the chain), looked up correctly
    (["the rival of Alice is Dana", "the friend of Dana is Beth", "the boss of Beth is Carl"], [1, 0, 0]),
    # subject is not the previous written result
    (["the boss of Alice is Beth", "the friend of Carl is Alice", "the boss of Alice is Beth"], [0, 1, 0]),
    # skipped hop (friend): the boss lookup comes too early
    (["the boss of Alice is Beth", "the boss of Beth is Carl"], [0, 1]),
    # a fact the base does not hold
    (["the boss of Alice is Beth", "the friend of Beth is Carl", "the boss of Carl is Dana"], [0, 1, 0]),
    # an invented extra hop; the expected hop that follows builds correctly on what it wrote
    (["the boss of Alice is Beth", "the rival of Beth is Alice", "the friend of Alice is Carl"], [0, 1, 0]),
    # a lookup after the chain is complete
    (QA_REF + ["the friend of Alice is Carl"], [0, 0, 0, 1]),
    (["Beth", "the boss of Alice is Beth"], [NAN, 0]),
  ],
)
def test_qa_checker(steps, expected):
  assert same(get_family("qa").check_steps(QA, steps), [float(x) for x in expected])


def _renumber(problem, steps, names):
  """The problem and steps with every name (whole words, any case) replaced by its number."""
  number = {n.lower(): str(i) for i, n in enumerate(names, start=1)}
  pattern = re.compile(r"\b(" + "|".join(number) + r")\b", re.IGNORECASE)
  sub = lambda text: pattern.sub(lambda m: number[m.group(1).lower()], text)
  return (
    Problem.from_json(json.loads(sub(json.dumps(problem.to_json()))), where="renumbered"),
    [sub(s) for s in steps],
  )


@pytest.mark.parametrize(
  "family,problem,names,cases",
  [
    (
      "planning",
      PLAN,
      ["attic", "cellar", "den", "hall", "kitchen", "study"],
      [
        (["move from hall to study", "move from study to cellar"], [0, 0]),
        (["move from room hall to room study", "Move from study to cellar."], [0, 0]),
        (["move from hall to attic", "move from attic to cellar"], [1, 0]),
        (["move from hall to kitchen", "move from study to cellar"], [1, 1]),
        (["move from hall to kitchen", "move from kitchen to attic", "move from attic to cellar"], [1, 0, 0]),
      ],
    ),
    (
      "qa",
      QA,
      ["Alice", "Beth", "Carl", "Dana"],
      [
        (QA_REF, [0, 0, 0]),
        (["the boss of Alice is Carl", "the friend of Carl is Alice", "the boss of Alice is Beth"], [1, 0, 0]),
        (["the boss of Alice is Beth", "the friend of Carl is Alice", "the boss of Alice is Beth"], [0, 1, 0]),
        (["the boss of Alice is Beth", "the boss of Beth is Carl"], [0, 1]),
      ],
    ),
  ],
)
def test_numbered_rooms_and_people_check_like_named_ones(family, problem, names, cases):
  """The generators number rooms and people; the checkers judge a numbered problem as they judge a named one."""
  fam = get_family(family)
  for steps, expected in cases:
    numbered, numbered_steps = _renumber(problem, steps, names)
    fam.validate(numbered, "test")
    assert numbered_steps != steps and same(fam.check_steps(numbered, numbered_steps), [float(x) for x in expected])
  numbered, _ = _renumber(problem, [], names)
  assert fam.check_answer(numbered, numbered.answer)


def test_answers_are_checked_against_the_truth_not_the_chain():
  arith, plan, qa = get_family("arithmetic"), get_family("planning"), get_family("qa")
  assert arith.check_answer(ARITH, " 57.") and not arith.check_answer(ARITH, "56")
  assert not arith.check_answer(ARITH, None)
  assert not arith.check_answer(ARITH, "fifty-seven")
  assert plan.check_answer(PLAN, "2 moves") and not plan.check_answer(PLAN, "3")
  assert qa.check_answer(QA, "alice.") and not qa.check_answer(QA, "Beth")


def test_first_error():
  assert first_error([0.0, 0.0]) is None and first_error([]) is None
  assert first_error([0.0, NAN, 1.0, 1.0]) == 2
  assert first_error([NAN, NAN]) is None


# --- thinking mode ----------------------------------------------------------------------------------------------


def _think(*paragraphs):
  return check_thinking(ARITH, list(paragraphs))


def test_classify_paragraph():
  assert classify_paragraph(ARITH, "Next, 12 * 3 = 36.") == "step"
  assert classify_paragraph(ARITH, "Step 2: 12 * 3 = 36.") == "step"
  assert classify_paragraph(ARITH, work_paragraph("12 * 3 = 36", 2)) == "step"
  assert classify_paragraph(ARITH, "12 * 3 = 36.") == "step"
  assert classify_paragraph(ARITH, "Wait, let me check: 12 * 3 = 36.") == "reflect"
  assert classify_paragraph(ARITH, "Hmm, let me verify: 12 * 3 = 36.") == "reflect"
  assert classify_paragraph(ARITH, "Let me double-check: 12 * 3 = 36.") == "reflect"
  assert classify_paragraph(ARITH, "So the answer is 36.") == "other"
  assert classify_paragraph(ARITH, "Let me think about this.") == "other"
  assert classify_paragraph(PLAN, "Next, move from hall to study.") == "step"
  assert classify_paragraph(QA, "Wait, let me check: the boss of Alice is Beth.") == "reflect"
  assert step_texts_for_check(QA, ["First, the boss of Alice is Beth.", "Hmm."]) == [
    ("step", "the boss of Alice is Beth"),
    ("other", None),
  ]
  assert step_texts_for_check(QA, ["Step 3: the boss of Alice is Beth."]) == [("step", "the boss of Alice is Beth")]


def test_thinking_redundant_rechecks_are_correct():
  labels = _think(
    "First, 12 + 5 = 17.",
    "Next, 17 * 3 = 51.",
    "Next, 51 - 4 = 47.",
    "Next, 47 + 10 = 57.",
    "So the answer is 57.",
    "Wait, let me check: 17 * 3 = 51.",
    "Let me double-check: 12 + 5 = 17.",
    "Let me think.",
  )
  assert same(labels, [0, 0, 0, 0, 0, 0, 0, NAN])


def test_thinking_right_to_wrong_flip():
  """A re-check that 'finds' an error is wrong; the redone steps build correctly on it; so does the conclusion."""
  labels = _think(
    "First, 12 + 5 = 17.",
    "Next, 17 * 3 = 51.",
    "Next, 51 - 4 = 47.",
    "Next, 47 + 10 = 57.",
    "So the answer is 57.",
    "Wait, let me check: 17 * 3 = 52.",
    "Next, 52 - 4 = 48.",
    "Next, 48 + 10 = 58.",
    "So the answer is 58.",
  )
  assert same(labels, [0, 0, 0, 0, 0, 1, 0, 0, 0])
  assert not get_family("arithmetic").check_answer(ARITH, "58")


def test_thinking_fix_and_repeated_error():
  labels = _think(
    "First, 12 + 5 = 18.",
    "Next, 18 * 3 = 54.",
    "Next, 54 - 4 = 50.",
    "Next, 50 + 10 = 60.",
    "So the answer is 60.",
    "Wait, let me check: 18 * 3 = 54.",
    "Wait, let me check: 12 + 5 = 18.",
    "Wait, let me check: 12 + 5 = 17.",
    "Next, 17 * 3 = 51.",
    "Next, 51 - 4 = 47.",
    "Next, 47 + 10 = 57.",
    "So the answer is 57.",
  )
  assert same(labels, [1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0])


def test_thinking_conclusions_and_stray_rechecks():
  # A conclusion before the chain is complete, or one that disagrees with it, is wrong.
  assert same(_think("First, 12 + 5 = 17.", "So the answer is 17."), [0, 1])
  assert same(
    _think(*[work_paragraph(s, k) for k, s in enumerate(ARITH_REF, 1)], "So the answer is 58."), [0, 0, 0, 0, 1]
  )
  # A re-check of a step that was never written, a re-check before any step, an unparseable re-check.
  assert same(
    _think(
      "Wait, let me check: 12 + 5 = 17.",
      "First, 12 + 5 = 17.",
      "Wait, let me check: 3 + 3 = 6.",
      "Wait, let me check: it is fine.",
    ),
    [1, 0, 1, NAN],
  )


def test_thinking_in_planning_and_qa():
  plan = [
    "First, move from hall to study.",
    "Next, move from study to cellar.",
    "So the answer is 2.",
    "Wait, let me check: move from hall to kitchen.",
    "Next, move from kitchen to attic.",
    "Next, move from attic to cellar.",
    "So the answer is 3.",
  ]
  assert same(check_thinking(PLAN, plan), [0, 0, 0, 1, 0, 0, 0])
  qa = [
    "First, the boss of Alice is Beth.",
    "Next, the friend of Beth is Dana.",
    "Next, the boss of Dana is Alice.",
    "So the answer is Alice.",
    "Wait, let me check: the friend of Beth is Carl.",
    "Next, the boss of Carl is Dana.",
    "So the answer is Dana.",
  ]
  assert same(check_thinking(QA, qa), [0, 0, 0, 0, 1, 0, 0])


# --- format parsers -----------------------------------------------------------------------------------------------

_body_text = st.text(alphabet="abcxyz0123456789 +-*=", min_size=1, max_size=20).map(str.strip).filter(bool)
_para_text = (
  st.text(alphabet="abcXYZ019 ,.:+=", min_size=1, max_size=30).map(str.strip).filter(lambda s: bool(s.strip(". ")))
)


@settings(max_examples=80, deadline=None)
@given(st.lists(_body_text, max_size=6), _body_text)
def test_line_round_trip(steps, answer):
  assert parse_line(render_line(steps, answer)) == (steps, answer)


@settings(max_examples=80, deadline=None)
@given(st.lists(_para_text, max_size=6), _body_text)
def test_thinking_round_trip(paragraphs, answer):
  parsed, got = parse_thinking(render_thinking(paragraphs, answer))
  assert got == answer
  assert parsed == [p if p.endswith(".") else p + "." for p in paragraphs]


def test_parsers_tolerate_malformed_output():
  assert parse_line("Reasoning Steps:\n- Step 1: 1 + 1 = 2\n\nsome words\n") == (["1 + 1 = 2", "some words"], None)
  assert parse_line("Step 1: a\n<Answer>: 7\n- Step 2: b") == (["a"], "7")
  assert parse_line("") == ([], None)
  assert parse_thinking("<think>\nA.\n\nB without end") == (["A.", "B without end"], None)
  assert parse_thinking("A.\n\n</think>\n\\boxed{\\frac{1}{2}}") == (["A."], "\\frac{1}{2}")
  assert parse_thinking("<think>A.\n\n</think> **Final Answer** \\boxed{3") == (["A."], None)
  assert parse_thinking("no markup at all") == (["no markup at all"], None)


def test_user_prompt_states_question_and_layout():
  line, think = user_prompt(QA, "line"), user_prompt(QA, "thinking")
  assert QA.question in line and "- Step k:" in line and "<Answer>:" in line
  assert QA.question in think and "<think>" in think and "\\boxed{}" in think
  assert "the boss of 4 is 9" in line  # the family's step hint
  # without its made-up step (prompts after worked examples): every family has a rule to fall back on, and only
  # the hint's parenthesis changes
  for problem in (ARITH, QA, make_problems("planning", 1, 0, 1)[0]):
    family = get_family(problem.domain)
    full, plain = user_prompt(problem, "line"), user_prompt(problem, "line", example=False)
    assert family.step_rule and family.step_rule in plain and "like '" not in plain
    assert plain == full.replace(f"({family.step_hint})", f"({family.step_rule})")


# --- traces -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def noisy():
  """Default-noise traces: 120 problems per family (mixed difficulty) in each mode."""
  out = {}
  for name in FAMILIES:
    problems = [p for d in (1, 2, 3) for p in make_problems(name, 40, seed=11, difficulty=d)]
    for mode in ("line", "thinking"):
      out[name, mode] = (problems, solve_many(problems, mode, seed=5, samples=2))
  return out


def test_trace_labels_match_injected_noise(noisy):
  for (name, mode), (problems, traces) in noisy.items():
    by_id = {p.id: p for p in problems}
    for t in traces:
      problem = by_id[t.problem_id]
      assert traces_module.agrees(t), (t.steps, t.labels, t.injected)
      checked = check_response(problem, t.text, mode)
      assert same(checked.labels, t.labels) and checked.answer == t.answer and checked.correct == t.correct
      if mode == "line":
        assert parse_line(t.text) == (t.steps, t.answer) and set(t.kinds) == {"step"}


def test_drafts_rarely_need_a_redraw():
  rng = np.random.default_rng(0)
  for name in FAMILIES:
    problems = make_problems(name, 60, seed=2, difficulty=3)
    drafts = [traces_module.draft(p, name, rng, mode) for p in problems for mode in ("line", "thinking")]
    assert np.mean([traces_module.agrees(t) for t in drafts]) >= 0.97, name


def test_errors_propagate_to_the_answer(noisy):
  for name in FAMILIES:
    _, traces = noisy[name, "line"]
    slips = np.mean([x for t in traces for x, k in zip(t.labels, t.injected) if k not in BUG_KINDS])
    assert 0.03 <= slips <= 0.15, (name, slips)
    step_errors = np.mean([x for t in traces for x in t.labels])
    assert step_errors <= (0.35 if name == "arithmetic" else 0.2), (name, step_errors)
    with_error = [t for t in traces if any(t.injected)]
    assert with_error, name
    wrong = np.mean([not t.correct for t in with_error])
    # An arithmetic error changes the value, and +, - and * by >= 2 keep it changed; only a skip can meet up again.
    assert wrong >= (0.95 if name == "arithmetic" else 0.5), (name, wrong)
    assert all(t.correct for t in traces if not any(t.injected)), name


def test_thinking_traces_recheck_and_flip_at_the_expected_rates(noisy):
  r2w = w2r = total = 0
  for name in FAMILIES:
    _, traces = noisy[name, "thinking"]
    correct = [t for t in traces if t.correct]
    rate = np.mean([t.rechecked for t in correct])
    assert 0.4 <= rate <= 0.85, (name, rate)
    for t in traces:
      total += 1
      r2w += t.r2w
      w2r += t.w2r
      if t.answer_paragraph is not None:  # None only for a walk cut off before the goal
        assert t.kinds[t.answer_paragraph] == "step"
        assert "reflect" not in t.kinds[: t.answer_paragraph + 1]
      assert t.rechecked == ("reflect" in t.kinds)
      if t.r2w:
        assert not t.correct and "r2w" in t.injected
  assert 0.01 <= r2w / total <= 0.12, r2w / total
  assert w2r > 0


def test_clean_noise_gives_reference_solutions():
  rng = np.random.default_rng(0)
  for name, family in FAMILIES.items():
    for problem in make_problems(name, 10, seed=1, difficulty=2):
      line = solve(problem, family, rng, "line", TraceNoise.clean())
      assert line.correct and set(line.labels) == {0.0}
      reference = family.reference_steps(problem)
      if name == "planning":  # the solver picks among equally short routes at random; the reference takes the first
        assert len(line.steps) == len(reference) and family.check_steps(problem, reference) == line.labels
      else:
        assert line.steps == reference
      think = solve(problem, name, rng, "thinking", TraceNoise.clean())
      assert think.correct and set(think.labels) == {0.0} and not think.rechecked
      assert think.answer_paragraph == len(line.steps) - 1


def test_traces_are_deterministic_and_order_independent():
  problems = make_problems("qa", 8, seed=0, difficulty=2)
  a = solve_many(problems, "thinking", seed=3)
  assert [t.text for t in a] == [t.text for t in solve_many(problems, "thinking", seed=3)]
  b = solve_many(problems[::-1], "thinking", seed=3)
  assert [t.text for t in a] == [t.text for t in b[::-1]]
  json.dumps([t.to_json() for t in a], allow_nan=False)
  with pytest.raises(ConfigError, match="family"):
    solve(problems[0], "arithmetic", np.random.default_rng(0), "line")


# --- JSONL ---------------------------------------------------------------------------------------------------------


def test_jsonl_round_trip(tmp_path):
  problems = [p for name in FAMILIES for p in make_problems(name, 5, seed=0, difficulty=1)]
  path = tmp_path / "sub" / "problems.jsonl"
  write_jsonl(path, problems)
  assert read_problems(path) == problems
  assert os.listdir(path.parent) == ["problems.jsonl"]


def test_failed_write_leaves_the_old_file(tmp_path):
  path = tmp_path / "p.jsonl"
  write_jsonl(path, [ARITH])
  before = path.read_text()
  with pytest.raises(TypeError):
    write_jsonl(path, [ARITH.to_json(), {"bad": object()}])
  with pytest.raises(ValueError):
    write_jsonl(path, [{"label": NAN}])
  assert path.read_text() == before and os.listdir(tmp_path) == ["p.jsonl"]


def _broken(tmp_path, line3):
  path = tmp_path / "broken.jsonl"
  lines = [json.dumps(ARITH.to_json()), "", line3 if isinstance(line3, str) else json.dumps(line3)]
  path.write_text("\n".join(lines) + "\n")
  return path


def _record(**changes):
  record = PLAN.to_json()
  record["id"] = "other"
  record.update(changes)
  return record


@pytest.mark.parametrize(
  "line3,message",
  [
    ('{"id": "x", "domain": ', "invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ({k: v for k, v in _record().items() if k != "answer"}, "missing field 'answer'"),
    (_record(question=3), "field 'question' must be str, found int"),
    (_record(domain="gsm9k"), "field 'domain' names no registered task: 'gsm9k'"),
    (_record(id=""), "field 'id' is empty"),
    (_record(id="arith"), "duplicate id 'arith' \\(first on line 1\\)"),
    (_record(answer="3"), "planning data: answer '3' is not the shortest route length 2"),
    (_record(data={**PLAN.data, "goal": "garage"}), "planning data: 'goal' must be one of the rooms"),
    ({**ARITH.to_json(), "id": "a2", "data": {"start": 12, "ops": [["/", 2]]}}, "arithmetic data: ops\\[0\\]"),
    ({**QA.to_json(), "id": "q2", "data": {**QA.data, "facts": QA.data["facts"][:-1]}}, "qa data: 'facts' has no"),
  ],
)
def test_malformed_records_name_file_and_line(tmp_path, line3, message):
  path = _broken(tmp_path, line3)
  with pytest.raises(DataFormatError, match=f"^{path}:3: .*{message}") as info:
    read_problems(path)
  assert isinstance(info.value, ReprobeError)


def test_thinking_progress_agrees_with_the_solver():
  """Replaying a sampled-like trajectory finds where the scripted solver established its answer, and its R2W flips."""
  from reprobe_jax.tasks.formats import thinking_progress
  from reprobe_jax.tasks.response import parse_thinking

  for family in ("arithmetic", "planning", "qa"):
    problems = make_problems(family, 60, 3, 2)
    for problem, trace in zip(problems, solve_many(problems, "thinking", 3)):
      progress = thinking_progress(problem, parse_thinking(trace.text)[0])
      assert progress.established == trace.answer_paragraph, (family, trace.text)
      assert (progress.right_established and not trace.correct) == trace.r2w, (family, trace.text)
      if trace.rechecked and trace.answer_paragraph is not None:
        assert progress.rechecks_after > 0


def _bug_condition(problem, state):
  """Whether the arithmetic 'carry' or 'borrow' condition holds at `state`, written out from docs/tasks.md."""
  p, v = state
  op, b = problem.data["ops"][p]
  return (op == "+" and v % 10 + b >= 10) or (op == "-" and v >= 10 and v % 10 < b)


def test_buggy_procedures_fire_wherever_their_condition_holds():
  """With p_bug=1 and no slips every step under a bug condition is the bug (labelled wrong), every other right."""
  from reprobe_jax.tasks.arithmetic import apply

  fam = get_family("arithmetic")
  noise = dataclasses.replace(TraceNoise.clean(), p_bug=1.0, bugs=("carry", "borrow"))
  problems = [p for d in (1, 2, 3) for p in make_problems("arithmetic", 40, 7, d)]
  seen = {"carry": 0, "borrow": 0}
  for problem, trace in zip(problems, solve_many(problems, "line", 0, noise)):
    state = fam.initial_state(problem)
    for body, label, kind in zip(trace.steps, trace.labels, trace.injected):
      a, op, b, r = fam.parse_step(body)
      if _bug_condition(problem, state):
        assert kind in ("carry", "borrow") and label == 1.0
        assert r == (a + b - 10 if op == "+" else a - a % 10 + (b - a % 10))  # 17 + 5 = 12; 23 - 5 = 22
        seen[kind] += 1
      else:
        assert kind is None and label == 0.0 and r == apply(op, a, b)
      state = (state[0] + 1, r)
  assert min(seen.values()) >= 10, seen


def test_bug_rate_follows_p_bug_and_qa_reads_mentor_backwards():
  from reprobe_jax.tasks.qa import facts

  noise = dataclasses.replace(TraceNoise.clean(), p_bug=0.5, bugs=("inverse",))
  problems = [p for d in (1, 2, 3) for p in make_problems("qa", 200, 3, d)]
  fired = 0
  for problem, trace in zip(problems, solve_many(problems, "line", 0, noise)):
    base = facts(problem)
    for body, kind in zip(trace.steps, trace.injected):
      if kind == "inverse":
        relation, subject, obj = get_family("qa").parse_step(body)
        assert relation == "mentor" and base[(obj, "mentor")] == subject != base[(subject, "mentor")]
        fired += 1
  eligible = 0
  fam = get_family("qa")
  for problem in problems:
    state = fam.initial_state(problem)
    while not fam.is_done(problem, state):
      eligible += fam.bug_step(problem, state, noise) is not None
      state = fam.honest_step(problem, state, None)[1]
  assert eligible > 40 and abs(fired / eligible - 0.5) < 0.15, (fired, eligible)


def test_unknown_bug_is_refused():
  with pytest.raises(ConfigError, match="unknown bug"):
    TraceNoise(bugs=("carry", "typo"))


def test_planning_goal_mark_is_a_claim_the_checker_judges():
  """'(the goal)' after a move (TrajectoryConfig.goal_mark's worked examples) parses, and a move that says it ends in
  the goal is correct only where it does; without the mark the move is judged as before."""
  plan = make_problems("planning", 1, 2_000_004, 1)[0]  # start 1, goal 9; doors 1-2, 1-6, 2-6, 5-9, 6-9
  fam = get_family("planning")
  assert fam.parse_step("move from 6 to 9 (the goal)") == ("6", "9", True)
  assert fam.parse_step("move from 6 to 9 (The Goal).") == ("6", "9", True)
  assert fam.parse_step("move from 6 to 9") == ("6", "9", False)
  assert fam.parse_step("move from 6 to 9 (a goal)") is None
  assert fam.check_steps(plan, ["move from 1 to 6", "move from 6 to 9 (the goal)"]) == [0.0, 0.0]
  assert fam.check_steps(plan, ["move from 1 to 6", "move from 6 to 9"]) == [0.0, 0.0]
  # a right move that claims the goal one room early is wrong; the walk goes on from where it ended
  assert fam.check_steps(plan, ["move from 1 to 6 (the goal)", "move from 6 to 9"]) == [1.0, 0.0]
  assert fam.check_steps(plan, ["move from 1 to 2 (the goal)"]) == [1.0]
  assert fam.done_mark == " (the goal)" and get_family("qa").done_mark == get_family("arithmetic").done_mark == ""


def test_first_step_question_spells_out_where_the_first_step_starts():
  """qa: the start person becomes the first look-up's subject; planning: the start room the first move's origin;
  arithmetic's question already starts from its value. Everything else in the question stays as it was."""
  qa = make_problems("qa", 1, 2_000_004, 1)[0]
  assert qa.data["start"] == "10" and qa.data["hops"][0] == "mentor"
  spelled = get_family("qa").first_step_question(qa)
  assert spelled == qa.question.replace("Step 1: mentor.", "Step 1: the mentor of 10.")
  assert spelled.startswith("Start at 10. Step 1: the mentor of 10. Step 2: friend. Who is that?")
  plan = make_problems("planning", 1, 2_000_004, 1)[0]
  assert get_family("planning").first_step_question(plan) == (
    "Start at 1. Go to room 9 by a shortest route, one door per move, the first from 1. Doors: from 2 to 1 or 6; "
    "from 5 to 9; from 9 to 5 or 6; from 6 to 2 or 9 or 1; from 1 to 6 or 2. How many moves is that?"
  )
  assert get_family("arithmetic").first_step_question(ARITH) == ARITH.question
  line = user_prompt(qa, "line", example=False, first_step=True)
  assert line == user_prompt(qa, "line", example=False).replace(qa.question, spelled)
