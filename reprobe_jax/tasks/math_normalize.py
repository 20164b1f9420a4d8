"""The cheap half of math answer comparison: text clean-up, exact numbers, tuples and plain words.

`reprobe_jax.tasks.math.judge_answer` settles most answers here, in microseconds and without sympy: GSM8K answers are
numbers, and MATH answers are mostly numbers, fractions and tuples of them. What is left (radicals, expressions,
equations, sets of expressions) goes to math-verify under a time limit (`tasks/math_sandbox.py`). docs/tasks.md
("Math answers") lists the rules.
"""

from __future__ import annotations

import dataclasses
import re
from fractions import Fraction

ROUND_PLACES = 6  # a decimal answer is compared to this many places, as math-verify's default float_rounding

_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_BOX_TOKEN = re.compile(r"\s+([^\s${}\\]+)")  # `\boxed 5`: the token after the space
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_DFRAC = re.compile(r"\\[dt]frac(?![A-Za-z])")
_TEXT = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])")
_SPACING = re.compile(r"\\[,;:! ]|\\q?quad(?![A-Za-z])|~")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![A-Za-z])")
_CURRENCY = re.compile(r"\\\$|\$|€|£|¥|\\euro(?![A-Za-z])|\\pounds(?![A-Za-z])")
_ASSIGN = re.compile(r"[A-Za-z](?:_\{?\w+\}?)?\s*=\s*")  # `x = `, `a_1 = `, `x_{n} = ` before an answer

_DECIMAL = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+"  # 1,000 and 1,000.5 as thousands, 18. and .5 too
_NUMBER = re.compile(
  rf"(?P<sign>[-+]?)\s*(?:(?P<dec>{_DECIMAL})"
  r"|\\frac\s*\{\s*(?P<fn>-?\d+)\s*\}\s*\{\s*(?P<fd>-?\d+)\s*\}"
  r"|\\frac\s*(?P<sn>\d)(?P<sd>\d)"  # \frac12
  r"|(?P<n>\d+)\s*/\s*(?P<d>\d+))"
  r"\s*(?P<pct>%)?"
  # Units after a number: words of two letters or more (`cm`, `dollars per hour`, `m^2`) or a lone SI letter, but
  # not a constant or function written in plain letters (`5 pi`, `2 sqrt 3`). Each word is whole, so no backtracking.
  r"(?:\s*(?!(?:pi|sqrt|ln|log|exp|sin|cos|tan|infty|inf)(?![A-Za-z]))"
  r"(?:[A-Za-z]{2,}|[mgsLh])(?![A-Za-z])\.?(?:\^\{?\d\}?)?)*"
)
_WORDS = re.compile(r"[^\W\d_]+(?:[\s'\-]+[^\W\d_]+)*")
_OPEN, _CLOSE = {"(": 1, "[": 1, "{": 1}, {")": 1, "]": 1, "}": 1}


def balanced_group(text: str, start: int, limit: int | None = None) -> str | None:
  """The text inside the brace group opening at `text[start] == '{'`, braces balanced and escaped braces (`\\{`)
  passed over; None when the group does not close before `limit` (default: the end)."""
  depth, j, end = 0, start, len(text) if limit is None else limit
  while j < end:
    c = text[j]
    if c == "\\":
      j += 2
      continue
    if c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
      if depth == 0:
        return text[start + 1 : j]
    j += 1
  return None


def last_boxed(text: str) -> str | None:
  """The content of the last well-formed, non-empty `\\boxed{...}` / `\\fbox{...}` (or `\\boxed 5`), stripped.

  Linear in the text however many boxes it holds: when a box does not close, no earlier box can close after its
  start (it would have to close the later one first), so earlier scans stop there."""
  limit = len(text)
  for m in reversed(list(_BOX.finditer(text))):
    j = m.end()
    while j < limit and text[j].isspace():
      j += 1
    if j < limit and text[j] == "{":
      content = balanced_group(text, j, limit)
      if content is None:
        limit = m.start()
    else:
      token = _BOX_TOKEN.match(text, m.end())
      content = token.group(1) if token else None
    if content and content.strip():
      return content.strip()
  return None


