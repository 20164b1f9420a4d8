"""One definition of where a step ends, for the sampler's on-device stop rule and the host alignment alike
(docs/method.md §A1).

A `StepBoundary` (line, sentence, paragraph or a literal regex) is the byte automaton of its mode
(`reprobe_jax.steps.machines`), with a saturating character counter for sentence mode's `min_chars`. `compile` runs
it over every vocabulary entry (`reprobe_jax.steps.automaton.run_vocabulary`) into a `StopTable`: from automaton
state s, token t moves to `transitions[s, t]` and ends a step before and/or after itself (`ends[s, t]`). `advance` is
the jittable device rule over that table, carried per row in a sampler's `lax.while_loop` state; the model layer
takes the compiled table as data. `StepBoundary.align` runs the same automaton over the actual ids, so every stop
the sampler makes is a span end and every span end but the last is a stop. The character-level statement of each
mode is `reprobe_jax.steps.segment`; docs/method.md says where it departs from the older prefix-decoding rules.

A token belongs to the step in which its last byte falls, so a token that straddles a boundary ("\\n- St") goes to
the step where it ends; in paragraph mode the token that completes ".\\n\\n" closes its step.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from reprobe_jax.errors import ConfigError
from reprobe_jax.steps.automaton import (
  COUNT,
  CUT,
  ENDS_BEFORE,
  GATE,
  GATE_NONE,
  MARK,
  RESET,
  SINK,
  ByteAutomaton,
  VocabularyTable,
  run_vocabulary,
)
from reprobe_jax.steps.machines import mode_automaton
from reprobe_jax.steps.modes import THINK_CLOSE, WHITESPACE, check_mode
from reprobe_jax.steps.tokens import byte_ends, char_offsets, check_text, compiled, token_bytes, token_ids

COUNT_BITS = 16  # a row's state packs (automaton state << COUNT_BITS) | characters counted so far


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
  gate_at: jax.Array  # [S, V, K] int16: the gate opens when count + gate_at >= min_chars (GATE_NONE: unused)
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

  ends != 0 is the stop; ENDS_AFTER: the step's span ends after this token, ENDS_BEFORE: it ended before it
  (docs/method.md §A1; the same automaton as `StepBoundary.align`). Pure and jittable."""
  node, count = state >> COUNT_BITS, state & ((1 << COUNT_BITS) - 1)
  ends = table.ends[node, tok].astype(jnp.int32)
  if table.gate_at.size == 0:  # a mode without min_chars: nothing is counted
    return table.transitions[node, tok] << COUNT_BITS, ends
  at = table.gate_at[node, tok].astype(jnp.int32)  # [B, K]
  opens = (at != GATE_NONE) & (count[:, None] + at >= table.min_chars)
  gated = opens.any(axis=-1)
  first = jnp.argmax(opens, axis=-1)
  after_gate = jnp.take_along_axis(table.gate_count[node, tok], first[:, None], axis=-1)[:, 0].astype(jnp.int32)
  carried = jnp.where(table.count_keep[node, tok], count, 0) + table.count_add[node, tok].astype(jnp.int32)
  count = jnp.where(gated, after_gate, jnp.minimum(carried, table.min_chars))
  ends = ends | jnp.where(gated, ENDS_BEFORE, 0)
  return (table.transitions[node, tok] << COUNT_BITS) | count, ends


# ------------------------------------------------------------------------------------------------ the boundary


@dataclasses.dataclass(frozen=True)
class StepBoundary:
  """Where a step ends (docs/method.md §A1): 'line', 'sentence' (`min_chars`), 'paragraph' or 'regex' (`pattern`,
  an alternation of literal strings). Sentence and paragraph modes read only the thinking text (see
  `steps.segment`)."""

  mode: str = "line"
  pattern: str | None = None
  min_chars: int = 20

  def __post_init__(self):
    check_mode(self.mode, self.pattern)
    if self.mode == "sentence" and not 0 <= self.min_chars < 2**15:
      raise ConfigError(f"step min_chars must be in [0, 32767], got {self.min_chars}")

  @property
  def _counted(self) -> bool:
    return self.mode == "sentence"

  @property
  def _closes(self) -> bool:
    return self.mode == "paragraph"

  @property
  def automaton(self) -> ByteAutomaton:
    return mode_automaton(self.mode, self.pattern)

  def compile(self, tokenizer, vocab_size: int | None = None) -> StopTable:
    """The token-level table for `tokenizer` over ids [0, vocab_size) (ids past the tokenizer's change nothing);
    built once per tokenizer and boundary, then cached. A sampler takes it as `stop`: `lm.sampler(...,
    stop=boundary.compile(lm.tokenizer, lm.config.vocab_size))`."""
    size = len(token_bytes(tokenizer).pieces) if vocab_size is None else int(vocab_size)
    return compiled(tokenizer, (self, size), lambda tb: self._table(self.vocabulary(tokenizer, size)))

  def vocabulary(self, tokenizer, vocab_size: int) -> VocabularyTable:
    """The automaton run over `tokenizer`'s ids [0, vocab_size) (numpy; states padded to a power of two): what the
    StopTable and the alignment table of `reprobe_jax.steps.spans` are made of. Built once, then cached."""

    def build(tb):
      n_states = len(self.automaton.delta)
      padded = 1 << max(3, (n_states - 1).bit_length())
      if padded >= 1 << (31 - COUNT_BITS):
        raise ConfigError(f"step boundary {self} needs {n_states} automaton states; at most {1 << 15} fit")
      m = self.min_chars if self._counted else 0
      counts = dict(min_chars=m, closes=self._closes, counted=self._counted)
      return run_vocabulary(self.automaton, tb.pieces, vocab_size, num_states=padded, **counts)

    return compiled(tokenizer, _Run(self, int(vocab_size)), build)

  def _table(self, run: VocabularyTable) -> StopTable:
    return StopTable(
      transitions=jnp.asarray(run.transitions, jnp.int32),
      ends=jnp.asarray(run.ends, jnp.int8),
      count_keep=jnp.asarray(run.count_keep),
      count_add=jnp.asarray(run.count_add, jnp.int16),
      gate_at=jnp.asarray(run.gate_at, jnp.int16),
      gate_count=jnp.asarray(run.gate_count, jnp.int16),
      min_chars=jnp.int32(self.min_chars if self._counted else 0),
    )

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


@dataclasses.dataclass(frozen=True)
class _Run:
  """The cache key of a boundary's vocabulary run (a frozen record, so it never equals another table's key)."""

  boundary: StepBoundary
  vocab_size: int


def align(
  tokenizer, ids: Sequence[int], mode: str, *, min_chars: int = 20, pattern: str | None = None, offset: int = 0
) -> list[Step]:
  """Steps of the response token ids `ids` with exact token spans; `offset` shifts spans (e.g. by the prompt length)
  so they index the full sequence. Runs the same automaton as the sampler's stop rule (`StepBoundary.compile`).
  Spans are ordered, do not overlap and lie in [offset, offset + len(ids)]; ids are checked (`token_ids`)."""
  if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
    raise ConfigError(f"align: offset must be an integer >= 0, found {offset!r}")
  return StepBoundary(mode, pattern=pattern, min_chars=min_chars).align(tokenizer, token_ids(ids), offset=int(offset))
