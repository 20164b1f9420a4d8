"""The step boundary (docs/method.md §A1): the device stop rule `advance`, run under jit over token ids, stops exactly
where `StepBoundary.align` ends spans, and those spans are the character-level regions of `steps.segment`; on byte-level
BPE, SentencePiece-style and SmolLM2 tokenizers, on sampled-like texts and on random ids."""

from __future__ import annotations

import ast
import bisect
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_steps import CORPUS, LINE, PROSE, THINK, TOKENIZERS, bpe, get_tokenizer, tok  # noqa: F401 (fixtures)
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from reprobe_jax import steps as S
from reprobe_jax.errors import ConfigError
from reprobe_jax.models import LanguageModel, ModelConfig, SamplingParams
from reprobe_jax.models import decoding
import reprobe_jax.models.decode_state as decode_state
from reprobe_jax.steps import ENDS_AFTER, ENDS_BEFORE, StepBoundary, advance, initial_state

BOUNDARIES = [
  StepBoundary("line"),
  StepBoundary("sentence"),
  StepBoundary("sentence", min_chars=0),
  StepBoundary("paragraph"),
  StepBoundary("regex", pattern=r";|\n\n"),
]
FRAGMENTS = [
  "- Step 1: 2 + 3 = 5",
  "Solution:",
  "Steps :",
  "The value is 3.14",
  " e.g. here",
  " etc.",
  " Dr. No",
  "Ok.",
  " Yes!",
  "Why?",
  " ",
  "  ",
  "\n",
  "\n\n",
  ".\n\n",
  ". ",
  "\t",
  "<think>",
  "</think>",
  " é",
  "日本",
  "x",
  ";",
  " z.",
]
TRACES = 0


@jax.jit
def device_ends(table, ids):
  """[B, T] ends codes of `advance` over the rows of ids [B, T], one token at a time, as a sampler runs it."""
  global TRACES
  TRACES += 1

  def step(state, tok):
    return advance(table, state, tok)

  _, ends = jax.lax.scan(step, initial_state(table, ids.shape[0]), ids.T)
  return ends.T


def device_ends_of(table, ids) -> np.ndarray:
  """[T] ends codes of one row, padded to a power of two so that few shapes compile (the padding comes after)."""
  width = 1 << max(6, (len(ids) - 1).bit_length())
  return np.asarray(device_ends(table, jnp.asarray([list(ids) + [0] * (width - len(ids))], jnp.int32)))[0, : len(ids)]


def stops(codes) -> set[int]:
  """Span ends the sampler's stops claim: before the token (ENDS_BEFORE) or after it (ENDS_AFTER)."""
  return {t for t, c in enumerate(codes) if c & ENDS_BEFORE} | {t + 1 for t, c in enumerate(codes) if c & ENDS_AFTER}


def check_stops_are_span_ends(steps, codes):
  ends = [s.end for s in steps]
  assert stops(codes) <= set(ends), (stops(codes), ends)
  assert set(ends[:-1]) <= stops(codes), (stops(codes), ends)


def reference_spans(tok, ids, boundary):
  """Spans of `steps.segment`'s regions: a token is in the step whose (body start, end] holds its last byte; in
  paragraph mode the token holding a boundary's last byte closes the step. Needs text that is valid UTF-8."""
  tb = S.token_bytes(tok)
  text = tok.decode(ids)
  bends = S.byte_ends(tb, ids)
  lead = (bends[-1] if bends else 0) - len(text.encode())  # leading spaces the decoder strips
  to_byte = lambda c: lead + len(text[:c].encode())
  out = []
  for cs, ce, body in S.segment(text, boundary.mode, min_chars=boundary.min_chars, pattern=boundary.pattern):
    if boundary.mode != "paragraph":
      out.append((bisect.bisect_right(bends, to_byte(cs)), bisect.bisect_right(bends, to_byte(ce)), body))
      continue
    end = bisect.bisect_left(bends, to_byte(ce)) + 1
    if out and out[-1][1] == end:
      continue  # two boundaries in one token: one step
    out.append((max(out[-1][1] if out else 0, bisect.bisect_right(bends, to_byte(cs))), end, body))
  return [(s if s < e else e, e, body) for s, e, body in out]


