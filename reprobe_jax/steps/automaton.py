"""Byte automata and the one compiler that turns a byte automaton into a token-level table (docs/method.md §A1).

A `ByteAutomaton` reads the decoded text's bytes: from state s, byte b moves to `delta[s, b]` and raises the
`events[s, b]` flags below. A step mode's rules (`reprobe_jax.steps.machines`) are written over characters; `build`
puts a UTF-8 decoder state in front of them, so each character of the decoded text (U+FFFD included) is one symbol,
and minimises the result. `run_vocabulary` runs an automaton from every state over every token's bytes at once
(numpy, each entry's bytes read once): the stop tables of `reprobe_jax.steps.boundary` and the answer-line table of
`reprobe_jax.steps.answer` are both made by it.

Ends codes: ENDS_AFTER (the token is the last of a step: it holds the step's final character, or in paragraph mode
completes '.\\n\\n'), ENDS_BEFORE (the step ended just before the token: the token holds the character that showed
it, e.g. the first letter of the next sentence, or straddles the boundary), or both.

Marks (where a step's text starts, for exact spans on device, `reprobe_jax.steps.spans`): per (state, token) the
number of CUTs the token holds, whether the first of them closes a step whose text starts in the token, and where
the mark stands after it (MARK_CARRIED: where it stood before the token; MARK_HERE: in the token; MARK_NONE: no
step started). They follow MARK, CUT and RESET only: a GATE's cut depends on sentence mode's count.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple, Sequence

import numpy as np

ENDS_BEFORE, ENDS_AFTER = 1, 2  # the data contract with the sampler, which reads `ends != 0` as a stop


# Input symbols of a mode's rules: an ASCII byte, or LEAD (a character that is not ASCII: a valid multi-byte
# character or a U+FFFD the decoder writes, which every rule here treats alike). The automaton reads bytes: a UTF-8
# decoder state in front of the mode's state sends LEAD on the byte that starts a character of the decoded text and
# nothing on the bytes that continue it. It reads invalid bytes as Python's and Rust's lossy decoders do (one U+FFFD
# per maximal subpart of a valid sequence: a stray continuation byte, C0, C1 or F5..FF is one character each).
LEAD, NSYM = 128, 256
_UTF8_FRESH = 0
# decoder state -> (lowest, highest) byte that continues the pending character, and the state after it
_UTF8_NEXT = {
  1: (0x80, 0xBF, 0),
  2: (0x80, 0xBF, 1),
  3: (0x80, 0xBF, 2),
  4: (0xA0, 0xBF, 1),
  5: (0x80, 0x9F, 1),
  6: (0x90, 0xBF, 2),
  7: (0x80, 0x8F, 2),
}


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
GATE_NONE = -(2**15)  # gate_at of an unused gate slot: never opens
MARK_CARRIED, MARK_HERE, MARK_NONE = 0, 1, 2  # where a step's text starts after a token (`VocabularyTable.mark_out`)


@dataclasses.dataclass(frozen=True)
class Machine:
  """A step mode's rules over symbols (an ASCII byte, or LEAD): `step(state, symbol) -> (state, events)`."""

  start: object
  step: Callable[[object, int], tuple[object, int]]  # (state, symbol) -> (state, events)
  final: Callable[[object], bool]  # whether the unfinished step is a step if the text ends here


@dataclasses.dataclass(frozen=True, eq=False)
class ByteAutomaton:
  """A deterministic automaton over bytes; state 0 is the start."""

  delta: np.ndarray  # [S, NSYM] int64: the state after each byte
  events: np.ndarray  # [S, NSYM] int64: the events each byte raises
  final: np.ndarray  # [S] bool

  @functools.cached_property
  def lists(self):
    return self.delta.tolist(), self.events.tolist(), self.final.tolist()


def build(machine: Machine) -> ByteAutomaton:
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
  return ByteAutomaton(block[delta[keep]], events[keep], final[keep])


# ------------------------------------------------------------------------------------------------ the compiler


class VocabularyTable(NamedTuple):
  """A byte automaton run over a vocabulary: from state s, token t moves to `transitions[s, t]` and ends a step
  before and/or after itself (`ends[s, t]`). S states (`num_states`: the automaton's, padded with states that stay
  put), V ids (ids past the tokenizer's stay put and end nothing). The count arrays (sentence mode's min_chars) are
  those of `StopTable`; without a count they are empty, shape (0, 0[, 0]). The marks are the module docstring's."""

  transitions: np.ndarray  # [S, V] int32
  ends: np.ndarray  # [S, V] int8
  count_keep: np.ndarray  # [S, V] bool
  count_add: np.ndarray  # [S, V] int32
  gate_at: np.ndarray  # [S, V, K] int32
  gate_count: np.ndarray  # [S, V, K] int32
  cuts: np.ndarray  # [S, V] int8: the CUTs the token holds (at most 127 counted)
  mark_first: np.ndarray  # [S, V] bool: the first of them closes a step whose text starts in the token
  mark_out: np.ndarray  # [S, V] int8: MARK_CARRIED, MARK_HERE or MARK_NONE after the token


