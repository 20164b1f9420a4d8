"""Step spans on device (docs/method.md §A1): `steps.step_spans` gives exactly `StepBoundary.align`'s spans, row by
row, in line, paragraph and regex mode; on byte-level BPE, SentencePiece-style (pieces like '▁60\\n-' straddle lines)
and SmolLM2's tokenizer, on texts and on any ids, and on a vocabulary whose tokens hold several step ends, close a
paragraph and open the next one, or add no bytes at all."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from test_boundary import FRAGMENTS, tokenise_in_pieces
from test_steps import CORPUS, TOKENIZERS, get_tokenizer
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from reprobe_jax.errors import ConfigError
from reprobe_jax.steps import StepBoundary, align_table, step_spans

BOUNDARIES = [StepBoundary("line"), StepBoundary("paragraph"), StepBoundary("regex", pattern=r";|\n\n")]
WIDTH = 64  # one buffer length for every row: one compiled scan per table shape


def device_spans(tok, boundary, rows, vocab_size, steps=WIDTH):
  """[(start, end)] per row from `step_spans` (rows of ids, each at most WIDTH long), and each row's step count."""
  tokens = np.zeros((len(rows), WIDTH), np.int32)
  for i, r in enumerate(rows):
    tokens[i, : len(r)] = r
  lengths = jnp.asarray([len(r) for r in rows], jnp.int32)
  out = step_spans(align_table(boundary, tok, vocab_size), jnp.asarray(tokens), lengths, steps=steps)
  spans, count = np.asarray(out.spans), np.asarray(out.count)
  return [[tuple(s) for s in spans[i, : min(count[i], steps)].tolist()] for i in range(len(rows))], count


def host_spans(tok, boundary, ids):
  return [(s.start, s.end) for s in boundary.align(tok, [int(i) for i in ids])]


@pytest.mark.parametrize("name", TOKENIZERS)
def test_spans_on_device_are_the_aligned_spans(name):
  tok = get_tokenizer(name)
  vocab = len(tok) + 5  # a model's vocabulary may be larger than its tokenizer's: those ids add no bytes
  rng = np.random.default_rng(0)
  texts = [t for t in CORPUS[:5]] + ["".join(rng.choice(FRAGMENTS, 12)) for _ in range(12)]
  rows = [tokenise_in_pieces(tok, t, list(rng.integers(0, 200, 4)))[:WIDTH] for t in texts]
  rows += [list(rng.integers(0, vocab, int(rng.integers(0, WIDTH + 1)))) for _ in range(16)]
  for boundary in BOUNDARIES:
    got, _ = device_spans(tok, boundary, rows, vocab)
    for ids, spans in zip(rows, got):
      assert spans == host_spans(tok, boundary, ids), (boundary, tok.convert_ids_to_tokens([int(i) for i in ids]))
  assert sum(len(s) for s in got) > 50  # the rows hold steps


WORDS = ["<pad>", "x", "x\ny\nz\n", "y\n", "\n", "\n\n", "a.\n\nb.\n\nc", ".\n\n", "<think>", "</think>", "Steps:"]
WORDS += ["q\nr", "\nw", ";", "a;b;", "<Answer>:", "7\nz", "<think>\nu.\n\n", "So.\n\nNext"]


def test_tokens_that_end_several_steps_or_add_no_bytes():
  """A word-level vocabulary (tokens joined by spaces) whose tokens hold several line ends ('x\\ny\\nz\\n': the
  steps before its last end are empty spans at it), several paragraph ends (one step), a paragraph end and the next
  paragraph's first word, or nothing the tokenizer knows (ids past it: they join the step they follow)."""
  t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
  t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>")
  vocab = len(tok) + 3
  rng = np.random.default_rng(1)
  rows = [list(rng.integers(0, vocab, int(rng.integers(0, WIDTH + 1)))) for _ in range(96)]
  for boundary in BOUNDARIES:
    got, _ = device_spans(tok, boundary, rows, vocab)
    for ids, spans in zip(rows, got):
      assert spans == host_spans(tok, boundary, ids), (boundary, [WORDS[i] if i < len(WORDS) else i for i in ids])
  line = device_spans(tok, BOUNDARIES[0], rows, vocab)[0]
  assert any(s == e for row in line for s, e in row)  # empty steps were compared


def test_the_step_buffer_keeps_the_first_steps_and_counts_them_all(bpe):
  ids = bpe(CORPUS[0], add_special_tokens=False)["input_ids"]
  want = host_spans(bpe, BOUNDARIES[0], ids)
  got, count = device_spans(bpe, BOUNDARIES[0], [ids], len(bpe), steps=2)
  assert got == [want[:2]] and count.tolist() == [len(want)] and len(want) > 2


def test_sentence_mode_is_refused(bpe):
  with pytest.raises(ConfigError, match="sentence mode counts characters"):
    align_table(StepBoundary("sentence"), bpe, len(bpe))


@pytest.fixture(scope="module")
def bpe():
  return get_tokenizer("bpe")