def tokenise_in_pieces(tok, text, cuts):
  """Tokenise text cut at `cuts` piece by piece, as a sampler may produce tokens no tokenizer would."""
  cuts = sorted(set(c for c in cuts if 0 < c < len(text)))
  pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
  return [i for p in pieces if p for i in tok(p, add_special_tokens=False)["input_ids"]]


texts = st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=30).map("".join)


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=25, deadline=None)
@given(text=texts, cuts=st.lists(st.integers(0, 400), max_size=8))
def test_spans_are_the_character_regions(name, text, cuts):
  tok = get_tokenizer(name)
  ids = tokenise_in_pieces(tok, text, cuts)
  for boundary in BOUNDARIES:
    steps = boundary.align(tok, ids)
    want = reference_spans(tok, ids, boundary)
    assert [(s.start, s.end) for s in steps] == [(a, b) for a, b, _ in want], boundary
    if boundary.mode != "paragraph":  # there a step's text runs to the end of the token that closes it
      assert [s.text for s in steps] == [body for _, _, body in want], boundary
    check_stops_are_span_ends(steps, device_ends_of(boundary.compile(tok), ids))


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_device_stops_are_span_ends_on_random_ids(name, data):
  """Rows of 40 tokens, each from sampled-like text or any id at all (broken UTF-8, special tokens, byte runs)."""
  tok = get_tokenizer(name)
  common = sorted({i for t in CORPUS[:5] for i in tok(t, add_special_tokens=False)["input_ids"]})
  token = st.one_of(st.sampled_from(common), st.integers(0, len(tok) - 1))
  rows = data.draw(st.lists(st.lists(token, min_size=40, max_size=40), min_size=4, max_size=4))
  for boundary in BOUNDARIES:
    codes = np.asarray(device_ends(boundary.compile(tok), jnp.asarray(rows, jnp.int32)))
    for row, row_codes in zip(rows, codes):
      steps = boundary.align(tok, row)
      check_stops_are_span_ends(steps, row_codes)
      cut = data.draw(st.integers(1, len(row)))  # the host alignment is causal too: a prefix keeps earlier steps
      prefix = [(s.start, s.end) for s in boundary.align(tok, row[:cut])]
      assert prefix[:-1] == [(s.start, s.end) for s in steps][: max(len(prefix) - 1, 0)]


def test_stop_codes_on_sampled_texts(tok):
  """Every fixed text: the device stops where the spans end, and where docs/method.md §A1 says."""
  for text, boundary, n_steps in [
    (LINE, StepBoundary("line"), 4),
    (THINK, StepBoundary("paragraph"), 3),
    (PROSE, StepBoundary("sentence"), 3),
  ]:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    steps = boundary.align(tok, ids)
    codes = device_ends_of(boundary.compile(tok), ids)
    assert len(steps) == n_steps
    check_stops_are_span_ends(steps, codes)
    assert len(stops(codes)) == n_steps - (boundary.mode != "paragraph")  # the last line / sentence needs no stop


def test_a_split_paragraph_end_and_a_sentence_start(bpe):
  piece = lambda p: bpe(p, add_special_tokens=False)["input_ids"]
  ids = piece("First, 1 + 1 = 2") + piece(".") + piece("\n\n") + piece("Next, 2 + 2 = 4.\n\n")
  codes = device_ends_of(StepBoundary("paragraph").compile(bpe), ids)
  k = len(piece("First, 1 + 1 = 2"))
  assert codes[k] == 0 and codes[k + 1] == ENDS_AFTER and codes[-1] == ENDS_AFTER and stops(codes) == {k + 2, len(ids)}
  ids = piece("The value is surely fine here.") + piece(" Then") + piece(" more.")
  codes = device_ends_of(StepBoundary("sentence").compile(bpe), ids)
  j = len(piece("The value is surely fine here."))
  assert codes[j] == ENDS_BEFORE and stops(codes) == {j}  # " Then" shows the sentence ended; it opens the next


