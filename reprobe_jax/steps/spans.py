"""Exact step spans on device (docs/method.md §A1): `StepBoundary.align`'s token spans of many rows at once, inside a
jit, read off the same automaton the sampler's StopTable runs.

    table = align_table(StepBoundary("line"), tokenizer, vocab_size)   # built once per tokenizer, then cached
    out = step_spans(table, tokens, lengths, steps=16)                # spans [B, 16, 2], count [B]

How a span is read off the tokens (as `align` reads it off their bytes):
- A step ends at its CUT: after the token when the CUT is the token's last byte (ENDS_AFTER; the span also takes the
  tokens with no bytes right after it, as `align` does), before it otherwise (ENDS_BEFORE: the token straddles the
  boundary and opens the next step). A token that holds several CUTs ends several steps; every one but its last is
  the empty span [j, j) at it.
- A step starts at the token that holds its mark, its text's first byte: blank lines and header lines between steps
  are no step's.
- Paragraph mode closes: the token that completes '.\\n\\n' ends its step after itself, one step however many
  boundaries it completes, and a step starts no earlier than the one before it ended.
- The unfinished last step is a step where the automaton's state says so (line mode's last line without a newline).
Sentence mode's steps depend on its character count (min_chars), which this table does not carry.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Int

from reprobe_jax.errors import ConfigError
from reprobe_jax.steps.automaton import ENDS_AFTER, MARK_HERE, MARK_NONE
from reprobe_jax.steps.boundary import StepBoundary
from reprobe_jax.steps.tokens import compiled


class AlignTable(struct.PyTreeNode):
  """A StepBoundary's automaton over one tokenizer's ids [0, V), with what `step_spans` needs beyond the StopTable's
  transitions and ends (shared with it): S states (padded), V ids. Passed as a traced argument."""

  transitions: Int[Array, "s v"]
  ends: Int[Array, "s v"]  # int8 ENDS_BEFORE | ENDS_AFTER
  cuts: Int[Array, "s v"]  # int8: the steps the token ends
  mark_first: Bool[Array, "s v"]  # the first of them starts in the token
  mark_out: Int[Array, "s v"]  # int8: where the next step's text starts after the token (MARK_*)
  final: Bool[Array, " s"]  # the unfinished step is a step if the response ends in this state
  empty: Bool[Array, " v"]  # the token adds no bytes to the text
  closes: bool = struct.field(pytree_node=False)  # paragraph mode: a token ends at most one step, after itself


class StepSpans(struct.PyTreeNode):
  """The aligned steps of B rows: the first S spans [start, end) of each row ((0, 0) past them) and how many steps
  the row has in all (it may exceed S)."""

  spans: Int[Array, "b s 2"]
  count: Int[Array, " b"]


@dataclasses.dataclass(frozen=True)
class _Align:
  """The cache key of an alignment table (a frozen record, so it never equals another table's key)."""

  boundary: StepBoundary
  vocab_size: int


def align_table(boundary: StepBoundary, tokenizer, vocab_size: int) -> AlignTable:
  """The AlignTable of `boundary` for `tokenizer` over ids [0, vocab_size); built once, then cached. ConfigError in
  sentence mode (its steps depend on a character count)."""
  if boundary.mode == "sentence":
    raise ConfigError("step spans on device: sentence mode counts characters (min_chars); use line, paragraph or regex")
  size = int(vocab_size)

  def build(tb):
    run, stop = boundary.vocabulary(tokenizer, size), boundary.compile(tokenizer, size)
    final = np.zeros(run.transitions.shape[0], bool)
    final[: len(boundary.automaton.final)] = boundary.automaton.final
    empty = np.ones(size, bool)
    empty[: min(size, len(tb.pieces))] = [not p for p in tb.pieces[:size]]
    return AlignTable(
      transitions=stop.transitions,
      ends=stop.ends,
      cuts=jnp.asarray(run.cuts, jnp.int8),
      mark_first=jnp.asarray(run.mark_first),
      mark_out=jnp.asarray(run.mark_out, jnp.int8),
      final=jnp.asarray(final),
      empty=jnp.asarray(empty),
      closes=boundary.mode == "paragraph",
    )

  return compiled(tokenizer, _Align(boundary, size), build)


@functools.partial(jax.jit, static_argnames=("steps",))
def step_spans(table: AlignTable, tokens: Int[Array, "b n"], lengths: Int[Array, " b"], *, steps: int) -> StepSpans:
  """`StepBoundary.align` of each row's response tokens[:length] (tokens [B, N], lengths [B]), on device: the first
  `steps` step spans of every row and its number of steps. One scan over the N positions."""
  b, n = tokens.shape
  lengths = lengths.astype(jnp.int32)
  pos = jnp.arange(n, dtype=jnp.int32)

  def read(carry, x):
    node, mark = carry  # [B] automaton state; [B] the token that holds the unfinished step's mark (-1: none)
    tok, j = x
    live = j < lengths
    out = table.mark_out[node, tok]
    first = jnp.where(table.mark_first[node, tok], j, mark)  # where the first step the token ends starts
    cuts = jnp.where(live, table.cuts[node, tok].astype(jnp.int32), 0)
    after = live & ((table.ends[node, tok] & ENDS_AFTER) != 0)
    mark = jnp.where(live, jnp.where(out == MARK_HERE, j, jnp.where(out == MARK_NONE, -1, mark)), mark)
    node = jnp.where(live, table.transitions[node, tok], node)
    return (node, mark), (cuts, first, after)

  init = (jnp.zeros((b,), jnp.int32), jnp.full((b,), -1, jnp.int32))
  (node, mark), per_token = jax.lax.scan(read, init, (tokens.T, pos))
  cuts, first, after = (x.T for x in per_token)  # [B, N] each
  if table.closes:
    cuts = jnp.minimum(cuts, 1)
    closed = jax.lax.cummax(jnp.where(cuts > 0, pos + 1, 0), axis=1)  # [B, N] end of the last step closed so far
    first = jnp.maximum(first, jnp.pad(closed[:, :-1], ((0, 0), (1, 0))))
    end_after = jnp.broadcast_to(pos + 1, (b, n))
    tail = jnp.zeros((b,), bool)
  else:  # an ENDS_AFTER step also takes the tokens without bytes that follow it
    bytes_at = jnp.where(~table.empty[tokens] & (pos < lengths[:, None]), pos, n)
    next_bytes = jax.lax.cummin(bytes_at, axis=1, reverse=True)  # [B, N] the first token with bytes at or after j
    end_after = jnp.minimum(jnp.pad(next_bytes[:, 1:], ((0, 0), (0, 1)), constant_values=n), lengths[:, None])
    tail = table.final[node] & (mark >= 0)
  total = jnp.cumsum(cuts, axis=1)  # [B, N] steps ended up to and including token j
  k = jnp.arange(steps, dtype=jnp.int32)
  j = jnp.minimum(jax.vmap(lambda c: jnp.searchsorted(c, k, side="right"))(total), n - 1).astype(jnp.int32)  # [B, S]
  at = lambda a: jnp.take_along_axis(a, j, axis=1)
  local = k - (at(total) - at(cuts))  # which of token j's steps slot k is
  start = jnp.where(local == 0, at(first), j)
  end = jnp.where((local == at(cuts) - 1) & at(after), at(end_after), j)
  ended = total[:, -1]  # [B] steps ended by a token
  last = tail[:, None] & (k == ended[:, None])  # the unfinished step, after them
  start = jnp.where(last, mark[:, None], start)
  end = jnp.where(last, lengths[:, None], end)
  count = ended + tail
  spans = jnp.where((k < count[:, None])[..., None], jnp.stack([start, end], axis=-1), 0)  # [B, S, 2]
  return StepSpans(spans=spans.astype(jnp.int32), count=count.astype(jnp.int32))