def run_vocabulary(
  auto: ByteAutomaton,
  pieces: Sequence[bytes],
  vocab_size: int,
  *,
  num_states: int | None = None,
  min_chars: int = 0,
  closes: bool = False,
  counted: bool = False,
) -> VocabularyTable:
  """`auto` run from each state over the bytes of each of the first `vocab_size` `pieces` (a tokenizer's
  `TokenBytes.pieces`). `closes`: a token that holds a CUT ends its step after itself even if the CUT is not its
  last byte (paragraph mode); `counted`: track sentence mode's count of `min_chars`."""
  run = _simulate(auto, pieces[:vocab_size], min_chars, closes, counted)
  n_states, n = run.ends.shape
  rows = n_states if num_states is None else num_states

  def pad(a, fill):
    out = np.empty((rows, vocab_size) + a.shape[2:], a.dtype)
    out[...] = fill
    out[:n_states, :n] = a
    return out

  transitions = pad(run.transitions, 0)
  transitions[:, n:] = np.arange(rows)[:, None]  # ids the tokenizer lacks, and padding states, stay put
  transitions[n_states:] = np.arange(n_states, rows)[:, None]
  if counted:
    counts = (pad(run.count_keep, True), pad(run.count_add, 0), pad(run.gate_at, GATE_NONE), pad(run.gate_count, 0))
  else:
    counts = (
      np.zeros((0, 0), bool),
      np.zeros((0, 0), np.int32),
      np.zeros((0, 0, 0), np.int32),
      np.zeros((0, 0, 0), np.int32),
    )
  marks = (pad(run.cuts, 0), pad(run.mark_first, False), pad(run.mark_out, MARK_CARRIED))
  return VocabularyTable(transitions, pad(run.ends, 0), *counts, *marks)


def _simulate(
  auto: ByteAutomaton, pieces: Sequence[bytes], min_chars: int, closes: bool, counted: bool
) -> VocabularyTable:
  """Runs every state over every token's bytes at once (tokens sorted by length, one byte position at a time).

  Arrays are [token, state] until the end, which makes them [state, token]. For the count, a token's incoming count
  c is symbolic: it keeps `keep` (count is then min(c + add, m), else add) until a gate that opens for some c only;
  that gate opens a slot whose branch (the gate opened) is concrete from there on, and the slot records the
  threshold and the count that branch ends with."""
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
  gate_at, gate_count = np.full(shape + (1,), GATE_NONE, np.int32), np.zeros(shape + (1,), np.int32)
  live = np.zeros(shape + (1,), bool)  # gate slots in use
  cuts = np.zeros((n, n_states), np.int32)
  mark_first = np.zeros((n, n_states), bool)
  mark_out = np.full((n, n_states), MARK_CARRIED, np.int8)
  for p in range(int(lens.max()) if n else 0):
    k = int(np.searchsorted(-lens_sorted, -p, side="left"))  # tokens longer than p come first
    flat_index = state[:k] * NSYM + flat[starts[:k] + p][:, None]  # [k, S]
    ev = events[flat_index]
    state[:k] = delta[flat_index]
    cut = (ev & CUT) != 0
    last = (lens_sorted[:k] == p + 1)[:, None]
    ends[:k] |= np.where(cut & (last | closes), ENDS_AFTER, np.where(cut, ENDS_BEFORE, 0)).astype(np.int8)
    out = mark_out[:k]  # as `StepBoundary.align` reads a byte: MARK, then CUT, then RESET
    out[(ev & MARK) != 0] = MARK_HERE
    mark_first[:k] |= cut & (cuts[:k] == 0) & (out == MARK_HERE)
    cuts[:k] += cut
    out[cut | ((ev & RESET) != 0)] = MARK_NONE
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
        gate_at, gate_count, live = grow(gate_at, GATE_NONE), grow(gate_count, 0), grow(live, False)
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
  marks = (np.minimum(cuts, 127).astype(np.int8), mark_first, mark_out)
  return VocabularyTable(
    *(
      np.moveaxis(a[inverse], 0, 1) if len(a) else a  # [S, V, ...]
      for a in (state, ends, keep, add, gate_at, gate_count, *marks)
    )
  )