def test_nothing_stops_after_think_close(bpe):
  close = bpe.convert_tokens_to_ids("</think>")
  rng = np.random.default_rng(0)
  rows = np.concatenate(
    [rng.integers(0, len(bpe), (8, 5)), np.full((8, 1), close), rng.integers(0, len(bpe), (8, 40))], axis=1
  )
  for boundary in (StepBoundary("paragraph"), StepBoundary("sentence", min_chars=0)):
    codes = np.asarray(device_ends(boundary.compile(bpe), jnp.asarray(rows, jnp.int32)))
    assert not codes[:, 6:].any()


def test_tokens_holding_several_sentence_ends():
  """A vocabulary with tokens like 'Ok. Yes! No?' (one token may open several gates) and no decoder (tokens joined
  by spaces): stops, spans and character regions agree for every min_chars."""
  words = ["<unk>", "x", "yy", "a.", "Ok. Yes! No?", ". . .", "e.g.", "etc. x. y", "\n", "<think>", "</think>", "Zz."]
  tok = PreTrainedTokenizerFast(
    tokenizer_object=Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
  )
  rows = np.random.default_rng(1).integers(1, len(words), (32, 30))
  for m in (0, 2, 6, 12, 30):
    boundary = StepBoundary("sentence", min_chars=m)
    table = boundary.compile(tok)
    codes = np.asarray(device_ends(table, jnp.asarray(rows, jnp.int32)))
    for row, row_codes in zip(rows.tolist(), codes):
      steps = boundary.align(tok, row)
      check_stops_are_span_ends(steps, row_codes)
      assert [(s.start, s.end, s.text) for s in steps] == reference_spans(tok, row, boundary)
  assert table.gate_at.shape[-1] >= 2


def test_tables_of_the_same_shape_compile_once_and_unknown_ids_stay_put(bpe):
  ids = jnp.asarray([bpe(LINE, add_special_tokens=False)["input_ids"][:12]], jnp.int32)
  line, paragraph = StepBoundary("line").compile(bpe, 512), StepBoundary("paragraph").compile(bpe, 512)
  assert line.transitions.shape == paragraph.transitions.shape == (32, 512)
  assert StepBoundary("line").compile(bpe, 512) is line  # cached per tokenizer
  device_ends(line, ids)
  before = TRACES
  device_ends(paragraph, ids)
  assert TRACES == before
  extra = np.asarray(line.transitions)[:, len(bpe) :]
  assert (extra == np.arange(32)[:, None]).all() and not np.asarray(line.ends)[:, len(bpe) :].any()
  padded = list(np.asarray(ids)[0]) + [len(bpe) + 3]  # the host skips such ids too, as the tokenizer's decode does
  texts = lambda steps: [(s.text, s.char_start, s.char_end) for s in steps]
  assert texts(StepBoundary("line").align(bpe, padded)) == texts(StepBoundary("line").align(bpe, padded[:-1]))


def lossy_text(tok, ids) -> str:
  """The text the automaton reads: all the tokens' bytes as one UTF-8 string, one U+FFFD per maximal subpart of an
  invalid sequence (the byte-level decoders' rule), less the decoder's leading strip. It is the decoded text but for
  a SentencePiece byte run that is not UTF-8, which that decoder reads as one U+FFFD per byte."""
  tb = S.token_bytes(tok)
  raw = b"".join(tb.piece(t)[0] for t in ids).decode("utf-8", "replace")
  k = 0
  while k < tb.strip and raw[k : k + 1] == tb.strip_char:
    k += 1
  return raw[k:]


