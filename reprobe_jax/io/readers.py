"""Reading text, JSON and JSONL files with errors that name the file (and line): the one place every reader of a
stored artifact or user file goes through, so a missing file, non-UTF-8 bytes or bad JSON is a DataFormatError,
never a raw OSError / UnicodeDecodeError / JSONDecodeError from deep inside a stage."""

from __future__ import annotations

import json
import os
from typing import Any

from reprobe_jax.errors import DataFormatError
from reprobe_jax.io.seal import check_data, regular_file


def read_text(path: str | os.PathLike, what: str = "file", *, sealed: bool = False) -> str:
  """The UTF-8 text of `path`; DataFormatError naming the path (and the byte offset of the first bad byte), when it
  is not a regular file (a named pipe would block the read forever), and, when `sealed`, when its bytes do not match
  its seal (`reprobe_jax.io.seal`)."""
  path = regular_file(path, what)
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise DataFormatError(f"{path}: cannot read {what} ({e.strerror or e})") from None
  if sealed:
    check_data(path, data, what)
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise DataFormatError(
      f"{path}:{line}: {what} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
    ) from None


def read_json(
  path: str | os.PathLike, what: str = "JSON file", *, kind: type | None = dict, sealed: bool = False
) -> Any:
  """The parsed JSON of `path`; DataFormatError naming the path on unreadable, non-UTF-8 or invalid JSON, and
  when the top-level value is not of type `kind` (default dict; None accepts any). `sealed` as in `read_text`."""
  path = os.fspath(path)
  text = read_text(path, what, sealed=sealed)
  try:
    obj = json.loads(text)
  except json.JSONDecodeError as e:
    raise DataFormatError(f"{path}:{e.lineno}: {what} is not valid JSON ({e.msg} at column {e.colno})") from None
  except ValueError as e:  # e.g. an integer longer than Python's int-string conversion limit
    raise DataFormatError(f"{path}: {what} is not readable JSON ({e})") from None
  if kind is not None and not isinstance(obj, kind):
    raise DataFormatError(
      f"{path}: {what} must hold a JSON {_KIND_NAMES.get(kind, kind.__name__)}, got {type(obj).__name__}"
    )
  return obj


def read_jsonl(path: str | os.PathLike, what: str = "JSONL file", *, sealed: bool = False) -> list[tuple[int, Any]]:
  """(line number, parsed object) for every non-blank line; DataFormatError 'path:line: ...' on unreadable,
  non-UTF-8 or invalid lines. `sealed` as in `read_text`."""
  path = os.fspath(path)
  out = []
  for number, line in enumerate(read_text(path, what, sealed=sealed).split("\n"), start=1):
    if not line.strip():
      continue
    try:
      out.append((number, json.loads(line)))
    except json.JSONDecodeError as e:
      raise DataFormatError(f"{path}:{number}: invalid JSON ({e.msg} at column {e.colno})") from None
    except ValueError as e:
      raise DataFormatError(f"{path}:{number}: unreadable JSON ({e})") from None
  return out


_KIND_NAMES = {dict: "object", list: "array", str: "string"}


def shown(value: Any, limit: int = 60) -> str:
  """'<type> <repr>' of a value for an error message, cut to `limit` characters; never raises (an integer past
  Python's int-string limit has no repr)."""
  try:
    text = repr(value)
  except ValueError:
    text = "(too long to show)"
  return f"{type(value).__name__} {text if len(text) <= limit else text[: limit - 3] + '...'}"
