"""The shared readers (reprobe_jax.io.readers): every failure is a DataFormatError naming the file (and line)."""

import json

import pytest
from hypothesis import given, settings, strategies as st

from reprobe_jax.errors import DataFormatError
from reprobe_jax.io.readers import read_json, read_jsonl, read_text


def test_missing_file_is_named(tmp_path):
  with pytest.raises(DataFormatError, match=r"nope\.json: cannot read config"):
    read_json(tmp_path / "nope.json", "config")


def test_non_utf8_names_file_line_and_offset(tmp_path):
  path = tmp_path / "a.jsonl"
  path.write_bytes(b'{"a": 1}\n{"b": "\xff"}\n')
  with pytest.raises(DataFormatError, match=r"a\.jsonl:2: JSONL file is not UTF-8 text \(byte 0xff at offset 16\)"):
    read_jsonl(path)


def test_bad_json_and_wrong_top_level_kind(tmp_path):
  path = tmp_path / "c.json"
  path.write_text('{"a": ')
  with pytest.raises(DataFormatError, match=r"c\.json:1: config\.json is not valid JSON"):
    read_json(path, "config.json")
  path.write_text("[1, 2]")
  with pytest.raises(DataFormatError, match="must hold a JSON object, got list"):
    read_json(path)
  assert read_json(path, kind=list) == [1, 2]


def test_integer_past_the_digit_limit_is_a_named_error(tmp_path):
  path = tmp_path / "big.jsonl"
  path.write_text('{"x": 1}\n{"x": ' + "9" * 5000 + "}\n")
  with pytest.raises(DataFormatError, match=r"big\.jsonl:2: unreadable JSON"):
    read_jsonl(path)


def test_reads_what_was_written(tmp_path):
  path = tmp_path / "ok.jsonl"
  path.write_text('{"a": 1}\n\n  \n["é"]\n', encoding="utf-8")
  assert read_jsonl(path) == [(1, {"a": 1}), (4, ["é"])]
  assert read_text(path).startswith('{"a"')


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_jsonl_reader_raises_only_data_format_errors(tmp_path_factory, data):
  path = tmp_path_factory.mktemp("fuzz") / "f.jsonl"
  path.write_bytes(data)
  try:
    rows = read_jsonl(path)
  except DataFormatError as e:
    assert str(path) in str(e)
    return
  for number, obj in rows:  # what it accepts is exactly json.loads of that line
    assert json.loads(data.decode("utf-8").split("\n")[number - 1]) == obj


def test_line_separators_inside_strings_do_not_split_records(tmp_path):
  path = tmp_path / "sep.jsonl"
  path.write_text('{"t": "a\u2028b\x85c"}\n', encoding="utf-8")
  assert read_jsonl(path) == [(1, {"t": "a\u2028b\x85c"})]