def test_a_stray_continuation_byte_is_a_character(bpe):
  """Token 100 decodes to U+FFFD (one byte 0x80..0xBF): it opens the step, in the host alignment and on device."""
  assert bpe.decode([100]) == "\ufffd"
  for ids, want in [([100, 318], "\ufffdab"), ([100], "\ufffd")]:
    assert bpe.decode(ids) == want
    steps = S.align(bpe, ids, "line")
    assert [(s.text, s.char_start, s.start) for s in steps] == [(want, 0, 0)]
    assert [r[2] for r in S.segment(want, "line")] == [want]
    check_stops_are_span_ends(steps, device_ends_of(StepBoundary("line").compile(bpe), ids))


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_invalid_utf8_agrees_with_segment_and_the_device(bpe, data):
  """Byte tokens in any order (stray continuations, overlong and surrogate leads, truncated characters, C0, F5..FF)
  among text: align's steps are `segment`'s regions of the decoded text, and the device stops at their ends."""
  tb = S.token_bytes(bpe)
  single = sorted(i for i, p in enumerate(tb.pieces) if len(p) == 1)
  text_ids = sorted({i for t in CORPUS[:5] for i in bpe(t, add_special_tokens=False)["input_ids"]})
  ids = data.draw(st.lists(st.sampled_from(single) | st.sampled_from(text_ids), max_size=30))
  text = bpe.decode(ids)
  assert text == lossy_text(bpe, ids)
  for boundary in BOUNDARIES:
    steps = boundary.align(bpe, ids)
    want = S.segment(text, boundary.mode, min_chars=boundary.min_chars, pattern=boundary.pattern)
    if boundary.mode != "paragraph":  # there a step's text runs to the end of the token that closes it
      assert [(s.char_start, s.char_end, s.text) for s in steps] == [(cs, ce, b) for cs, ce, b in want], boundary
    assert len(steps) == len(want), boundary
    check_stops_are_span_ends(steps, device_ends_of(boundary.compile(bpe), ids))


def test_boundary_errors():
  with pytest.raises(ConfigError, match="unknown step mode"):
    StepBoundary("words")
  with pytest.raises(ConfigError, match="needs a pattern"):
    StepBoundary("regex")
  with pytest.raises(ConfigError, match="not supported"):
    StepBoundary("regex", pattern=r"\n+")
  with pytest.raises(ConfigError, match="min_chars"):
    StepBoundary("sentence", min_chars=-1)
  with pytest.raises(ConfigError, match="no tokenizer"):
    StepBoundary("line").compile(None, 16)


