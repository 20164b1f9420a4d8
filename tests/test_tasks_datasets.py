"""Readers of public math data files (reprobe_jax.tasks.datasets): each format read right from a small file written
here in the shape of the real data, and each kind of bad record refused with a DataFormatError naming the line
and the field."""

from __future__ import annotations

import copy
import json
import math
import re

import pytest

from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.tasks.dataset_records import LabelledSolution
from reprobe_jax.tasks.math_normalize import last_boxed
from reprobe_jax.tasks.datasets import (
  FORMATS,
  problem_id,
  read_dataset,
  read_gsm8k,
  read_math,
  read_plain,
  read_processbench,
  read_prm800k,
)

NATALIA = (
  "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
  "How many clips did Natalia sell altogether in April and May?"
)
NATALIA_ANSWER = (
  "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
  "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)


def write_lines(path, records) -> str:
  """One JSON value a line; a str is written as it is (a blank line, a broken line)."""
  path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n", encoding="utf-8")
  return str(path)


def step(*completions, chosen=0, human=None) -> dict:
  return {
    "completions": [{"text": t, "rating": r, "flagged": None} for t, r in completions],
    "human_completion": human,
    "chosen_completion": chosen,
  }


def prm_line(problem="What is $1+1$?", answer="2", steps=(), finish="solution") -> dict:
  return {
    "labeler": "340d89bc-f5b7-45e9-b272-909ba68ee363",
    "timestamp": "2023-01-22T04:34:27.052924",
    "generation": 9,
    "is_quality_control_question": False,
    "is_initial_screening_question": False,
    "question": {
      "problem": problem,
      "ground_truth_solution": f"So it is $\\boxed{{{answer}}}$.",
      "ground_truth_answer": answer,
    },
    "label": {"steps": list(steps), "total_time": 278270, "finish_reason": finish},
  }


# ---- each format read right ----


def test_gsm8k_reads_the_final_value_after_the_marks_and_the_worked_text_before(tmp_path):
  path = write_lines(
    tmp_path / "test.jsonl",
    [
      {"question": NATALIA, "answer": NATALIA_ANSWER},
      "",
      {"question": "A farm has 1,000 hens and buys 200 more. How many hens?", "answer": "1000+200=1200\n#### 1,200"},
    ],
  )
  first, second = read_gsm8k(path)
  assert (first.id, first.question, first.answer, first.source) == ("test-1", NATALIA, "72", "gsm8k")
  assert first.solution == NATALIA_ANSWER[: NATALIA_ANSWER.index("\n####")]
  assert (second.id, second.answer, second.solution) == ("test-3", "1,200", "1000+200=1200")  # blank line 2 counted


def test_math_reads_the_answer_field_or_the_last_boxed_of_the_solution(tmp_path):
  math500 = {
    "problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.",
    "solution": "We have that $r = 3$ ... $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$",
    "answer": "\\left( 3, \\frac{\\pi}{2} \\right)",
    "subject": "Precalculus",
    "level": 2,
    "unique_id": "test/precalculus/807.json",
  }
  hendrycks = {
    "problem": "What is $\\frac{1}{2} + \\frac{1}{4}$?",
    "level": "Level 1",
    "type": "Prealgebra",
    "solution": "First $\\boxed{1}$ is wrong; the sum is $\\boxed{\\frac{3}{4}}$.",
  }
  a, b = read_math(write_lines(tmp_path / "math.jsonl", [math500, hendrycks]))
  assert (a.id, a.answer, a.source) == ("test/precalculus/807.json", "\\left( 3, \\frac{\\pi}{2} \\right)", "math")
  assert a.meta == {"subject": "Precalculus", "level": 2}
  assert (b.id, b.answer, b.solution) == ("math-2", "\\frac{3}{4}", hendrycks["solution"])
  assert b.meta == {"level": "Level 1", "type": "Prealgebra"}


@pytest.mark.parametrize(
  "text, boxed",
  [
    ("$\\boxed{18}$", "18"),
    ("$\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),
    ("\\boxed{1} and then \\boxed{2}", "2"),  # the last one
    ("$\\boxed{\\{1, 2\\}}$", "\\{1, 2\\}"),  # escaped braces are text
    ("$\\boxed{\\sqrt{\\frac{a}{b}}}$ done", "\\sqrt{\\frac{a}{b}}"),
    ("\\fbox{7}", "7"),
    ("so $\\boxed 5$.", "5"),
    ("\\boxed{x", None),  # not closed
    ("no box", None),
  ],
)
def test_last_boxed_worked_table(text, boxed):
  assert last_boxed(text) == boxed


def test_plain_jsonl_ids_default_to_stem_and_line_and_numbers_become_text(tmp_path):
  path = write_lines(
    tmp_path / "mine.jsonl",
    [{"question": "2+2?", "answer": "4"}, {"id": "q7", "question": "3*3?", "answer": 9, "split": "test"}],
  )
  a, b = read_plain(path)
  assert (a.id, a.answer, a.solution, a.meta) == ("mine-1", "4", None, {})
  assert (b.id, b.answer, b.meta) == ("q7", "9", {"split": "test"})


# ProcessBench's label (first wrong step, -1 when none) -> step labels: right before it, wrong at it, unknown after.
PROCESSBENCH_TABLE = [
  (-1, 3, (0.0, 0.0, 0.0), None),
  (0, 3, (1.0, None, None), 0),
  (1, 3, (0.0, 1.0, None), 1),
  (2, 3, (0.0, 0.0, 1.0), 2),
]


@pytest.mark.parametrize("array", [False, True], ids=["jsonl", "json-array"])
def test_processbench_labels_follow_the_first_wrong_step(tmp_path, array):
  records = [
    {
      "id": f"gsm8k-{i}",
      "generator": "Qwen2-7B-Instruct",
      "problem": "Sue has 3 flamingos and buys 2. How many?" if i < 2 else f"Problem {i}",
      "steps": [f"Step {k} of solution {i}." for k in range(n)],
      "final_answer_correct": label == -1,
      "label": label,
    }
    for i, (label, n, _, _) in enumerate(PROCESSBENCH_TABLE)
  ]
  path = tmp_path / "gsm8k.json"
  if array:
    path.write_text("\n  " + json.dumps(records, indent=2), encoding="utf-8")  # leading space before the '['
  else:
    write_lines(path, records)
  solutions = read_processbench(str(path))
  for solution, (label, n, labels, first) in zip(solutions, PROCESSBENCH_TABLE, strict=True):
    assert solution.step_labels == labels and solution.first_error == first and len(solution.steps) == n
    assert solution.final_answer_correct is (label == -1) and solution.source == "processbench"
    assert solution.meta == {"generator": "Qwen2-7B-Instruct"}
  assert solutions[0].problem_id == solutions[1].problem_id != solutions[2].problem_id
  assert solutions[0].problem_id == problem_id("Sue has 3 flamingos and buys 2. How many?", "processbench")
  assert [x if not math.isnan(x) else None for x in solutions[1].labels()] == [1.0, None, None]


def test_prm800k_follows_the_chosen_completion_and_maps_ratings(tmp_path):
  phase2 = prm_line(
    steps=[
      step(("I add one and one.", 0)),
      step(("That is $1+1=3$.", -1), chosen=None),  # where phase 2 labelling stopped: one completion, none chosen
    ],
    finish="found_error",
  )
  phase1 = prm_line(
    steps=[
      step(("Wrong start.", -1), ("Right start: 1 + 1.", 1), chosen=1),
      step(("Bad.", -1), ("Worse.", -1), chosen=None, human={"text": "So it is 2.", "rating": None}),
      step(("# Answer\n\n2", 1)),
      step(("An extra line.", 0), ("Another.", 1), chosen=None),  # several, none chosen: the path ends here
    ]
  )
  other = prm_line(problem="What is $2 \\cdot 3$?", answer="6", steps=[step(("6", None))], finish="give_up")
  problems, solutions = read_prm800k(write_lines(tmp_path / "phase2_test.jsonl", [phase2, phase1, other]))
  assert [(p.question, p.answer, p.source) for p in problems] == [
    ("What is $1+1$?", "2", "prm800k"),
    ("What is $2 \\cdot 3$?", "6", "prm800k"),
  ]
  a, b, c = solutions
  assert (a.id, a.steps, a.step_labels, a.first_error) == (
    "phase2_test-1",
    ("I add one and one.", "That is $1+1=3$."),
    (0.0, 1.0),
    1,
  )
  assert a.final_answer_correct is None and a.meta["ratings"] == [0, -1] and a.meta["finish_reason"] == "found_error"
  assert b.steps == ("Right start: 1 + 1.", "So it is 2.", "# Answer\n\n2")
  assert (b.step_labels, b.first_error, b.final_answer_correct) == ((0.0, 0.0, 0.0), None, True)
  assert a.problem_id == b.problem_id == problems[0].id != c.problem_id
  assert (c.step_labels, c.meta["labeler"]) == ((None,), phase1["labeler"])
  assert "pre_generated_answer" not in c.meta  # phase 1 lines have none


def test_read_dataset_by_format_name(tmp_path):
  gsm = write_lines(tmp_path / "g.jsonl", [{"question": NATALIA, "answer": NATALIA_ANSWER}])
  data = read_dataset(gsm, "gsm8k")
  assert (data.format, data.path, data.problems[0].answer, data.solutions) == ("gsm8k", gsm, "72", ())
  pb = write_lines(tmp_path / "pb.jsonl", [{"id": "m-0", "problem": "x?", "steps": ["a", "b"], "label": 1}])
  data = read_dataset(pb, "processbench")
  assert (data.problems, data.solutions[0].first_error) == ((), 1)
  prm = write_lines(tmp_path / "prm.jsonl", [prm_line(steps=[step(("1 + 1 = 2", 1))])])
  data = read_dataset(prm, "prm800k")
  assert (len(data.problems), len(data.solutions), data.problems[0].answer) == (1, 1, "2")
  assert set(FORMATS.names()) == {"gsm8k", "math", "jsonl", "processbench", "prm800k"}


def test_an_unknown_format_is_a_config_error_naming_the_known_ones(tmp_path):
  with pytest.raises(
    ConfigError, match="unknown dataset format 'csv'; known: gsm8k, jsonl, math, prm800k, processbench"
  ):
    read_dataset(tmp_path / "x.jsonl", "csv")


def test_solution_records_check_their_labels_and_write_json():
  with pytest.raises(DataFormatError, match="2 steps but 1 step labels"):
    LabelledSolution("s", "p", "q", ("a", "b"), (0.0,), None, "mine")
  record = LabelledSolution("s", "p", "q", ("a", "b"), (1.0, None), False, "mine").to_json()
  assert (record["step_labels"], record["first_error"], record["steps"]) == ([1.0, None], 0, ["a", "b"])
  json.dumps(record)


# ---- each kind of bad record refused, naming the line and the field ----

GOOD_GSM = {"question": NATALIA, "answer": NATALIA_ANSWER}
GOOD_PB = {"id": "gsm8k-0", "problem": "x?", "steps": ["a", "b"], "label": -1}
GOOD_PRM = prm_line(steps=[step(("1 + 1 = 2", 1))])


def _with(record: dict, **changes) -> dict:
  out = {k: v for k, v in record.items() if k not in changes or changes[k] is not ...}
  out.update({k: v for k, v in changes.items() if v is not ...})
  return out


def _prm_with_steps(*steps) -> dict:
  return prm_line(steps=steps)


BAD = [
  # (id, format, second record, message parts: the line (':2:'), the record id when it has one, the field)
  ("gsm8k missing field", "gsm8k", _with(GOOD_GSM, question=...), [":2: field 'question' is missing"]),
  ("gsm8k missing ####", "gsm8k", _with(GOOD_GSM, answer="It is 72."), [":2: field 'answer' has no '####"]),
  ("gsm8k nothing after ####", "gsm8k", _with(GOOD_GSM, answer="72\n#### "), [":2:", "'answer' has nothing after"]),
  ("gsm8k wrong type", "gsm8k", _with(GOOD_GSM, answer=72), [":2:", "'answer' must be a non-empty string, got int 72"]),
  ("math no answer", "math", {"problem": "x?", "solution": "It is 3."}, [":2:", "'solution' has no \\boxed"]),
  ("math unclosed box", "math", {"problem": "x?", "solution": "\\boxed{3"}, [":2:", "'solution' has no \\boxed"]),
  ("math wrong type", "math", {"problem": "x?", "solution": "\\boxed{3}", "level": [5]}, [":2:", "'level' must be"]),
  ("math missing", "math", {"problem": "x?", "answer": "3"}, [":2:", "field 'solution' is missing"]),
  ("jsonl duplicate id", "jsonl", {"id": "q1", "question": "b?", "answer": "2"}, [":2: record 'q1': field 'id'", ":1"]),
  ("jsonl answer null", "jsonl", {"question": "b?", "answer": None}, [":2:", "'answer' must be a string or a number"]),
  ("jsonl answer bool", "jsonl", {"question": "b?", "answer": True}, [":2:", "'answer' must be", "bool True"]),
  ("jsonl empty question", "jsonl", {"question": " ", "answer": "1"}, [":2:", "'question' must be a non-empty"]),
  ("jsonl not an object", "jsonl", ["q", "a"], [":2: expected a JSON object, got list"]),
  (
    "pb label past steps",
    "processbench",
    _with(GOOD_PB, id="g-1", label=2),
    [":2: record 'g-1': field 'label'", "0..1, got 2"],
  ),
  (
    "pb label below -1",
    "processbench",
    _with(GOOD_PB, id="g-1", label=-2),
    [":2: record 'g-1': field 'label'", "got -2"],
  ),
  (
    "pb label a float",
    "processbench",
    _with(GOOD_PB, id="g-1", label=1.0),
    [":2:", "'label' must be an integer, got float"],
  ),
  (
    "pb label a string",
    "processbench",
    _with(GOOD_PB, id="g-1", label="1"),
    [":2:", "'label' must be an integer, got str"],
  ),
  ("pb label a bool", "processbench", _with(GOOD_PB, id="g-1", label=True), [":2:", "'label' must be an integer"]),
  (
    "pb missing label",
    "processbench",
    _with(GOOD_PB, id="g-1", label=...),
    [":2: record 'g-1': field 'label' is missing"],
  ),
  ("pb step not text", "processbench", _with(GOOD_PB, id="g-1", steps=["a", 3]), [":2:", "field 'steps[1]' must be"]),
  ("pb no steps", "processbench", _with(GOOD_PB, id="g-1", steps=[]), [":2:", "field 'steps' is empty"]),
  (
    "pb final not bool",
    "processbench",
    _with(GOOD_PB, id="g-1", final_answer_correct="yes"),
    [":2:", "final_answer_correct"],
  ),
  ("pb duplicate id", "processbench", GOOD_PB, [":2: record 'gsm8k-0': field 'id' repeats", ":1"]),
  (
    "prm rating outside -1..1",
    "prm800k",
    _prm_with_steps(step(("ok", 1)), step(("a", 2))),
    [":2: field 'label.steps[1].completions[0].rating' must be -1, 0 or 1", "got 2"],
  ),
  (
    "prm rating not an int",
    "prm800k",
    _prm_with_steps(step(("a", "+1"))),
    [":2:", "'label.steps[0].completions[0].rating' must be an integer"],
  ),
  (
    "prm chosen past completions",
    "prm800k",
    _prm_with_steps(step(("ok", 1)), step(("a", 0), ("b", 1), chosen=2)),
    [":2:", "'label.steps[1].chosen_completion' must index the step's 2 completions, got 2"],
  ),
  (
    "prm step after the path ended",
    "prm800k",
    _prm_with_steps(step(("a", 0), ("b", 1), chosen=None), step(("c", 1))),
    [":2:", "'label.steps[1]' follows label.steps[0]"],
  ),
  (
    "prm missing answer",
    "prm800k",
    {**GOOD_PRM, "question": {"problem": "What is $1+1$?"}},
    [":2:", "'question.ground_truth_answer' is missing"],
  ),
  ("prm label missing", "prm800k", _with(GOOD_PRM, label=...), [":2:", "field 'label' is missing"]),
  (
    "prm same problem, other answer",
    "prm800k",
    prm_line(answer="3", steps=[step(("x", 1))]),
    [":2:", "'question.ground_truth_answer' is '3'", ":1 gives the same problem '2'"],
  ),
]
GOOD_MATH = {"problem": "x?", "solution": "So $\\boxed{3}$.", "unique_id": "test/algebra/2.json"}
BAD += [
  # a record without its answer, in each format (ProcessBench's is its label, above)
  ("gsm8k no answer", "gsm8k", _with(GOOD_GSM, answer=...), [":2: field 'answer' is missing"]),
  ("jsonl no answer", "jsonl", {"id": "q2", "question": "b?"}, [":2: record 'q2': field 'answer' is missing"]),
  (
    "math no solution, answer null",
    "math",
    {"problem": "x?", "solution": "It is three.", "answer": None},
    [":2:", "field 'solution' has no \\boxed{...} final answer and the record no 'answer' field"],
  ),
  # an unparseable answer
  (
    "math empty box",
    "math",
    {"problem": "x?", "solution": "$\\boxed{ }$"},
    [":2:", "'solution' has no \\boxed{...} final answer"],
  ),
  ("gsm8k marks only", "gsm8k", _with(GOOD_GSM, answer="####"), [":2: field 'answer' has nothing after its '####'"]),
  ("jsonl answer NaN", "jsonl", {"question": "b?", "answer": math.nan}, [":2:", "'answer' must be", "float nan"]),
  ("jsonl answer empty", "jsonl", {"question": "b?", "answer": "  "}, [":2:", "'answer' must be a string or a number"]),
  # duplicate ids, in each format that has them
  ("gsm8k duplicate id", "gsm8k", _with(GOOD_GSM, id="bad-1"), [":2: record 'bad-1': field 'id' repeats", ":1"]),
  (
    "math duplicate unique_id",
    "math",
    GOOD_MATH,
    [":2: record 'test/algebra/2.json': field 'unique_id' repeats", "bad.jsonl:1"],
  ),
  # PRM800K ratings outside -1..1 on the other side, and not whole
  ("prm rating -2", "prm800k", _prm_with_steps(step(("a", -2))), [":2:", "completions[0].rating' must be -1, 0 or 1"]),
  ("prm rating 0.5", "prm800k", _prm_with_steps(step(("a", 0.5))), [":2:", "rating' must be an integer, got float"]),
]
FIRST = {"gsm8k": GOOD_GSM, "math": GOOD_MATH, "jsonl": {"id": "q1", "question": "a?", "answer": "1"}}
FIRST.update(processbench=GOOD_PB, prm800k=GOOD_PRM)


def _set(record: dict, field: str, value) -> dict:
  """A deep copy of `record` with the value at `field` ('label.steps[0].completions[0].text') replaced."""
  out = copy.deepcopy(record)
  *parents, last = re.findall(r"[^.\[\]]+", field)
  node = out
  for key in parents:
    node = node[int(key)] if key.isdigit() else node[key]
  node[int(last) if last.isdigit() else last] = value
  return out


_STEP0 = "label.steps[0]"
# A wrong type for every field each reader reads: (format, field, wrong value, what the message says it must be).
WRONG_TYPES = [
  ("gsm8k", "id", [1], "a non-empty string or an integer"),
  ("gsm8k", "question", 7, "a non-empty string"),
  ("math", "unique_id", True, "a non-empty string or an integer"),
  ("math", "problem", ["x?"], "a non-empty string"),
  ("math", "solution", 3, "a string"),
  ("math", "answer", [3], "a string or a number (not empty)"),
  ("math", "type", 4, "a string"),
  ("math", "subject", {"name": "Algebra"}, "a string"),
  ("math", "level", 2.5, "a string ('Level 3') or an integer"),
  ("jsonl", "id", 1.5, "a non-empty string or an integer"),
  ("jsonl", "question", {"text": "a?"}, "a non-empty string"),
  ("processbench", "id", None, "a non-empty string or an integer"),
  ("processbench", "problem", 5, "a non-empty string"),
  ("processbench", "steps", "a\nb", "a list"),
  ("processbench", "generator", 7, "a string"),
  ("prm800k", "question", "What is $1+1$?", "a JSON object"),
  ("prm800k", "question.problem", 1, "a non-empty string"),
  ("prm800k", "question.ground_truth_answer", ["2"], "a string or a number (not empty)"),
  ("prm800k", "question.ground_truth_solution", 2, "a string"),
  ("prm800k", "label", [], "a JSON object"),
  ("prm800k", "label.steps", {}, "a list"),
  ("prm800k", "label.finish_reason", 1, "a string"),
  ("prm800k", _STEP0, "1 + 1 = 2", "a JSON object"),
  ("prm800k", f"{_STEP0}.completions", "1 + 1 = 2", "a list"),
  ("prm800k", f"{_STEP0}.completions[0]", "1 + 1 = 2", "a JSON object"),
  ("prm800k", f"{_STEP0}.completions[0].text", None, "a string"),
  ("prm800k", f"{_STEP0}.chosen_completion", "0", "an integer"),
  ("prm800k", f"{_STEP0}.human_completion", 3, "a string"),  # checked though the path takes the chosen completion
]
GOOD = {
  "gsm8k": _with(GOOD_GSM, id="g-2"),
  "math": _with(GOOD_MATH, unique_id="m-2"),
  "jsonl": {"question": "b?", "answer": 2},
}
GOOD.update(processbench=_with(GOOD_PB, id="g-2", generator="Qwen2-7B-Instruct"), prm800k=GOOD_PRM)
BAD.append(
  (
    "prm800k human_completion.text wrong type",
    "prm800k",
    _set(GOOD_PRM, f"{_STEP0}.human_completion", {"text": None, "rating": None}),
    [":2:", f"field '{_STEP0}.human_completion.text' must be a string, got NoneType None"],
  )
)
BAD += [
  (f"{f} {field} wrong type", f, _set(GOOD[f], field, value), [":2:", f"field '{field}' must be {kind}, got "])
  for f, field, value, kind in WRONG_TYPES
]


@pytest.mark.parametrize("format", sorted(GOOD))
def test_the_records_the_wrong_types_are_made_from_are_good(tmp_path, format):
  read_dataset(write_lines(tmp_path / "good.jsonl", [FIRST[format], GOOD[format]]), format)


@pytest.mark.parametrize("format, bad, parts", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_record_is_refused_naming_line_and_field(tmp_path, format, bad, parts):
  path = write_lines(tmp_path / "bad.jsonl", [FIRST[format], bad])
  read_dataset(write_lines(tmp_path / "good.jsonl", [FIRST[format]]), format)  # the first record alone is good
  with pytest.raises(DataFormatError) as e:
    read_dataset(path, format)
  for part in parts:
    assert part in str(e.value), str(e.value)
  assert str(e.value).startswith(path), str(e.value)


@pytest.mark.parametrize("format", sorted(FIRST))
def test_files_that_are_no_data_are_refused(tmp_path, format):
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n  \n", encoding="utf-8")
  with pytest.raises(DataFormatError, match=r"empty\.jsonl: .* holds no records \(an empty file\)"):
    read_dataset(empty, format)
  latin = tmp_path / "latin.jsonl"
  latin.write_bytes(json.dumps(FIRST[format]).encode() + b'\n{"question": "caf\xe9"}\n')
  with pytest.raises(DataFormatError, match=r"latin\.jsonl:2: .* is not UTF-8 text \(byte 0xe9"):
    read_dataset(latin, format)
  broken = write_lines(tmp_path / "broken.jsonl", [FIRST[format], '{"question": '])
  with pytest.raises(DataFormatError, match=r"broken\.jsonl:2: invalid JSON"):
    read_dataset(broken, format)
  with pytest.raises(DataFormatError, match="must be a regular file, but it is a folder"):
    read_dataset(tmp_path, format)
  with pytest.raises(DataFormatError, match="cannot read"):
    read_dataset(tmp_path / "missing.jsonl", format)


def test_a_json_array_file_names_the_record_index(tmp_path):
  path = tmp_path / "pb.json"
  path.write_text(json.dumps([GOOD_PB, _with(GOOD_PB, id="omni-3", label=5)]), encoding="utf-8")
  with pytest.raises(DataFormatError, match=r"pb\.json\[1\]: record 'omni-3': field 'label' must be -1"):
    read_processbench(path)
  path.write_text("[]", encoding="utf-8")
  with pytest.raises(DataFormatError, match="holds no records"):
    read_processbench(path)