def clean(text: str) -> str:
  """The answer with its wrapping and typesetting taken off: a whole `\\boxed{}`, math delimiters, `\\text{}`-style
  wrappers (their words kept), `\\left`/`\\right`, spacing commands, degree signs, currency signs, `\\dfrac` and
  `\\tfrac` as `\\frac`, `{,}` as `,`, a trailing period, and a leading `x =` when it is the only `=`."""
  s = text.strip().replace("\u2212", "-")
  if (m := _BOX.match(s)) and s[m.end() :].lstrip().startswith("{"):
    opening = len(s) - len(s[m.end() :].lstrip())
    inner = balanced_group(s, opening)
    if inner is not None and opening + len(inner) + 2 == len(s):
      s = inner.strip()  # the whole answer is one \boxed{...}
  for opening, closing in _DELIMITERS:
    if len(s) > len(opening) + len(closing) and s.startswith(opening) and s.endswith(closing):
      s = s[len(opening) : -len(closing)].strip()
      break
  s = _DFRAC.sub(r"\\frac", s)
  s = _TEXT.sub(r" \1", s)
  s = _LEFT_RIGHT.sub("", s)
  s = _SPACING.sub(" ", s)
  s = _DEGREES.sub("", s)
  s = s.replace("{,}", ",").replace("\\%", "%")
  s = _CURRENCY.sub("", s)
  s = " ".join(s.split()).rstrip(".").strip()
  if s.count("=") == 1 and (m := _ASSIGN.match(s)):
    s = s[m.end() :]
  return s


@dataclasses.dataclass(frozen=True)
class Number:
  """An answer read as one exact number; `decimal` when written with a decimal point, `percent` with a '%'."""

  value: Fraction
  decimal: bool
  percent: bool


def number(text: str) -> Number | None:
  """`text` (cleaned) as one number: an integer (thousands separators allowed), a decimal, `a/b`, `\\frac{a}{b}`,
  with an optional sign, '%' and unit words; None for anything else (an expression, a zero denominator, an integer
  past Python's int-string limit)."""
  m = _NUMBER.fullmatch(text)
  if m is None:
    return None
  try:
    if m["dec"] is not None:
      value = Fraction(m["dec"].replace(",", "") + ("0" if m["dec"].endswith(".") else ""))
    else:
      num, den = (m["fn"], m["fd"]) if m["fn"] is not None else (m["sn"], m["sd"]) if m["sn"] else (m["n"], m["d"])
      value = Fraction(int(num), int(den))
  except (ValueError, ZeroDivisionError):
    return None
  return Number(-value if m["sign"] == "-" else value, m["dec"] is not None and "." in m["dec"], m["pct"] is not None)


def same_number(a: Number, b: Number) -> bool:
  """Exactly equal, or equal to ROUND_PLACES places when either is a decimal. A percent equals its number with or
  without the sign (`50%` = `50`, as GSM8K's "what percent" answers are written) and its fraction (`50%` = `0.5`)."""

  def close(x: Fraction, y: Fraction) -> bool:
    return round(x, ROUND_PLACES) == round(y, ROUND_PLACES) if a.decimal or b.decimal else x == y

  if a.percent == b.percent:
    return close(a.value, b.value)
  pct, plain = (a, b) if a.percent else (b, a)
  return close(pct.value, plain.value) or close(pct.value / 100, plain.value)


def brackets(text: str) -> tuple[str, list[str], str] | None:
  """(opening, items, closing) of a tuple, interval or `\\{...\\}` set of two or more items split at its top-level
  commas; None when `text` is not one bracketed group."""
  is_set = text.startswith("\\{") and text.endswith("\\}")
  body = text[2:-2] if is_set else text[1:-1]
  if len(text) < 2 or not is_set and (text[0] not in "([" or text[-1] not in ")]"):
    return None
  items, depth, start = [], 0, 0
  for j, c in enumerate(body):
    if c in _OPEN:
      depth += 1
    elif c in _CLOSE:
      depth -= 1
      if depth < 0:
        return None  # `(1, 2) \cup (3, 4)`: the first group closes before the end
    elif c == "," and depth == 0:
      items.append(body[start:j].strip())
      start = j + 1
  items.append(body[start:].strip())
  if depth != 0 or len(items) < 2:
    return None
  return ("\\{", items, "\\}") if is_set else (text[0], items, text[-1])


def same_brackets(a: tuple[str, list[str], str], b: tuple[str, list[str], str]) -> bool | None:
  """Whether two bracketed groups of numbers are equal (same brackets, same items in order; a set in any order);
  None when an item is not a number, for math-verify to decide."""
  xs, ys = [number(i) for i in a[1]], [number(i) for i in b[1]]
  if any(x is None for x in xs + ys):
    return None
  if (a[0], a[2]) != (b[0], b[2]) or len(xs) != len(ys):
    return False
  if a[0] == "\\{":
    xs, ys = sorted(xs, key=lambda x: x.value), sorted(ys, key=lambda y: y.value)
  return all(same_number(x, y) for x, y in zip(xs, ys))


def words(text: str) -> str | None:
  """`text` as plain words (letters, spaces, hyphens, apostrophes; `(C)` as `C`), casefolded; None otherwise."""
  if len(text) == 3 and text[0] == "(" and text[2] == ")":
    text = text[1]
  return " ".join(text.casefold().split()) if _WORDS.fullmatch(text) else None