def test_the_model_layer_takes_the_compiled_table_as_data(bpe):
  """The sampler runs a compiled StopTable (the step-end codes are the data contract between the two layers) and
  refuses a boundary it would have to compile: the model layer does not know what a step is."""
  assert (decode_state.ENDS_BEFORE, decode_state.ENDS_AFTER) == (ENDS_BEFORE, ENDS_AFTER)
  cfg = ModelConfig(
    family="llama",
    vocab_size=len(bpe),
    hidden_size=16,
    intermediate_size=16,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    max_position_embeddings=64,
  )
  lm = LanguageModel.random(cfg, tokenizer=bpe)
  table = StepBoundary("paragraph").compile(lm.tokenizer, lm.config.vocab_size)
  assert lm.sampler(stop=table).stop is table
  with pytest.raises(ConfigError, match=r"step boundary, not a compiled stop table.*boundary\.compile"):
    lm.sampler(stop=StepBoundary("paragraph"))
  models_dir = pathlib.Path(decoding.__file__).parent
  for path in sorted(models_dir.glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      names = (
        [a.name for a in node.names]
        if isinstance(node, ast.Import)
        else [node.module or ""]
        if isinstance(node, ast.ImportFrom)
        else []
      )
      assert not any(n == "reprobe_jax.steps" or n.startswith("reprobe_jax.steps.") for n in names), path


def _unigram_model(tok, favoured, seed: int):
  """A random decoder that samples (nearly) independently from the `favoured` tokens: attention and MLP outputs are
  zero, so the final state is the token's embedding, whose dimension 0 is a constant 1 that the output head reads."""
  v = len(tok)
  cfg = ModelConfig(
    family="llama",
    vocab_size=v,
    hidden_size=16,
    intermediate_size=16,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    tie_word_embeddings=False,
    max_position_embeddings=512,
    eos_token_ids=(0,),
    pad_token_id=0,
  )  # id 0 is not favoured: rows mostly run to their budget
  lm = LanguageModel.random(cfg, seed=seed, tokenizer=tok)
  rng = np.random.default_rng(seed)
  head = np.zeros((16, v), np.float32)
  head[0, favoured] = 2.0 + 0.3 * rng.standard_normal(len(favoured))
  marks = [i for i in favoured if any(c in tok.decode([i]) for c in ".!?\n")]  # sampled more often: more step ends
  head[0, marks] += 0.8
  emb = 0.05 * rng.standard_normal((v, 16)).astype(np.float32)
  emb[:, 0] = 1.0

  def patch(path, x):
    name = jax.tree_util.keystr(path)
    if "o_proj" in name or "down_proj" in name:
      return np.zeros_like(x)
    if "embed_tokens" in name:
      return emb
    if "lm_head" in name:
      return head
    if name.endswith("norm']['scale']") or ("norm" in name and "layers" not in name):
      return np.eye(1, 16, 0, dtype=np.float32)[0]
    return x

  lm.params = jax.tree_util.tree_map_with_path(lambda p, x: jax.numpy.asarray(patch(p, x)), lm.params)
  return lm


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("mode", ["line", "sentence", "paragraph"])
def test_sampler_stops_are_the_aligned_step_ends(name, mode):
  """The sampler, decoding with a StepBoundary and resuming after each stop, pauses exactly at the span ends that
  `StepBoundary.align` finds in the finished response (every one but the last), on byte-level BPE,
  SentencePiece-style and SmolLM2's tokenizer. Its newest-step span starts where the previous step ended, so it also
  holds the blank or header tokens that `align` leaves out between steps."""
  tok = get_tokenizer(name)
  favoured = sorted(
    {
      i
      for text in CORPUS[:5]
      for i in tok(text, add_special_tokens=False)["input_ids"]
      if "think>" not in tok.decode([i])
    }
  )  # a sampled '</think>' would end every step
  lm = _unigram_model(tok, favoured, seed=len(name) + len(mode))
  boundary = StepBoundary(mode)
  smp = lm.sampler(SamplingParams(1.0), stop=boundary.compile(tok, lm.config.vocab_size))
  rows_n = 8
  state = smp.prefill([favoured[:4]], max_new_tokens=128, n=rows_n, seed=1)
  paused = [[] for _ in range(rows_n)]
  for _ in range(200):
    state = smp.decode(state)
    rows = smp.read(state)
    if all(r.finish_reason != "stop" for r in rows[:rows_n]):
      break
    for r, row in enumerate(rows[:rows_n]):
      if row.finish_reason == "stop":
        paused[r].append((row.step_start, row.step_end))
    state = smp.resume(state)
  rows = smp.read(state)
  total = 0
  for r, row in enumerate(rows[:rows_n]):
    steps = boundary.align(tok, row.tokens)
    ends = [s.end for s in steps]
    assert [e for _, e in paused[r]] == ends[: len(paused[r])], (r, paused[r], ends)
    assert len(paused[r]) >= len(ends) - 1, "a span end before the last was not a stop"
    for k, (start, end) in enumerate(paused[r]):  # each paused span covers its aligned step and starts at the last end
      assert start == (paused[r][k - 1][1] if k else 0) and start <= steps[k].start
    total += len(paused[r])
  assert total >= 4, f"too few boundaries were sampled ({total}) for the test to mean anything"
