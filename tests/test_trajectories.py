"""The trajectory record (`Trajectory`): today's JSONL schema reads and writes back byte for byte, and a bad record
is refused with an error naming the file, line, trajectory and field."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from reprobe_jax.errors import DataFormatError
from reprobe_jax.io.atomic import write_jsonl
from reprobe_jax.trajectories import StepSpan, Trajectory, read_trajectories

# A labelled record as sample_trajectories + annotate_rule have written it from the start (key order included).
RECORD = {
  "id": "arithmetic-d1-s2000005-00000#1",
  "problem_id": "arithmetic-d1-s2000005-00000",
  "domain": "arithmetic",
  "mode": "line",
  "sample": 1,
  "prompt_ids": [1, 57, 9],
  "response_ids": [4, 8, 15, 16],
  "response": "- Step 1: 2 + 3 = 5\n<Answer>: 5",
  "finish_reason": "eos",
  "logprobs": [-0.125, -2.5, 0.0, -0.031],
  "entropy": [0.5, 1.25, 0.0, 0.1],
  "self_certainty": [3.0, 1.5, 7.25, 2],
  "steps": [{"text": "- Step 1: 2 + 3 = 5", "start": 0, "end": 3}, {"text": "<Answer>: 5", "start": 3, "end": 3}],
  "labels": [0.0, None],
  "first_error": None,
  "annotator": "rule",
  "answer": "5",
  "correct": True,
}
UNLABELLED = {k: v for k, v in RECORD.items() if k not in ("labels", "first_error", "annotator", "answer", "correct")}
UNLABELLED["id"] = "arithmetic-d1-s2000005-00000#0"


def test_todays_records_read_and_write_back_byte_for_byte(tmp_path):
  src = tmp_path / "trajectories_test.jsonl"
  src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in (RECORD, UNLABELLED)))
  labelled, sampled = read_trajectories(src)
  assert labelled.steps == (StepSpan("- Step 1: 2 + 3 = 5", 0, 3), StepSpan("<Answer>: 5", 3, 3))
  assert labelled.spans == [(0, 3), (3, 3)] and not labelled.steps[1].has_tokens
  assert labelled.labels[0] == 0.0 and math.isnan(labelled.labels[1])  # null -> NaN in memory
  assert labelled.annotator == "rule" and labelled.extra == {"answer": "5", "correct": True}
  assert labelled.label_array().dtype.name == "float32" and labelled.response_ids == (4, 8, 15, 16)
  assert sampled.labels is None and sampled.extra == {}
  with pytest.raises(DataFormatError, match="no labels"):
    sampled.label_array()
  out = tmp_path / "again.jsonl"
  write_jsonl(out, [labelled, sampled])
  assert out.read_text() == src.read_text()


@pytest.mark.parametrize(
  "change,match",
  [
    ({"logprobs": None}, "missing field 'logprobs'"),
    ({"response_ids": "4 8"}, "field 'response_ids' must be a list of integers >= 0 \\(token ids\\), found str"),
    ({"sample": True}, "field 'sample' must be an integer"),
    ({"entropy": [0.5, "x"]}, "field 'entropy' must be a list of numbers"),
    ({"steps": [{"text": "a", "start": 0}]}, r"steps\[0\] must be a \{text, start, end\} object"),
    ({"labels": [0.0]}, "1 labels for 2 steps"),
    ({"labels": ["wrong", 0]}, "field 'labels' must be a list of numbers or nulls"),
    ({"first_error": "0"}, "field 'first_error' must be an integer or null"),
  ],
)
def test_a_bad_record_names_file_line_trajectory_and_field(tmp_path, change, match):
  bad = dict(RECORD, id="t1", **{k: v for k, v in change.items() if v is not None})
  for k, v in change.items():
    if v is None:
      del bad[k]
  path = tmp_path / "t.jsonl"
  path.write_text(json.dumps(RECORD) + "\n" + json.dumps(bad) + "\n")
  with pytest.raises(DataFormatError, match=rf"t\.jsonl:2: trajectory 't1': {match}"):
    read_trajectories(path)


def test_file_level_errors(tmp_path):
  path = tmp_path / "t.jsonl"
  path.write_text(json.dumps(RECORD) + "\n[1, 2]\n")
  with pytest.raises(DataFormatError, match=r"t\.jsonl:2: expected a trajectory record"):
    read_trajectories(path)
  path.write_text(json.dumps(RECORD) + "\n" + json.dumps(RECORD) + "\n")
  with pytest.raises(DataFormatError, match=r"t\.jsonl:2: duplicate trajectory id .* \(first on line 1\)"):
    read_trajectories(path)
  # An annotator's dict needs only its steps; the sampler's fields take their defaults.
  loose = Trajectory.from_json({"id": "x", "steps": []}, required=("steps",))
  assert loose.response is None and loose.prompt_ids == () and loose.mode == ""
  with pytest.raises(DataFormatError, match="trajectory 'x': missing field 'steps'"):
    Trajectory.from_json({"id": "x"}, required=("steps",))


def test_a_record_built_in_code_is_held_to_the_file_schema():
  """`Trajectory.check` refuses what `from_json` refuses in a file, with the same message, for the fields named."""
  good = Trajectory.from_json(RECORD)
  good.check()
  good.check("<record 0>: ", fields=("id", "prompt_ids", "response_ids"))
  for change, match in [
    ({"prompt_ids": ()}, "field 'prompt_ids' must be a non-empty list of integers >= 0"),
    ({"response_ids": (4, -8)}, "field 'response_ids' must be a list of integers >= 0"),
    ({"mode": "essay"}, "field 'mode' must be one of line, thinking"),
  ]:
    bad = dataclasses.replace(good, id="t1", **change)
    with pytest.raises(DataFormatError, match=rf"<record 3>: trajectory 't1': {match}"):
      bad.check("<record 3>: ")
    with pytest.raises(DataFormatError, match=rf"trajectory 't1': {match}"):
      Trajectory.from_json(bad.to_json())
  dataclasses.replace(good, mode="essay").check(fields=("id", "prompt_ids"))  # fields not named are not read
  with pytest.raises(DataFormatError, match="trajectory: field 'id' must be a non-empty string, found str ''"):
    dataclasses.replace(good, id="").check()
