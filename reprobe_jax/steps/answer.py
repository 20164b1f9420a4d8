"""Answer lines on device: the token-level automaton that tells a step-level search a row has written its answer.

In line mode a row is finished by a step with a line that starts with '<Answer>' (tasks.formats' '<Answer>: X',
case-insensitive, after blanks); thinking mode ends its rows on EOS (after '</think>' no boundary is a step, so the
answer section closes the last step). The answer line is a byte automaton compiled over the vocabulary by the same
compiler as the step boundaries (`reprobe_jax.steps.automaton.run_vocabulary`) and cached with them per tokenizer.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from reprobe_jax.steps.automaton import NSYM, ByteAutomaton, run_vocabulary
from reprobe_jax.steps.tokens import compiled

# The text an answer line starts with, per response format (None: that format's rows end on EOS).
ANSWER_PREFIX = {"line": "<answer>", "thinking": None}
_BLANK = frozenset(b" \t\r\f\v")


@functools.lru_cache(maxsize=None)
def answer_automaton(prefix: str) -> ByteAutomaton:
  """The byte automaton of "a line of the text read so far starts with `prefix` (ASCII, case-insensitive, after
  blanks)". States 0..m-1: at a line start with k prefix bytes matched; m: found (it stays); m + 1: inside a line
  that does not start with it. No events: it ends no step."""
  pat = prefix.lower().encode()
  m = len(pat)
  delta = np.empty((m + 2, NSYM), np.int64)
  for q in range(m + 2):
    for b in range(NSYM):
      low = ord(chr(b).lower()) if b < 128 else b
      if q == m:
        delta[q, b] = m
      elif b == ord("\n"):
        delta[q, b] = 0
      elif q < m and low == pat[q]:
        delta[q, b] = q + 1
      elif q == 0 and b in _BLANK:
        delta[q, b] = 0
      else:
        delta[q, b] = m + 1
  return ByteAutomaton(delta, np.zeros_like(delta), np.arange(m + 2) == m)


@dataclasses.dataclass(frozen=True)
class _AnswerLine:
  """The cache key of an answer table (a frozen record, so it never equals a step boundary's key)."""

  prefix: str
  vocab_size: int


def answer_table(tokenizer, vocab_size: int, prefix: str = ANSWER_PREFIX["line"]) -> jax.Array:
  """[S, V] int32 token-level automaton of `answer_automaton(prefix)` over ids [0, vocab_size) (ids the tokenizer
  lacks change nothing); found is state S - 2. Built once per tokenizer, prefix and vocabulary size."""

  def build(tb):
    return jnp.asarray(run_vocabulary(answer_automaton(prefix), tb.pieces, vocab_size).transitions)

  return compiled(tokenizer, _AnswerLine(prefix, vocab_size), build)


def answer_lines(table: jax.Array | None, tokens, spans):
  """[B] bool: the span [start, end) of each row's tokens [B, N] (spans [B, 2]) holds an answer line (`answer_table`);
  all False without a table. Pure; runs inside the search's jit."""
  b = tokens.shape[0]
  if table is None:
    return jnp.zeros((b,), bool)
  found = table.shape[0] - 2
  start, end = spans[:, 0], spans[:, 1]

  def body(j, q):
    tok = jnp.take_along_axis(tokens, jnp.full((b, 1), j, jnp.int32), axis=1, mode="clip")[:, 0]
    return jnp.where((j >= start) & (j < end), table[q, tok], q)

  q = jax.lax.fori_loop(jnp.min(start), jnp.max(end), body, jnp.zeros((b,), jnp.int32))
  return q == found
