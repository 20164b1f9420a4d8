"""Each step mode's rules as a machine over the characters of the decoded text (docs/method.md §A1), built into a
minimised byte automaton (`mode_automaton`) by `reprobe_jax.steps.automaton.build`.

These are the rules of `reprobe_jax.steps.segment`, read one character at a time and never looking ahead: a step
that only shows its end at the next character (a sentence, seen at the next sentence's first letter) raises a GATE
there. The think tags wrap sentence and paragraph mode: '<think>' drops the unfinished step, and after '</think>'
nothing is a step.
"""

from __future__ import annotations

import functools

from reprobe_jax.steps.automaton import COUNT, CUT, GATE, MARK, RESET, SINK, ByteAutomaton, Machine, build
from reprobe_jax.steps.modes import (
  ABBREVIATIONS,
  HEADER_WORDS,
  SENTENCE_ENDS,
  THINK_CLOSE,
  THINK_OPEN,
  WHITESPACE,
  regex_literals,
)


def _char(sym: int) -> str:
  return chr(sym) if sym < 128 else ""


def _is_space(ch: str) -> bool:
  return bool(ch) and ch in WHITESPACE


_KEYWORD_PREFIXES = {w[:k] for w in HEADER_WORDS for k in range(1, len(w) + 1)}


def _line_is_step(state) -> bool:
  phase, head = state
  return phase == "text" or (phase == "head" and head not in HEADER_WORDS and head not in ("K", "C"))


def _line_step(state, sym):
  """Line mode: a step ends after the newline of a line that is neither blank nor a header. `head` follows the
  header words case-insensitively: a word prefix, then K (the word, spaces allowed), then C (its ':')."""
  phase, head = state
  ch = _char(sym)
  if ch == "\n":
    return ("bol", ""), CUT if _line_is_step(state) else 0
  if _is_space(ch):
    if phase != "head" or head in ("K", "C"):
      return state, 0
    if head + ch in _KEYWORD_PREFIXES:
      return ("head", head + ch), 0
    return ("head", "K") if head in HEADER_WORDS else ("text", ""), 0
  ev = 0
  if phase == "bol":
    phase, head, ev = "head", "", MARK
  if phase == "text":
    return state, 0
  if head == "K" and ch == ":":
    return ("head", "C"), ev
  if head not in ("K", "C"):
    if ch and head + ch.lower() in _KEYWORD_PREFIXES:
      return ("head", head + ch.lower()), ev
    if head in HEADER_WORDS and ch == ":":
      return ("head", "C"), ev
  return ("text", ""), ev


def _paragraph_step(state, sym):
  """Paragraph mode: a step ends after '.\\n\\n' (`dot`: 1 after '.', 2 after '.\\n')."""
  started, dot = state
  ch = _char(sym)
  ev = 0
  if not started and not _is_space(ch):
    started, ev = True, MARK
  if ch == ".":
    return (started, 1), ev
  if ch == "\n" and dot == 2:
    return (False, 0), ev | CUT
  return (started, 2 if ch == "\n" and dot == 1 else 0), ev


_ABBREVIATION_PREFIXES = {a[:k] for a in ABBREVIATIONS for k in range(1, len(a) + 1)}


def _word_after(word, c: str):
  """The run of letters and dots before a '.', as far as abbreviations care: None (no run), a prefix of an
  abbreviation, 'ABBR.' (an abbreviation and dots) or 'DEAD' (no abbreviation)."""
  if word == "DEAD" or (word == "ABBR." and c != "."):
    return "DEAD"
  if word == "ABBR.":
    return word
  r = (word or "") + c
  if r in _ABBREVIATION_PREFIXES:
    return r
  return "ABBR." if r.rstrip(".") in ABBREVIATIONS else "DEAD"


def _is_abbreviation(word) -> bool:
  return word == "ABBR." or (word not in (None, "DEAD") and word.rstrip(".") in ABBREVIATIONS)


def _sentence_step(state, sym):
  """Sentence mode: after . ! ? (a '.' not closing an abbreviation) and whitespace, the next character opens a gate:
  the step ends before it if the step holds min_chars characters. Phases: lead (no text yet), body, term (after a
  sentence end), pend (after its whitespace)."""
  phase, word = state
  ch = _char(sym)
  space = _is_space(ch)
  if phase == "lead":
    if space:
      return state, 0
    ev = MARK | COUNT
  else:
    ev = GATE | COUNT if phase == "pend" and not space else COUNT
  if space:
    return ("pend" if phase in ("term", "pend") else "body", None), ev
  if ch == ".":
    return ("body" if _is_abbreviation(word) else "term", _word_after(word, ".")), ev
  if ch and ch in SENTENCE_ENDS:
    return ("term", None), ev
  if ch.isascii() and ch.isalpha():
    return ("body", _word_after(word, ch.lower())), ev
  return ("body", None), ev


def _regex_machine(literals: tuple[str, ...]) -> Machine:
  """Regex mode: Aho-Corasick over the literals; a step ends at the earliest end of a match once it holds text."""
  goto, out = [[0] * 128], [False]
  for lit in literals:
    node = 0
    for b in lit.encode():
      if not goto[node][b]:
        goto[node][b] = len(goto)
        goto.append([0] * 128)
        out.append(False)
      node = goto[node][b]
    out[node] = True
  fail, queue = [0] * len(goto), [goto[0][b] for b in range(128) if goto[0][b]]
  while queue:  # breadth first: fill the missing edges from the failure links
    node = queue.pop(0)
    out[node] = out[node] or out[fail[node]]
    for b in range(128):
      child = goto[node][b]
      if child:
        fail[child] = goto[fail[node]][b] if node else 0
        queue.append(child)
      else:
        goto[node][b] = goto[fail[node]][b] if node else 0

  def step(state, sym):
    started, node = state
    ev = 0
    if not started and not _is_space(_char(sym)):
      started, ev = True, MARK
    node = goto[node][sym] if sym < 128 else 0
    if out[node]:
      return (False, 0), ev | (CUT if started else 0)
    return (started, node), ev

  return Machine((False, 0), step, lambda state: state[0])


_TAG_PREFIXES = {t[:k] for t in (THINK_OPEN, THINK_CLOSE) for k in range(len(t) + 1)}


def _with_think_tags(start, step, final) -> Machine:
  """'<think>' drops the unfinished step; after '</think>' the automaton is a sink that never ends a step."""

  def tagged(state, sym):
    if state == "sink":
      return state, 0
    tag, core = state
    core, ev = step(core, sym)
    ch = _char(sym)
    tag = tag + ch if ch and tag + ch in _TAG_PREFIXES else "<" if ch == "<" else ""  # '<' opens both tags only
    if tag == THINK_CLOSE:
      return "sink", ev | SINK
    if tag == THINK_OPEN:
      return ("", start), ev | RESET
    return (tag, core), ev

  return Machine(("", start), tagged, lambda state: state != "sink" and final(state[1]))


@functools.lru_cache(maxsize=None)
def mode_automaton(mode: str, pattern: str | None = None) -> ByteAutomaton:
  """The minimised byte automaton of a boundary mode (`pattern`: regex mode's literal alternation); built once."""
  if mode == "line":
    return build(Machine(("bol", ""), _line_step, _line_is_step))
  if mode == "paragraph":
    return build(_with_think_tags((False, 0), _paragraph_step, lambda state: False))
  if mode == "sentence":
    return build(_with_think_tags(("lead", None), _sentence_step, lambda state: state[0] != "lead"))
  return build(_regex_machine(regex_literals(pattern)))
