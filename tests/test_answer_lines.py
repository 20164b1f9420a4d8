"""The answer-line table a step-level search finishes line-mode rows with (`reprobe_jax.steps.answer`): compiled by
the step boundaries' compiler, held here to a reference that reads each token's text as a line prefix, over the
whole vocabulary of byte-level BPE, SentencePiece-style, word-level and SmolLM2 tokenizers."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_word_tokenizer
from test_steps import TOKENIZERS, bpe, get_tokenizer  # noqa: F401 (fixtures)

from reprobe_jax import steps as S
from reprobe_jax.steps import answer_table

BLANKS = b" \t\r\f\v"


def reference_state(text: bytes, prefix: bytes) -> int:
  """The answer automaton's state after `text`, from its definition: m = len(prefix) once a line (after leading
  blanks) starts with `prefix`, ASCII case-insensitively; else k < m if the last line is blanks and then the first k
  bytes of it; else m + 1."""
  m, lines = len(prefix), [line.lstrip(BLANKS).lower() for line in text.split(b"\n")]
  if any(line.startswith(prefix) for line in lines):
    return m
  return len(lines[-1]) if prefix.startswith(lines[-1]) else m + 1


def reference_table(tokenizer, vocab_size: int, prefix: str) -> np.ndarray:
  """[m + 2, V]: each state's representative text (0: '', k: the prefix's first k bytes, m: all of it, m + 1: a
  byte that starts no prefix) followed by each token's bytes; ids the tokenizer lacks leave the state as it is."""
  pat = prefix.lower().encode()
  m = len(pat)
  texts = [pat[:q] for q in range(m + 1)] + [b"\x01"]
  pieces = S.token_bytes(tokenizer).pieces
  out = np.tile(np.arange(m + 2, dtype=np.int32)[:, None], (1, vocab_size))
  for t, piece in enumerate(pieces[:vocab_size]):
    out[:, t] = [reference_state(text + piece, pat) for text in texts]
  return out


@pytest.mark.parametrize("name", (*TOKENIZERS, "word"))
def test_the_answer_table_is_its_definition_on_every_token(name):
  tok = make_word_tokenizer() if name == "word" else get_tokenizer(name)
  for prefix, size in [("<answer>", len(tok)), ("<Answer>", len(tok) + 9), ("Ab", max(1, len(tok) - 3))]:
    table = answer_table(tok, size, prefix)
    assert table.dtype == np.int32 and table.shape == (len(prefix) + 2, size)
    np.testing.assert_array_equal(np.asarray(table), reference_table(tok, size, prefix), err_msg=f"{name} {prefix}")
    assert answer_table(tok, size, prefix) is table  # cached per tokenizer, prefix and size


def test_the_answer_line_and_the_step_boundaries_share_one_cache(bpe):
  """Both tables come from one per-tokenizer cache; an answer key never collides with a boundary's."""
  line = S.StepBoundary("line").compile(bpe, len(bpe))
  answer = answer_table(bpe, len(bpe))
  assert line is not answer and S.StepBoundary("line").compile(bpe, len(bpe)) is line
  assert answer_table(bpe, len(bpe), S.ANSWER_PREFIX["line"]) is answer
