"""One registry type for everything a config names: step scorers, advantage estimators, search strategies,
annotators and task families each keep a `Registry` of their entries (tunix's function registry: one shape for
every pluggable piece, not one per module).

  SCORERS = Registry("step scorer")

  @SCORERS.register("maxprob")          # as a decorator: registers the definition and returns it unchanged
  def maxprob(...): ...

  SCORERS.register("probe", make_probe)  # as a call
  SCORERS.get("maxprob")                 # the entry; ConfigError naming the known ones for an unknown name

A name is registered once; `names()`, `values()`, `items()` and iteration follow registration order (the order a
job's default grid runs in), `name in registry` asks whether one is registered and `registry[name]` is `get`.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Iterator, TypeVar, overload

from reprobe_jax.errors import ConfigError

T = TypeVar("T")
_DECORATE = object()  # register(name) with no entry: used as a decorator


class Registry(Generic[T]):
  """Entries of one category (e.g. 'step scorer'), found by name."""

  def __init__(self, category: str):
    self.category = category
    self._entries: dict[str, T] = {}

  @overload
  def register(self, name: str) -> Callable[[T], T]: ...

  @overload
  def register(self, name: str, entry: T) -> T: ...

  def register(self, name: str, entry: Any = _DECORATE) -> Any:
    """`register(name, entry)` adds `entry` and returns it; `register(name)` is a decorator that does the same with
    the definition below it. ConfigError when `name` is not a non-empty string or is already registered."""
    if not isinstance(name, str) or not name:
      raise ConfigError(f"a {self.category} needs a non-empty string name, got {name!r}")
    if name in self._entries:
      raise ConfigError(f"{self.category} {name!r} is already registered")
    if entry is _DECORATE:
      return lambda definition: self.register(name, definition)
    self._entries[name] = entry
    return entry

  def get(self, name: str) -> T:
    """The entry registered as `name`; ConfigError naming the known entries otherwise."""
    try:
      return self._entries[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name (a list from a config file)
      raise ConfigError(f"unknown {self.category} {name!r}; known: {', '.join(sorted(self._entries))}") from None

  __getitem__ = get

  def names(self) -> tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(self._entries)

  def values(self) -> tuple[T, ...]:
    """The entries, in registration order."""
    return tuple(self._entries.values())

  def items(self) -> tuple[tuple[str, T], ...]:
    """(name, entry) pairs, in registration order."""
    return tuple(self._entries.items())

  def __contains__(self, name: object) -> bool:
    try:
      return name in self._entries
    except TypeError:
      return False

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def __len__(self) -> int:
    return len(self._entries)

  def __repr__(self) -> str:
    return f"Registry({self.category!r}: {', '.join(self._entries)})"
