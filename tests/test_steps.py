"""Step segmentation and exact token alignment (METHOD A1) on byte-level BPE, SmolLM2's and SentencePiece-style
tokenizers, including tokens that straddle a step boundary and token sequences no tokenizer would produce."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reprobe_jax import steps as S
from reprobe_jax.errors import ConfigError

LINE = ("Reasoning Steps:\n- Step 1: 30 * 2 = 60\n- Step 2: 60 + 14 = 74\n\n- Step 3: 74 - 2 = 72\n"
        "<Answer>: 72")
THINK = ("<think>\nFirst, 30 * 2 = 60.\n\nNext, 60 + 14 = 74.\n\nWait, let me check: 60 + 14 = 74.\n\n</think>\n\n"
         "**Final Answer**\n\\boxed{74}")
PROSE = ("<think>\nThe value is 3.14 here, e.g. in the table. Then we add 2! Ok. Is that right? "
         "Yes, it equals 5.14 exactly.</think> done")
CORPUS = [LINE, THINK, PROSE, "- Step 1: move from attic to garage\n<Answer>: 1",
          "the mentor of Ivan is Tara.\n\n"] * 20


@pytest.fixture(scope="module")
def bpe():
  from reprobe_jax.synthetic.tokenizer import build_tokenizer
  return build_tokenizer(CORPUS, 400)


@pytest.fixture(scope="module")
def sentencepiece():
  """A Llama-2-style SentencePiece tokenizer ('▁' for spaces, byte fallback, no pre-split on newlines, so pieces
  like '▁60\\n-' straddle line boundaries), trained here with `tokenizers`."""
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast
  sp = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
  sp.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
  sp.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
  sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                  decoders.Strip(" ", 1, 0)])
  trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>"] + [f"<0x{i:02X}>" for i in range(256)],
                                show_progress=False)
  sp.train_from_iterator(CORPUS, trainer=trainer)
  return PreTrainedTokenizerFast(tokenizer_object=sp, unk_token="<unk>")


@pytest.fixture(scope="module")
def smollm2():
  from reprobe_jax.models import load_tokenizer, smollm2_gguf_path
  try:
    path = smollm2_gguf_path()
  except ConfigError as e:
    pytest.skip(str(e))
  return load_tokenizer(os.path.dirname(path), os.path.basename(path))


def _tokenizers(request):
  return request.getfixturevalue(request.param)


@pytest.fixture(params=["bpe", "sentencepiece", "smollm2"])
def tok(request):
  return _tokenizers(request)


def _check_membership(tok, ids, steps, regions):
  """Every token is in the step whose region holds its last character, and only there."""
  _, ends = S.token_end_offsets(tok, ids)
  for j, e in enumerate(ends):
    owners = [k for k, (cs, ce, _) in enumerate(regions) if cs < e <= ce]
    in_spans = [k for k, st_ in enumerate(steps) if st_.start <= j < st_.end]
    assert in_spans == owners, (j, e, owners, in_spans)


@pytest.mark.parametrize("text,mode,expected", [
    (LINE, "line", ["- Step 1: 30 * 2 = 60", "- Step 2: 60 + 14 = 74", "- Step 3: 74 - 2 = 72", "<Answer>: 72"]),
    (THINK, "paragraph", ["First, 30 * 2 = 60.", "Next, 60 + 14 = 74.", "Wait, let me check: 60 + 14 = 74."]),
    # "Then we add 2!", "Ok." and "Is that right?" are shorter than min_chars=20: merged into the one before.
    (PROSE, "sentence", ["The value is 3.14 here, e.g. in the table. Then we add 2! Ok. Is that right?",
                         "Yes, it equals 5.14 exactly."]),
])
def test_segmentation_and_alignment(tok, text, mode, expected):
  ids = tok(text, add_special_tokens=False)["input_ids"]
  steps = S.align(tok, ids, mode)
  assert [s.text for s in steps] == expected
  decoded = tok.decode(ids)
  if mode != "paragraph":
    regions = S.segment(decoded, mode)
    _check_membership(tok, ids, steps, regions)
  for a, b in zip(steps, steps[1:]):
    assert a.end <= b.start
  for s in steps:
    assert s.num_tokens > 0
    assert s.text.strip()[:3] in tok.decode(ids[s.start:s.end]) or s.text[-3:] in tok.decode(ids[s.start:s.end])


def test_straddling_tokens_go_to_the_step_where_they_end(bpe):
  # A hand-made token sequence in which one token holds the end of step 1 and the start of step 2.
  text = "- Step 1: 4 + 3 = 7\n- Step 2: 7 * 2 = 14"
  cut = text.index("7\n- Step 2") + 1  # "\n- St" will be one piece
  pieces = [text[:cut - 3], text[cut - 3:cut + 5], text[cut + 5:]]
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
    assert tok.decode(ids[steps[-1].start - 10:steps[-1].end - 10]).endswith(".\n\n")
  # '.' and '\n\n' as separate tokens still close a paragraph
  ids = bpe("First, 1 + 1 = 2", add_special_tokens=False)["input_ids"] + \
      bpe(".", add_special_tokens=False)["input_ids"] + bpe("\n\nNext, 2 + 2 = 4.\n\n", add_special_tokens=False)[
          "input_ids"]
  steps = S.align(bpe, ids, "paragraph")
  assert [s.text for s in steps] == ["First, 1 + 1 = 2.", "Next, 2 + 2 = 4."]


def test_regex_mode_and_errors(bpe):
  text = "a b ; c d ; e"
  ids = bpe(text, add_special_tokens=False)["input_ids"]
  assert [s.text for s in S.align(bpe, ids, "regex", pattern=r";")] == ["a b ;", "c d ;", "e"]
  with pytest.raises(ConfigError, match="unknown step mode"):
    S.segment(text, "words")
  with pytest.raises(ConfigError, match="invalid"):
    S.segment(text, "regex", pattern="(")
  with pytest.raises(ConfigError, match="needs a pattern"):
    S.segment(text, "regex")
  assert S.segment("", "line") == [] and S.segment("\n\n", "sentence") == []
  assert np.all(np.diff([s.start for s in S.align(bpe, bpe(LINE)["input_ids"], "line")]) > 0)
