"""Step segmentation and exact token alignment (METHOD A1).

Text is split into steps in character space (line, sentence, paragraph or a custom regex); each step then maps to a
half-open token span [start, end) of the *actual* token ids (sampled tokens need not be what re-tokenising the text
would give). A token belongs to the step in which its last character falls, so a token that straddles a boundary
(".\\n\\n", "36.\\n") goes to the step where it ends. Steps tile the text: each step's region runs to where the next
one starts, so separators belong to the step before them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from reprobe_jax.errors import ConfigError

MODES = ("line", "sentence", "paragraph", "regex")
_HEADER = re.compile(r"^\s*(reasoning steps|solution|steps)\s*:?\s*$", re.IGNORECASE)
_ABBREVIATIONS = ("e.g", "i.e", "etc", "vs", "mr", "mrs", "ms", "dr", "prof", "fig", "eq", "approx", "no", "st")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
PARAGRAPH_END = ".\n\n"


@dataclasses.dataclass(frozen=True)
class Step:
  """A step: its text, its character region [char_start, char_end) and token span [start, end)."""

  text: str
  char_start: int
  char_end: int
  start: int = 0
  end: int = 0

  @property
  def num_tokens(self) -> int:
    return self.end - self.start


# ------------------------------------------------------------------------------------------------ text -> regions


def line_regions(text: str) -> list[tuple[int, int, str]]:
  """Non-empty, non-header lines; each region runs to the start of the next step (newlines included)."""
  out = []
  pos = 0
  for line in text.splitlines(keepends=True):
    body = line.strip()
    if body and not _HEADER.match(body):
      lead = len(line) - len(line.lstrip())
      out.append((pos + lead, body))
    pos += len(line)
  return _tile(out, len(text))


def _tile(starts: list[tuple[int, str]], end: int) -> list[tuple[int, int, str]]:
  return [(s, starts[i + 1][0] if i + 1 < len(starts) else end, body) for i, (s, body) in enumerate(starts)]


def _think_bounds(text: str) -> tuple[int, int]:
  """[start, end) of the thinking text: after <think> (if present), before </think> (if present)."""
  open_at = text.find(THINK_OPEN)
  start = open_at + len(THINK_OPEN) if open_at >= 0 else 0
  close_at = text.find(THINK_CLOSE, start)
  return start, close_at if close_at >= 0 else len(text)


def _is_sentence_end(text: str, i: int) -> bool:
  ch = text[i]
  if ch not in ".!?":
    return False
  nxt = text[i + 1] if i + 1 < len(text) else ""
  if ch == "." and i > 0 and text[i - 1].isdigit() and nxt.isdigit():
    return False  # 3.14
  if nxt and not nxt.isspace():
    return False  # "e.g.," or "a.b"
  if ch == ".":
    word = re.search(r"([A-Za-z.]+)$", text[:i])
    if word and word.group(1).lower().rstrip(".") in _ABBREVIATIONS:
      return False
  return True


def sentence_regions(text: str, min_chars: int = 20) -> list[tuple[int, int, str]]:
  """Sentences of the thinking text, split on . ! ? (not in decimals, not after abbreviations); a sentence shorter
  than `min_chars` is merged into the previous one."""
  lo, hi = _think_bounds(text)
  starts = []
  i, start = lo, lo
  while i < hi:
    if _is_sentence_end(text, i):
      starts.append((start, i + 1))
      start = i + 1
    i += 1
  if text[start:hi].strip():
    starts.append((start, hi))
  merged: list[list[int]] = []
  for s, e in starts:
    body = text[s:e].strip()
    if not body:
      continue
    if merged and len(body) < min_chars:
      merged[-1][1] = e
    else:
      merged.append([s, e])
  if len(merged) > 1 and len(text[merged[0][0]:merged[0][1]].strip()) < min_chars:
    merged[1][0] = merged[0][0]
    merged.pop(0)
  out = []
  for s, e in merged:
    lead = len(text[s:e]) - len(text[s:e].lstrip())
    out.append((s + lead, text[s:e].strip()))
  return _tile(out, hi)


def regex_regions(text: str, pattern: str) -> list[tuple[int, int, str]]:
  """Steps end after each match of `pattern` (e.g. r"\\n\\n"); the rest after the last match is a final step."""
  try:
    rx = re.compile(pattern)
  except re.error as e:
    raise ConfigError(f"step regex {pattern!r} is invalid: {e}") from e
  starts, start = [], 0
  for m in rx.finditer(text):
    if m.end() > start and text[start:m.end()].strip():
      starts.append((start, text[start:m.end()].strip()))
      start = m.end()
  if text[start:].strip():
    starts.append((start, text[start:].strip()))
  return _tile(starts, len(text))


# ------------------------------------------------------------------------------------------------ tokens


def token_end_offsets(tokenizer, ids: Sequence[int]) -> tuple[str, list[int]]:
  """The decoded text and, for each token, the character offset where it ends in that text.

  Decodes growing prefixes, so it is exact for any tokenizer whose decoding of a prefix is a prefix of the whole
  (byte-level BPE, SentencePiece); a token that completes a multi-byte character ends where the character does.
  """
  ids = list(ids)
  full = tokenizer.decode(ids)
  ends, prev = [], 0
  for k in range(1, len(ids) + 1):
    part = tokenizer.decode(ids[:k])
    n = len(part)
    if not full.startswith(part):  # an incomplete character or a decoder quirk: the common prefix
      n = 0
      while n < min(len(part), len(full)) and part[n] == full[n]:
        n += 1
    prev = max(prev, n)
    ends.append(prev)
  return full, ends


def paragraph_spans_from_tokens(tokenizer, ids: Sequence[int]) -> list[Step]:
  """Paragraph mode (SPAE, METHOD A1): a boundary is a token after which the decoded text ends with '.\\n\\n'
  (a token whose own text ends so, or the token that completes a '.' + '\\n\\n' split over two), searched only
  before </think>. Steps are the token runs between boundaries (the boundary token closes its step)."""
  ids = list(ids)
  text, ends = token_end_offsets(tokenizer, ids)
  lo, limit = _think_bounds(text)
  steps, start = [], 0
  while start < len(ends) and ends[start] <= lo:  # '<think>' and anything before it belong to no step
    start += 1
  for j in range(start, len(ends)):
    e = ends[j]
    if e > limit:
      break
    if text[:e].endswith(PARAGRAPH_END) and (j == 0 or e > ends[j - 1]):
      cs = max(ends[start - 1] if start > 0 else 0, lo)
      body = text[cs:e].strip()
      if body:
        steps.append(Step(body, cs, e, start, j + 1))
      start = j + 1
  return steps


def segment(text: str, mode: str, *, min_chars: int = 20, pattern: str | None = None) -> list[tuple[int, int, str]]:
  """Character regions (start, end, step text) of `text` in `mode` ('line', 'sentence', 'paragraph', 'regex')."""
  if mode == "line":
    return line_regions(text)
  if mode == "sentence":
    return sentence_regions(text, min_chars)
  if mode == "paragraph":
    lo, hi = _think_bounds(text)
    return [r for r in regex_regions(text[:hi], re.escape(PARAGRAPH_END)) if r[1] > lo]
  if mode == "regex":
    if not pattern:
      raise ConfigError("step mode 'regex' needs a pattern")
    return regex_regions(text, pattern)
  raise ConfigError(f"unknown step mode {mode!r}; known: {MODES}")


def align(tokenizer, ids: Sequence[int], mode: str, *, min_chars: int = 20, pattern: str | None = None,
          offset: int = 0) -> list[Step]:
  """Steps of the response token ids `ids` with exact token spans; `offset` shifts spans (e.g. by the prompt length)
  so they index the full sequence. Paragraph mode uses the token-level boundary rule of METHOD A1."""
  if mode == "paragraph":
    steps = paragraph_spans_from_tokens(tokenizer, ids)
  else:
    text, ends = token_end_offsets(tokenizer, ids)
    steps = []
    for cs, ce, body in segment(text, mode, min_chars=min_chars, pattern=pattern):
      members = [j for j, e in enumerate(ends) if cs < e <= ce]
      if members:
        steps.append(Step(body, cs, ce, members[0], members[-1] + 1))
      else:
        steps.append(Step(body, cs, ce, 0, 0))  # no token ends here: an empty span (label it NaN)
  return [dataclasses.replace(s, start=s.start + offset, end=s.end + offset) if s.end > s.start else s
          for s in steps]
