"""Job configs: a plain mapping (what the CLI's ml_collections ConfigDict gives with `to_dict()`) -> the job's
frozen dataclass, checked whole before any work starts. Library code takes only the dataclasses.

Two layers of checks, each in one place: `replace_fields` checks every given value against the type annotation of
its field (a string for an int, a scalar for a nested config, a mapping for a scalar), and each config dataclass
checks its ranges in `__post_init__` with `check_fields` and the rules below (`Int`, `Real`, `OneOf`, `Seq`). Errors
name the dotted field (`config.train.epochs: expected an int >= 1, got -1`): while `replace_fields` builds a config
from a mapping, a dataclass's checks name the path it is built at, otherwise the dataclass's own name.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import numbers
import types
import typing
from typing import Any, Callable, Iterator, Mapping, TypeVar

from reprobe_jax.errors import ConfigError

T = TypeVar("T")

_WHERE: contextvars.ContextVar[str | None] = contextvars.ContextVar("reprobe_config_path", default=None)


def field_name(obj: Any, name: str) -> str:
  """The dotted name of `obj.name` in error messages: 'config.train.epochs' while `replace_fields` builds `obj` at
  'train', else 'ProbeTrainConfig.epochs'."""
  where = _WHERE.get()
  return f"{type(obj).__name__ if where is None else where}.{name}"


@contextlib.contextmanager
def _building_at(name: str) -> Iterator[None]:
  token = _WHERE.set(name)
  try:
    yield
  finally:
    _WHERE.reset(token)


def replace_fields(
  obj: T,
  values: Mapping[str, Any],
  where: str = "",
  convert: Mapping[str, Callable[[Any], Any]] | None = None,
  *,
  root: str = "config",
) -> T:
  """`obj` (a frozen dataclass) with the fields named in `values` replaced; ConfigError naming an unknown field or
  a value of the wrong type (`<root>.<where>.<field>: expected ..., got ...`; root names the whole config in
  messages, e.g. 'config.target' for a nested job's).

  A mapping given for a dataclass field replaces that dataclass's fields in turn; a list for a tuple field becomes
  a tuple; an int for a float field becomes a float. `convert` maps a dotted field path ('a.b') to a function that
  makes the field's value from what was given (e.g. `sorted_pairs`, or a parser for a field whose default is None).
  """
  convert = convert or {}
  prefix = root + (f".{where}" if where else "")
  if not isinstance(values, Mapping):
    raise ConfigError(f"{prefix}: expected a mapping of {type(obj).__name__} fields, got {values!r}")
  names = {f.name for f in dataclasses.fields(obj)}
  unknown = sorted(set(values) - names, key=str)
  if unknown:
    raise ConfigError(f"{prefix}: unknown field(s) {unknown}; known: {sorted(names)}")
  hints = _hints(type(obj))
  changes = {}
  for name, value in values.items():
    path = f"{where}.{name}" if where else name
    current = getattr(obj, name)
    if path in convert:  # then checked against the annotation like any value
      try:
        value = _conform(convert[path](value), hints.get(name, Any), f"{root}.{path}")
      except (TypeError, ValueError) as e:
        raise ConfigError(f"{root}.{path}: cannot read {value!r} ({e})") from None
    elif dataclasses.is_dataclass(current) and isinstance(value, Mapping):
      value = replace_fields(current, value, path, convert, root=root)
    else:
      value = _conform(value, hints.get(name, Any), f"{root}.{path}")
    changes[name] = value
  with _building_at(prefix):
    return dataclasses.replace(obj, **changes)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def _conform(value: Any, hint: Any, field: str) -> Any:
  """`value` as a value of type `hint` (list -> tuple, int -> float), or ConfigError naming `field`."""
  out = _as_type(value, hint)
  if out is _MISMATCH:
    raise ConfigError(f"{field}: expected {_type_name(hint)}, got {value!r}")
  return out


_MISMATCH = object()


def _as_type(value: Any, hint: Any) -> Any:
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if hint is Any:
    return value
  if origin in (typing.Union, types.UnionType):
    for arm in args:
      out = _as_type(value, arm)
      if out is not _MISMATCH:
        return out
    return _MISMATCH
  if hint is type(None):
    return value if value is None else _MISMATCH
  if hint is bool:
    return value if isinstance(value, bool) else _MISMATCH
  if hint is int:
    return value if isinstance(value, numbers.Integral) and not isinstance(value, bool) else _MISMATCH
  if hint is float:
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else _MISMATCH
  if hint is str:
    return value if isinstance(value, str) else _MISMATCH
  if origin is tuple:
    if not isinstance(value, (list, tuple)):
      return _MISMATCH
    items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
    if len(items) != len(value):
      return _MISMATCH
    out = tuple(_as_type(v, h) for v, h in zip(value, items))
    return _MISMATCH if any(o is _MISMATCH for o in out) else out
  if isinstance(hint, type) and dataclasses.is_dataclass(hint):
    return value if isinstance(value, hint) else _MISMATCH
  return value  # a type this layer does not model (the dataclass's own checks see it)


def _type_name(hint: Any) -> str:
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin in (typing.Union, types.UnionType):
    return " or ".join(_type_name(a) for a in args)
  if origin is tuple:
    if len(args) == 2 and args[1] is Ellipsis:
      return f"a sequence of ({_type_name(args[0])})"
    return f"a sequence of {len(args)} ({', '.join(_type_name(a) for a in args)})"
  if isinstance(hint, type) and dataclasses.is_dataclass(hint):
    return f"a mapping of {hint.__name__} fields"
  return {bool: "a bool", int: "an int", float: "a number", str: "a string", type(None): "None"}.get(hint, str(hint))


# Range rules: each says whether a value passes and how to describe what passes.


@dataclasses.dataclass(frozen=True)
class Int:
  """An int (not a bool) in [low, high] (None = unbounded)."""

  low: int | None = None
  high: int | None = None

  def ok(self, v: Any) -> bool:
    return (
      isinstance(v, numbers.Integral)
      and not isinstance(v, bool)
      and (self.low is None or v >= self.low)
      and (self.high is None or v <= self.high)
    )

  def __str__(self) -> str:
    return "an int" + _bounds(self.low, self.high, False, False)


SEED_LIMIT = 2**32
"""Seeds are ints in [0, 2**32): a PRNG key holds 32 bits of the seed, so a larger seed would silently wrap onto a
smaller one (seed 7 and 7 + 2**32 would sample the same)."""


@dataclasses.dataclass(frozen=True)
class _Seed(Int):
  def __str__(self) -> str:
    return "a seed, " + super().__str__()


SEED = _Seed(0, SEED_LIMIT - 1)
"""The one rule every public entry that takes a seed checks it against (configs through `check_fields`, arguments
through `check_seed`): `expected a seed, an int in [0, 4294967295], got ...` either way."""


def check_seed(value: Any, name: str) -> int:
  """`value` as a Python int if it passes `SEED`; ConfigError `<name>: expected a seed, an int in [0, 4294967295],
  got ...` otherwise (a float, a bool, a string, a negative or too large number)."""
  if not SEED.ok(value):
    raise ConfigError(f"{name}: expected {SEED}, got {value!r}")
  return int(value)


def check_seeds(values: Any, name: str) -> list[int]:
  """Each item of `values` checked by `check_seed` as `<name>[i]`; ConfigError when `values` is not a sequence."""
  if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or not hasattr(values, "__iter__"):
    raise ConfigError(f"{name}: expected a sequence of seeds, got {values!r}")
  return [check_seed(v, f"{name}[{i}]") for i, v in enumerate(values)]


@dataclasses.dataclass(frozen=True)
class Real:
  """A finite number (not a bool) between low and high, each bound closed unless marked open."""

  low: float | None = None
  high: float | None = None
  low_open: bool = False
  high_open: bool = False

  def ok(self, v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
      return False
    low_ok = self.low is None or (v > self.low if self.low_open else v >= self.low)
    return low_ok and (self.high is None or (v < self.high if self.high_open else v <= self.high))

  def __str__(self) -> str:
    return "a finite number" + _bounds(self.low, self.high, self.low_open, self.high_open)


@dataclasses.dataclass(frozen=True)
class OneOf:
  """One of the given values."""

  choices: tuple

  def ok(self, v: Any) -> bool:
    return any(type(v) is type(c) and v == c for c in self.choices)

  def __str__(self) -> str:
    return "one of " + ", ".join(map(repr, self.choices))


@dataclasses.dataclass(frozen=True)
class Seq:
  """A tuple whose items each pass `item`; non-empty and without repeats unless told otherwise."""

  item: Any
  nonempty: bool = True
  distinct: bool = True

  def ok(self, v: Any) -> bool:
    return (
      isinstance(v, tuple)
      and all(self.item.ok(x) for x in v)
      and (len(v) > 0 or not self.nonempty)
      and (not self.distinct or len(set(v)) == len(v))
    )

  def __str__(self) -> str:
    words = [w for w, on in (("non-empty", self.nonempty), ("distinct", self.distinct)) if on]
    return f"a {' '.join(words + ['tuple'])} of ({self.item})"


@dataclasses.dataclass(frozen=True)
class Pairs:
  """A mapping stored as (key, value) pairs (`sorted_pairs`): distinct keys passing `key`, values passing `value`,
  every key of `required` present."""

  key: Any
  value: Any
  required: tuple = ()

  def ok(self, v: Any) -> bool:
    if not isinstance(v, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in v):
      return False
    keys = [k for k, _ in v]
    return (
      all(self.key.ok(k) and self.value.ok(x) for k, x in v)
      and len(set(keys)) == len(keys)
      and set(self.required) <= set(keys)
    )

  def __str__(self) -> str:
    need = f", with every key of {list(self.required)}" if self.required else ""
    return f"a mapping of ({self.key}) to ({self.value}){need}"


def _bounds(low, high, low_open: bool, high_open: bool) -> str:
  if low is not None and high is not None:
    return f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
  if low is not None:
    return f" {'>' if low_open else '>='} {low}"
  if high is not None:
    return f" {'<' if high_open else '<='} {high}"
  return ""


def check_fields(obj: Any, rules: Mapping[str, Any], where: str | None = None) -> None:
  """ConfigError `<where>.<field>: expected <rule>, got <value>` for the first field of `obj` that fails its rule;
  `where` defaults to `field_name`'s prefix (the path `replace_fields` builds `obj` at, or its class name)."""
  for name, rule in rules.items():
    value = getattr(obj, name)
    if not rule.ok(value):
      raise ConfigError(f"{where + '.' + name if where else field_name(obj, name)}: expected {rule}, got {value!r}")


def sorted_pairs(value: Mapping | Any) -> tuple:
  """A mapping (or (key, value) pairs) as sorted (key, value) pairs: how a frozen config stores a dict."""
  return tuple(sorted(dict(value).items()))


def plain(config: Any) -> dict:
  """A ConfigDict (or any mapping) as a plain dict."""
  return dict(config.to_dict() if hasattr(config, "to_dict") else config)
