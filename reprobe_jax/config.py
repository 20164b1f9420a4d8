"""Job configs: a plain mapping (what the CLI's ml_collections ConfigDict gives with `to_dict()`) -> the job's
frozen dataclass. Library code takes only the dataclasses."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, TypeVar

from reprobe_jax.errors import ConfigError

T = TypeVar("T")


def replace_fields(obj: T, values: Mapping[str, Any], where: str = "",
                   convert: Mapping[str, Callable[[Any], Any]] | None = None) -> T:
  """`obj` (a frozen dataclass) with the fields named in `values` replaced; ConfigError naming unknown fields.

  A mapping given for a dataclass field replaces that dataclass's fields in turn; a list for a tuple field becomes
  a tuple. `convert` maps a dotted field path ('a.b') to a function that makes the field's value from what was
  given (e.g. `sorted_pairs`, or a parser for a field whose default is None).
  """
  convert = convert or {}
  names = {f.name for f in dataclasses.fields(obj)}
  unknown = sorted(set(values) - names)
  if unknown:
    raise ConfigError(f"config{'.' + where if where else ''}: unknown field(s) {unknown}; known: {sorted(names)}")
  changes = {}
  for name, value in values.items():
    path = f"{where}.{name}" if where else name
    current = getattr(obj, name)
    if path in convert:
      value = convert[path](value)
    elif dataclasses.is_dataclass(current) and isinstance(value, Mapping):
      value = replace_fields(current, value, path, convert)
    elif isinstance(current, tuple) and isinstance(value, (list, tuple)):
      value = tuple(value)
    changes[name] = value
  return dataclasses.replace(obj, **changes)


def sorted_pairs(value: Mapping | Any) -> tuple:
  """A mapping (or (key, value) pairs) as sorted (key, value) pairs: how a frozen config stores a dict."""
  return tuple(sorted(dict(value).items()))


def plain(config: Any) -> dict:
  """A ConfigDict (or any mapping) as a plain dict."""
  return dict(config.to_dict() if hasattr(config, "to_dict") else config)
