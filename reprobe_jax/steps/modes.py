"""The step modes and their vocabulary (docs/method.md §A1): the boundary modes, the response formats and the boundary
mode each one is aligned with, the think tags, and the characters the modes' rules read.

`segment.py` states each mode at the character level and `machines.py` as a byte automaton; both read the constants
here, and everything else (tasks, trajectories, search) takes its modes from this module.
"""

from __future__ import annotations

import re

from reprobe_jax.errors import ConfigError

MODES = ("line", "sentence", "paragraph", "regex")  # boundary modes: where a step ends
# Response formats (a task's answer mode): 'line' answers in '- Step k: ...' lines, 'thinking' thinks in paragraphs
# between the think tags; each is aligned, searched and stopped in its boundary mode.
STEP_MODE = {"line": "line", "thinking": "paragraph"}
RESPONSE_FORMATS = tuple(STEP_MODE)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

WHITESPACE = " \t\n\r\x0b\x0c"  # ASCII whitespace (what `bytes.isspace` means): a device reads bytes
HEADER_WORDS = ("reasoning steps", "solution", "steps")  # a line that is one of these (then ':') is no step
ABBREVIATIONS = ("e.g", "i.e", "etc", "vs", "mr", "mrs", "ms", "dr", "prof", "fig", "eq", "approx", "no", "st")
SENTENCE_ENDS = ".!?"
PARAGRAPH_END = ".\n\n"


def regex_literals(pattern: str) -> tuple[str, ...]:
  """The literal strings a step pattern alternates ('\\n\\n|;' -> ('\\n\\n', ';')); ConfigError for anything that is
  not an alternation of ASCII literals (a device stop rule must know a match has ended without reading further)."""
  try:
    re.compile(pattern)
  except re.error as e:
    raise ConfigError(f"step regex {pattern!r} is invalid: {e}") from e
  control = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
  out, cur, i = [], [], 0
  while i < len(pattern):
    ch = pattern[i]
    if ch == "\\" and i + 1 < len(pattern):
      nxt = pattern[i + 1]
      if nxt in control:
        cur.append(control[nxt])
      elif nxt.isalnum():
        raise ConfigError(
          f"step regex {pattern!r}: class \\{nxt} is not supported; steps split on an alternation of "
          "literal strings, e.g. r'\\n\\n|;'"
        )
      else:
        cur.append(nxt)
      i += 2
      continue
    if ch == "|":
      out.append("".join(cur))
      cur = []
    elif ch in ".^$*+?{}[]()":
      raise ConfigError(
        f"step regex {pattern!r}: {ch!r} is not supported; steps split on an alternation of literal "
        f"strings (escape it as '\\{ch}' to match it)"
      )
    else:
      cur.append(ch)
    i += 1
  out.append("".join(cur))
  if any(not lit for lit in out):
    raise ConfigError(f"step regex {pattern!r} has an empty alternative")
  if not all(lit.isascii() for lit in out):
    raise ConfigError(f"step regex {pattern!r}: literals must be ASCII")
  return tuple(out)


def check_mode(mode: str, pattern: str | None = None) -> None:
  """ConfigError unless `mode` is one of MODES and, in regex mode, `pattern` an alternation of ASCII literals."""
  if mode not in MODES:
    raise ConfigError(f"unknown step mode {mode!r}; known: {MODES}")
  if mode == "regex":
    if not pattern:
      raise ConfigError("step mode 'regex' needs a pattern")
    regex_literals(pattern)
