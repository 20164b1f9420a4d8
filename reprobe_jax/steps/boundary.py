"""One definition of where a step ends, for the sampler's on-device stop rule and the host alignment alike (METHOD A1).

A `StepBoundary` (line, sentence, paragraph or a literal regex) is a finite automaton over the bytes of the decoded text
(behind a UTF-8 decoder state, so each character, U+FFFD included, is one symbol), with a saturating character counter
for sentence mode's `min_chars`. `compile` runs it over every vocabulary entry at once (numpy, each entry's bytes
decoded once) into a `StopTable`: from automaton state s, token t moves to `transitions[s, t]` and ends a step before
and/or after itself (`ends[s, t]`). `advance` is the jittable device rule over that table, carried per row in a
sampler's `lax.while_loop` state. `StepBoundary.align` runs the same automaton over the actual ids, so every stop the
sampler makes is a span end and every span end but the last is a stop. The character-level statement of each mode is
`reprobe_jax.steps.segment`; docs/method.md says where it departs from the older prefix-decoding rules.

Ends codes: ENDS_AFTER (the token is the last of a step: it holds the step's final character, or in paragraph mode
completes '.\\n\\n'), ENDS_BEFORE (the step ended just before the token: the token holds the character that showed
it, e.g. the first letter of the next sentence, or straddles the boundary), or both.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import weakref
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from reprobe_jax.errors import ConfigError
from reprobe_jax.steps.segment import (ABBREVIATIONS, HEADER_WORDS, MODES, SENTENCE_ENDS, THINK_CLOSE, THINK_OPEN, WHITESPACE,
                               Step, byte_ends, char_offsets, check_text, regex_literals, token_bytes)

ENDS_BEFORE, ENDS_AFTER = 1, 2
COUNT_BITS = 16  # a row's state packs (automaton state << COUNT_BITS) | characters counted so far

# Input symbols of a mode's rules: an ASCII byte, or LEAD (a character that is not ASCII: a valid multi-byte
# character or a U+FFFD the decoder writes, which every rule here treats alike). The automaton reads bytes: a UTF-8
# decoder state in front of the mode's state sends LEAD on the byte that starts a character of the decoded text and
# nothing on the bytes that continue it. It reads invalid bytes as Python's and Rust's lossy decoders do (one U+FFFD
# per maximal subpart of a valid sequence: a stray continuation byte, C0, C1 or F5..FF is one character each).
LEAD, NSYM = 128, 256
_UTF8_FRESH = 0
# decoder state -> (lowest, highest) byte that continues the pending character, and the state after it
_UTF8_NEXT = {1: (0x80, 0xBF, 0), 2: (0x80, 0xBF, 1), 3: (0x80, 0xBF, 2), 4: (0xA0, 0xBF, 1), 5: (0x80, 0x9F, 1),
              6: (0x90, 0xBF, 2), 7: (0x80, 0x8F, 2)}


def _utf8_lead(b: int) -> int:
  """The decoder state after byte b read at a character boundary (0: the byte is a whole character)."""
  if 0xC2 <= b <= 0xDF:
    return 1
  if 0xE0 <= b <= 0xEF:
    return {0xE0: 4, 0xED: 5}.get(b, 2)
  if 0xF0 <= b <= 0xF4:
    return {0xF0: 6, 0xF4: 7}.get(b, 3)
  return _UTF8_FRESH


def _utf8_step(u: int, b: int) -> tuple[int, int | None]:
  """(decoder state, symbol or None) after byte b: None when b continues the pending character."""
  if u != _UTF8_FRESH:
    lo, hi, nxt = _UTF8_NEXT[u]
    if lo <= b <= hi:
      return nxt, None
  return (_UTF8_FRESH, b) if b < 0x80 else (_utf8_lead(b), LEAD)


# Automaton events on a byte.
GATE = 1  # a step ends before this byte if it holds >= min_chars counted characters
MARK = 2  # a step's text may start at this byte
COUNT = 4  # this byte counts towards min_chars
CUT = 8  # a step ends after this byte
RESET = 16  # after this byte the unfinished step is dropped ('<think>')
SINK = 32  # after this byte nothing is a step ('</think>')
_GATE_NONE = -(2 ** 15)  # gate_at of an unused gate slot: never opens


@dataclasses.dataclass(frozen=True)
class _Machine:
  start: object
  step: Callable[[object, int], tuple[object, int]]  # (state, symbol) -> (state, events)
  final: Callable[[object], bool]  # whether the unfinished step is a step if the text ends here


def _char(sym: int) -> str:
  return chr(sym) if sym < 128 else ""


def _is_space(ch: str) -> bool:
  return bool(ch) and ch in WHITESPACE


# ------------------------------------------------------------------------------------------------ the modes


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


def _regex_machine(literals: tuple[str, ...]) -> tuple[object, Callable, Callable]:
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

  return (False, 0), step, lambda state: state[0]


_TAG_PREFIXES = {t[:k] for t in (THINK_OPEN, THINK_CLOSE) for k in range(len(t) + 1)}


def _with_think_tags(start, step, final) -> _Machine:
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

  return _Machine(("", start), tagged, lambda state: state != "sink" and final(state[1]))


# ------------------------------------------------------------------------------------------------ automaton


@dataclasses.dataclass(frozen=True, eq=False)
class _Automaton:
  delta: np.ndarray  # [S, NSYM] int64
  events: np.ndarray  # [S, NSYM] int64
  final: np.ndarray  # [S] bool

  @functools.cached_property
  def lists(self):
    return self.delta.tolist(), self.events.tolist(), self.final.tolist()


def _build(machine: _Machine) -> _Automaton:
  """The mode's machine behind a UTF-8 decoder, over bytes: explores the reachable (decoder, mode) states breadth
  first, then merges equivalent ones (Moore's partition refinement)."""
  start = (_UTF8_FRESH, machine.start)
  index, states, delta, events = {start: 0}, [start], [], []
  while len(delta) < len(states):
    u, core = states[len(delta)]
    row_d, row_e = [], []
    for b in range(NSYM):
      u2, sym = _utf8_step(u, b)
      nxt, ev = (core, 0) if sym is None else machine.step(core, sym)
      if (u2, nxt) not in index:
        index[(u2, nxt)] = len(states)
        states.append((u2, nxt))
      row_d.append(index[(u2, nxt)])
      row_e.append(ev)
    delta.append(row_d)
    events.append(row_e)
  delta, events = np.array(delta, np.int64), np.array(events, np.int64)
  final = np.array([machine.final(core) for _, core in states])
  block = np.unique(np.concatenate([final[:, None], events], 1), axis=0, return_inverse=True)[1].ravel()
  while True:
    refined = np.unique(np.concatenate([block[:, None], block[delta]], 1), axis=0, return_inverse=True)[1].ravel()
    if refined.max() == block.max():
      break
    block = refined
  _, first = np.unique(block, return_index=True)
  rank = np.empty(len(first), np.int64)
  rank[np.argsort(first)] = np.arange(len(first))  # number the classes by first state, so the start stays 0
  block = rank[block]
  keep = np.sort(first)
  return _Automaton(block[delta[keep]], events[keep], final[keep])


# ------------------------------------------------------------------------------------------------ device table


class StopTable(struct.PyTreeNode):
  """Token-level stop rule of one StepBoundary for one tokenizer; pass it as a traced argument (a new boundary whose
  table has the same shapes compiles nothing). S automaton states (padded to a power of two), V the model's vocab,
  K the most sentence gates one token can open (1 unless a token holds two sentence ends)."""

  transitions: jax.Array  # [S, V] int32
  ends: jax.Array  # [S, V] int8: ENDS_BEFORE | ENDS_AFTER, whatever the count
  # Sentence mode's min_chars count (all four are empty, shape (0, 0[, 0]), in the modes that count nothing):
  count_keep: jax.Array  # [S, V] bool: the count carries through the token (else it restarts)
  count_add: jax.Array  # [S, V] int16: characters the token adds to the count
  gate_at: jax.Array  # [S, V, K] int16: the gate opens when count + gate_at >= min_chars (_GATE_NONE: unused)
  gate_count: jax.Array  # [S, V, K] int16: the count after the token when that gate is the first to open
  min_chars: jax.Array  # [] int32

  @property
  def num_states(self) -> int:
    return self.transitions.shape[0]

  @property
  def vocab_size(self) -> int:
    return self.transitions.shape[1]

  def advance(self, state, tok):
    """`advance(self, state, tok)`: the interface the sampler's decode loop calls."""
    return advance(self, state, tok)


def initial_state(table: StopTable, batch: int) -> jax.Array:
  """[B] int32: every row at the start of a response (automaton state 0, nothing counted)."""
  del table
  return jnp.zeros((batch,), jnp.int32)


def advance(table: StopTable, state: jax.Array, tok: jax.Array) -> tuple[jax.Array, jax.Array]:
  """One sampled token per row: state [B] int32, tok [B] int32 -> (new state [B] int32, ends [B] int32).

  ends != 0 is the stop; ENDS_AFTER: the step's span ends after this token, ENDS_BEFORE: it ended before it (METHOD
  A1; the same automaton as `StepBoundary.align`). Pure and jittable."""
  node, count = state >> COUNT_BITS, state & ((1 << COUNT_BITS) - 1)
  ends = table.ends[node, tok].astype(jnp.int32)
  if table.gate_at.size == 0:  # a mode without min_chars: nothing is counted
    return table.transitions[node, tok] << COUNT_BITS, ends
  at = table.gate_at[node, tok].astype(jnp.int32)  # [B, K]
  opens = (at != _GATE_NONE) & (count[:, None] + at >= table.min_chars)
  gated = opens.any(axis=-1)
  first = jnp.argmax(opens, axis=-1)
  after_gate = jnp.take_along_axis(table.gate_count[node, tok], first[:, None], axis=-1)[:, 0].astype(jnp.int32)
  carried = jnp.where(table.count_keep[node, tok], count, 0) + table.count_add[node, tok].astype(jnp.int32)
  count = jnp.where(gated, after_gate, jnp.minimum(carried, table.min_chars))
  ends = ends | jnp.where(gated, ENDS_BEFORE, 0)
  return (table.transitions[node, tok] << COUNT_BITS) | count, ends


def _simulate(auto: _Automaton, pieces: Sequence[bytes], min_chars: int, closes: bool, counted: bool) -> dict:
  """Runs every state over every token's bytes at once (tokens sorted by length, one byte position at a time).

  Arrays are [token, state]. For the count, a token's incoming count c is symbolic: it keeps `keep` (count is then
  min(c + add, m), else add) until a gate that opens for some c only; that gate opens a slot whose branch (the gate
  opened) is concrete from there on, and the slot records the threshold and the count that branch ends with."""
  n_states, n, m = len(auto.delta), len(pieces), min_chars
  lens = np.array([len(p) for p in pieces], np.int64)
  order = np.argsort(-lens, kind="stable")
  lens_sorted = lens[order]
  flat = np.frombuffer(b"".join(pieces[i] for i in order), np.uint8).astype(np.int32)
  starts = np.concatenate([[0], np.cumsum(lens_sorted)[:-1]]).astype(np.int64)
  delta, events = auto.delta.astype(np.int32).ravel(), auto.events.astype(np.int32).ravel()
  state = np.broadcast_to(np.arange(n_states, dtype=np.int32), (n, n_states)).copy()
  ends = np.zeros((n, n_states), np.int8)
  shape = (n, n_states) if counted else (0, 0)
  keep, add = np.ones(shape, bool), np.zeros(shape, np.int32)
  gate_at, gate_count = np.full(shape + (1,), _GATE_NONE, np.int32), np.zeros(shape + (1,), np.int32)
  live = np.zeros(shape + (1,), bool)  # gate slots in use
  for p in range(int(lens.max()) if n else 0):
    k = int(np.searchsorted(-lens_sorted, -p, side="left"))  # tokens longer than p come first
    flat_index = state[:k] * NSYM + flat[starts[:k] + p][:, None]  # [k, S]
    ev = events[flat_index]
    state[:k] = delta[flat_index]
    cut = (ev & CUT) != 0
    last = (lens_sorted[:k] == p + 1)[:, None]
    ends[:k] |= np.where(cut & (last | closes), ENDS_AFTER, np.where(cut, ENDS_BEFORE, 0)).astype(np.int8)
    if not counted:
      continue
    gate, counts, restart = (ev & GATE) != 0, (ev & COUNT) != 0, (ev & (CUT | RESET)) != 0
    kp, ad, ga, gc, lv = keep[:k], add[:k], gate_at[:k], gate_count[:k], live[:k]
    gc[...] = np.where(gate[..., None] & lv & (gc >= m), 0, gc)  # gates in branches that already cut are concrete
    sure = gate & (ad >= m)  # the count is at least `ad`, so this gate opens whatever came before the token
    ends[:k] |= np.where(sure, ENDS_BEFORE, 0).astype(np.int8)
    ad[sure] = 0
    kp &= ~sure
    new = gate & kp  # a gate that opens only for some incoming counts: a new slot
    if new.any():
      slot = lv.sum(-1)
      if slot[new].max() >= gate_at.shape[-1]:
        grow = lambda a, v: np.concatenate([a, np.full(a.shape[:2] + (1,), v, a.dtype)], -1)
        gate_at, gate_count, live = grow(gate_at, _GATE_NONE), grow(gate_count, 0), grow(live, False)
        ga, gc, lv = gate_at[:k], gate_count[:k], live[:k]
      one = new[..., None] & (np.arange(gate_at.shape[-1]) == slot[..., None])
      ga[one] = np.broadcast_to(ad[..., None], one.shape)[one]
      gc[one] = 0
      lv |= one
    ad[counts] += 1
    np.minimum(ad, m, out=ad)
    gc[counts[..., None] & lv] += 1
    np.minimum(gc, m, out=gc)
    ad[restart] = 0
    gc[restart[..., None] & lv] = 0
    kp &= ~restart
  inverse = np.empty(n, np.int64)
  inverse[order] = np.arange(n)
  arrays = {"transitions": state, "ends": ends, "count_keep": keep, "count_add": add, "gate_at": gate_at,
            "gate_count": gate_count}
  return {name: np.moveaxis(a[inverse], 0, 1) if len(a) else a for name, a in arrays.items()}  # [S, V, ...]


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # TokenBytes -> {(boundary, vocab size): table}


@functools.lru_cache(maxsize=None)
def _automaton(mode: str, pattern: str | None) -> _Automaton:
  if mode == "line":
    return _build(_Machine(("bol", ""), _line_step, _line_is_step))
  if mode == "paragraph":
    return _build(_with_think_tags((False, 0), _paragraph_step, lambda state: False))
  if mode == "sentence":
    return _build(_with_think_tags(("lead", None), _sentence_step, lambda state: state[0] != "lead"))
  return _build(_Machine(*_regex_machine(regex_literals(pattern))))


# ------------------------------------------------------------------------------------------------ the boundary


@dataclasses.dataclass(frozen=True)
class StepBoundary:
  """Where a step ends (METHOD A1): 'line', 'sentence' (`min_chars`), 'paragraph' or 'regex' (`pattern`, an
  alternation of literal strings). Sentence and paragraph modes read only the thinking text (see `steps.segment`)."""

  mode: str = "line"
  pattern: str | None = None
  min_chars: int = 20

  def __post_init__(self):
    if self.mode not in MODES:
      raise ConfigError(f"unknown step mode {self.mode!r}; known: {MODES}")
    if self.mode == "regex":
      if not self.pattern:
        raise ConfigError("step mode 'regex' needs a pattern")
      regex_literals(self.pattern)
    if self.mode == "sentence" and not 0 <= self.min_chars < 2 ** 15:
      raise ConfigError(f"step min_chars must be in [0, 32767], got {self.min_chars}")

  @property
  def _counted(self) -> bool:
    return self.mode == "sentence"

  @property
  def _closes(self) -> bool:
    return self.mode == "paragraph"

  @property
  def automaton(self) -> _Automaton:
    return _automaton(self.mode, self.pattern)

  def compile(self, tokenizer, vocab_size: int | None = None) -> StopTable:
    """The token-level table for `tokenizer` over ids [0, vocab_size) (ids past the tokenizer's change nothing);
    built once per tokenizer and boundary, then cached."""
    tb = token_bytes(tokenizer)
    size = len(tb.pieces) if vocab_size is None else int(vocab_size)
    cache = _TABLES.setdefault(tb, {})
    if (self, size) in cache:
      return cache[(self, size)]
    auto = self.automaton
    m = self.min_chars if self._counted else 0
    arrays = _simulate(auto, tb.pieces[:size], m, self._closes, self._counted)
    n_states, n = arrays["ends"].shape
    padded = 1 << max(3, (n_states - 1).bit_length())
    if padded >= 1 << (31 - COUNT_BITS):
      raise ConfigError(f"step boundary {self} needs {n_states} automaton states; at most {1 << 15} fit")

    def pad(a, fill):
      out = np.empty((padded, size) + a.shape[2:], a.dtype)
      out[...] = fill
      out[:n_states, :n] = a
      return out

    transitions = pad(arrays["transitions"], 0)
    transitions[:, n:] = np.arange(padded)[:, None]  # ids the tokenizer lacks, and padding states, stay put
    transitions[n_states:] = np.arange(n_states, padded)[:, None]
    if self._counted:
      counts = (pad(arrays["count_keep"], True), pad(arrays["count_add"], 0), pad(arrays["gate_at"], _GATE_NONE),
                pad(arrays["gate_count"], 0))
    else:
      counts = (np.zeros((0, 0), bool), np.zeros((0, 0)), np.zeros((0, 0, 0)), np.zeros((0, 0, 0)))
    table = StopTable(
        transitions=jnp.asarray(transitions, jnp.int32), ends=jnp.asarray(pad(arrays["ends"], 0), jnp.int8),
        count_keep=jnp.asarray(counts[0]), count_add=jnp.asarray(counts[1], jnp.int16),
        gate_at=jnp.asarray(counts[2], jnp.int16), gate_count=jnp.asarray(counts[3], jnp.int16),
        min_chars=jnp.int32(m))
    cache[(self, size)] = table
    return table

  def align(self, tokenizer, ids: Sequence[int], *, offset: int = 0) -> list[Step]:
    """Steps of the response ids with exact token spans (shifted by `offset`); a step with no token of its own has
    the empty span [g, g) at the gap g where it ends. O(len(ids))."""
    ids = [int(i) for i in ids]
    tb = token_bytes(tokenizer)
    delta, events, final = self.automaton.lists
    m = self.min_chars if self._counted else 0
    d = count = pos = 0
    mark, cuts, tail = None, [], None  # cuts: (byte where the step ends, byte where its text starts, token index)
    for j, t in enumerate(ids):
      for b in tb.piece(t)[0]:
        ev = events[d][b]
        if ev:
          if ev & GATE and count >= m:
            cuts.append((pos, mark, j))
            mark, count = pos, 0
          if ev & MARK:
            mark = pos
          if ev & COUNT and count < m:
            count += 1
          if ev & CUT:
            cuts.append((pos + 1, mark, j))
            mark, count = None, 0
          if ev & RESET:
            mark, count = None, 0
          if ev & SINK:
            tail = (pos + 1 - len(THINK_CLOSE), final[d])
            break
        d = delta[d][b]
        pos += 1
      if tail is not None:
        break
    if tail is None:
      tail = (pos, final[d])
    bends = byte_ends(tb, ids)
    if self._closes:
      return self._closed_steps(tokenizer, tb, ids, cuts, bends, offset)
    regions = [(mk, e) for e, mk, _ in cuts]
    if tail[1] and mark is not None and mark < tail[0]:
      regions.append((mark, tail[0]))
    text, chars = char_offsets(tb, ids, [p for r in regions for p in r])
    check_text(tokenizer, ids, text)
    steps = []
    for k, (mk, e) in enumerate(regions):
      cs, ce = chars[2 * k], chars[2 * k + 1]
      body = text[cs:ce].strip(WHITESPACE)
      if k == len(cuts) and not body:
        continue
      start, end = bisect.bisect_right(bends, mk), bisect.bisect_right(bends, e)
      steps.append(Step(body, cs, ce, start + offset, end + offset))
    return steps

  def _closed_steps(self, tokenizer, tb, ids, cuts, bends, offset) -> list[Step]:
    """Paragraph mode: the token that completes a boundary closes its step; two boundaries in one token are one."""
    closing = []
    for _, mk, j in cuts:
      if not closing or closing[-1][1] != j:
        closing.append((mk, j))
    text, chars = char_offsets(tb, ids, [p for mk, j in closing for p in (mk, bends[j])])
    check_text(tokenizer, ids, text)
    steps, prev_end, prev_ce = [], 0, 0
    for k, (mk, j) in enumerate(closing):
      cs, ce = max(chars[2 * k], prev_ce), chars[2 * k + 1]
      start = max(prev_end, bisect.bisect_right(bends, mk))
      steps.append(Step(text[cs:ce].strip(WHITESPACE), cs, ce, start + offset, j + 1 + offset))
      prev_end, prev_ce = j + 1, ce
    return steps
