"""The readable, character-level definition of each step mode (docs/method.md §A1): the reference that the byte
automaton of `reprobe_jax.steps.machines` is tested against.

`segment(text, mode)` gives the character regions of the steps of a decoded text. Where a step ends on tokens (the
sampler's on-device stop rule and `reprobe_jax.steps.boundary.align`) is the same rule compiled into a finite
automaton over the text's bytes. Whitespace is ASCII whitespace (what `bytes.isspace` means): a device reads bytes,
not Unicode categories.
"""

from __future__ import annotations

import re
import string
from typing import NamedTuple

from reprobe_jax.steps.modes import (
  ABBREVIATIONS,
  PARAGRAPH_END,
  SENTENCE_ENDS,
  THINK_CLOSE,
  THINK_OPEN,
  WHITESPACE,
  check_mode,
  regex_literals,
)

_HEADER = re.compile(r"(reasoning steps|solution|steps)[ \t\r\x0b\x0c]*:?", re.IGNORECASE | re.ASCII)  # HEADER_WORDS
_WORD_CHARS = frozenset(string.ascii_letters + ".")


class Region(NamedTuple):
  """A step's character region (body start, end, body): the body starts at the step's first non-space character,
  the region ends where the step ends, and `text` is the body without its surrounding whitespace. Text between one
  region's end and the next body (blank lines, headers, tags) is no step's."""

  start: int
  end: int
  text: str


# ------------------------------------------------------------------------------------------------ text -> regions


def _skip_space(text: str, i: int, hi: int) -> int:
  while i < hi and text[i] in WHITESPACE:
    i += 1
  return i


def _region(text: str, lo: int, hi: int) -> Region:
  start = _skip_space(text, lo, hi)
  return Region(start, hi, text[start:hi].strip(WHITESPACE))


def line_regions(text: str) -> list[Region]:
  """Lines that are not blank and not a header; a line's region ends after its newline."""
  out, pos = [], 0
  while pos < len(text):
    nl = text.find("\n", pos)
    end = len(text) if nl < 0 else nl + 1
    start, _, body = _region(text, pos, end)
    if body and not _HEADER.fullmatch(body):
      out.append(Region(start, end, body))
    pos = end
  return out


def _think_pieces(text: str) -> list[tuple[int, int, bool]]:
  """(lo, hi, last) stretches of text the think tags leave for steps: each '<think>' discards the unfinished step
  before it, the first '</think>' ends the last stretch, and nothing after it is a step."""
  close = text.find(THINK_CLOSE)
  hi = close if close >= 0 else len(text)
  pieces, lo = [], 0
  while (at := text.find(THINK_OPEN, lo, hi)) >= 0:
    pieces.append((lo, at, False))
    lo = at + len(THINK_OPEN)
  return pieces + [(lo, hi, True)]


def _is_sentence_end(text: str, i: int) -> bool:
  """text[i] is . ! or ? followed by whitespace, and a '.' does not close an abbreviation (e.g., etc.)."""
  if text[i] not in SENTENCE_ENDS or i + 1 >= len(text) or text[i + 1] not in WHITESPACE:
    return False
  if text[i] == ".":
    j = i
    while j > 0 and text[j - 1] in _WORD_CHARS:  # the run of letters and dots before the '.'
      j -= 1
    if text[j:i].lower().rstrip(".") in ABBREVIATIONS:
      return False
  return True


def sentence_regions(text: str, min_chars: int = 20) -> list[Region]:
  """Sentences of the thinking text. A sentence ends at . ! ? followed by whitespace (not in decimals like 3.14, not
  after abbreviations); the step ends where the next sentence starts, but only once it holds at least `min_chars`
  characters (counted up to there), so a short sentence joins the one after it. The rest before '</think>' (or the
  end) is a last step."""
  out = []
  for lo, hi, last in _think_pieces(text):
    start = _skip_space(text, lo, hi)
    for i in range(start, hi):
      if not _is_sentence_end(text, i):
        continue
      p = _skip_space(text, i + 1, len(text))  # the next sentence's first character; at `hi` that is a tag's '<'
      if p < len(text) and p - start >= min_chars:
        out.append(Region(start, p, text[start:p].strip(WHITESPACE)))
        start = p
    if last and start < hi and text[start:hi].strip(WHITESPACE):
      out.append(_region(text, start, hi))
  return out


def paragraph_regions(text: str) -> list[Region]:
  """Paragraphs of the thinking text: each ends right after '.\\n\\n'; text after the last one is no step."""
  out = []
  for lo, hi, _ in _think_pieces(text):
    pos = lo
    while (at := text.find(PARAGRAPH_END, pos, hi)) >= 0:
      out.append(_region(text, pos, at + len(PARAGRAPH_END)))
      pos = at + len(PARAGRAPH_END)
  return out


def regex_regions(text: str, pattern: str) -> list[Region]:
  """A step ends at the earliest end of a match of the literal alternation `pattern` (e.g. r"\\n\\n"), once it holds
  non-space text; matching resumes after each match. The rest after the last step is a final step."""
  lits = regex_literals(pattern)
  out, start, resume = [], 0, 0
  for e in range(1, len(text) + 1):
    if any(e - len(lit) >= resume and text.startswith(lit, e - len(lit)) for lit in lits):
      resume = e
      if text[start:e].strip(WHITESPACE):
        out.append(_region(text, start, e))
        start = e
  if text[start:].strip(WHITESPACE):
    out.append(_region(text, start, len(text)))
  return out


def segment(text: str, mode: str, *, min_chars: int = 20, pattern: str | None = None) -> list[Region]:
  """Character regions of the steps of `text` in `mode` ('line', 'sentence', 'paragraph', 'regex').

  This is the readable definition; `reprobe_jax.steps.machines` states the same rules as byte automata."""
  check_mode(mode, pattern)
  if mode == "line":
    return line_regions(text)
  if mode == "sentence":
    return sentence_regions(text, min_chars)
  if mode == "paragraph":
    return paragraph_regions(text)
  return regex_regions(text, pattern)
