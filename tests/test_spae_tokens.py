"""SPAE's probe reads the suffix and the answer as they are tokenised in context (docs/method.md §B1), accepts
thinking opened by the chat template, and checks its context budget before any work: on a SentencePiece-style
tokenizer built here (`spae_tiny`) with a tiny model trained to answer after the suffix, on the built-in tokenizer
and on SmolLM2's."""

from __future__ import annotations

import numpy as np
import pytest
from spae_tiny import sentencepiece_tokenizer, tiny_lm, train
from test_spae_potential import _log_softmax, _logits, _thinking_set
from test_steps import get_tokenizer

from reprobe_jax.errors import CacheFullError, DataFormatError
from reprobe_jax.spae.potential import ProbeConfig
from reprobe_jax.spae.prober import Prober
from reprobe_jax.tasks import make_problems
from reprobe_jax.tasks.response import ANSWER_OPENER

QUESTION = "What is six times seven?"
THOUGHT = "<think>\nsix times seven is 42.\n\n</think>"


def _enc(tok, text):
  return list(tok(text, add_special_tokens=False)["input_ids"])


def _sp_prober(lm):
  return Prober(lm, ProbeConfig(samples=2, max_tokens=4))


@pytest.fixture(scope="module")
def sp_lm():
  """An untrained tiny model with the SentencePiece-style tokenizer: the probe's inputs and checks."""
  return tiny_lm(sentencepiece_tokenizer())


def test_sentencepiece_answers_and_suffix_are_read_as_in_context(sp_lm):
  tok = sp_lm.tokenizer
  prober = _sp_prober(sp_lm)
  # Alone, SentencePiece opens every text with a lone '▁' that the model never writes after '{' or after '\n\n'.
  assert tok.convert_ids_to_tokens(_enc(tok, "42"))[0] == "▁"
  assert tok.convert_ids_to_tokens(_enc(tok, ANSWER_OPENER))[0] == "▁"
  assert tok.convert_ids_to_tokens(prober.answer_ids(["42"])[0]) == ["4", "2"]
  assert tok.convert_ids_to_tokens(prober.suffix_ids)[0] == "**"
  # The in-context ids are how the whole text tokenises in place.
  response = _enc(tok, THOUGHT)
  (cut,) = prober.boundaries([response])[0]
  whole = _enc(tok, QUESTION) + _enc(tok, THOUGHT[: THOUGHT.index("</think>")] + ANSWER_OPENER + "42")
  assert whole == _enc(tok, QUESTION) + response[: cut + 1] + prober.suffix_ids + prober.answer_ids(["42"])[0]


def test_thinks_and_refusal(sp_lm):
  tok = sp_lm.tokenizer
  prober = _sp_prober(sp_lm)
  prompt, response = _enc(tok, QUESTION), _enc(tok, THOUGHT)
  assert tok.convert_ids_to_tokens(response[:3]) == ["<think>", "▁", "\n"]
  opened = [prompt + response[:k] for k in (1, 3)]  # the template ends with '<think>', or '<think>' and a newline
  got = prober.thinks([prompt] + opened + [prompt], [response, response[1:], response[3:], response[3:]])
  assert got.tolist() == [True, True, True, False]
  with pytest.raises(DataFormatError, match=r"t1 has no <think> in its response nor at the end of its prompt"):
    prober.potentials([prompt, prompt], [response, response[3:]], ["42", "42"], [0, 1], names=["t0", "t1"])


@pytest.mark.slow  # trains a tiny model (about 20 s) and compiles a probe program (about 30 s on 2 cores)
def test_a_model_that_knows_the_answer_reads_acc_1_also_when_the_template_opens_the_thinking(sp_lm):
  lm = tiny_lm(sp_lm.tokenizer)
  tok = lm.tokenizer
  prober = _sp_prober(lm)
  prompt, response = _enc(tok, QUESTION), _enc(tok, THOUGHT)
  (cut,) = prober.boundaries([response])[0]
  ctx = prompt + response[: cut + 1] + prober.suffix_ids
  y = prober.answer_ids(["42"])[0]
  train(lm, [ctx + y + _enc(tok, "}")[-1:] + [tok.eos_token_id]])
  # The model surely writes the answer there (teacher-forced, each token) ...
  lp = _log_softmax(_logits(lm, ctx + y))
  assert all(np.exp(lp[len(ctx) - 1 + m, y[m]]) > 0.99 for m in range(len(y)))
  # ... and the standalone ids ('▁' first, which it never writes there) would have read Acc <= 2/3.
  old = _enc(tok, "42")
  lp_old = _log_softmax(_logits(lm, ctx + old))
  assert np.mean([np.exp(lp_old[len(ctx) - 1 + m, old[m]]) for m in range(len(old))]) < 0.7
  # Acc is 1; a template that opens the thinking (prompt ends with '<think>', with or without the newline) gives
  # the same potentials at the shifted cuts.
  prompts = [prompt] + [prompt + response[:k] for k in (1, 3)]
  responses = [response, response[1:], response[3:]]
  inside, *opened = prober.potentials(prompts, responses, ["42"] * 3, [3, 3, 3])
  assert inside.cuts.tolist() == [cut]
  np.testing.assert_allclose(inside.acc, [1.0], atol=1e-2)
  for k, pot in zip((1, 3), opened):
    np.testing.assert_array_equal(pot.cuts, inside.cuts - k)
    np.testing.assert_allclose(pot.acc, inside.acc, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(pot.conf, inside.conf, rtol=1e-4, atol=1e-6)


def test_the_budget_counts_the_in_context_probe(sp_lm):
  prober = _sp_prober(sp_lm)
  room = sp_lm.config.max_position_embeddings
  need = 1 + len(prober.suffix_ids) + max(2, prober.cfg.max_tokens)  # '42' is 2 tokens in context
  prober.check_budget(room - need - 100, 100, ["42", "7"])
  with pytest.raises(CacheFullError, match=rf"a prompt of {room - need - 99} tokens \+ max_new_tokens=100: .* = "):
    prober.check_budget(room - need - 99, 100, ["42", "7"])
  long = "1" * 40  # an answer longer than the samples counts with its own length
  prober.check_budget(room - 1 - len(prober.suffix_ids) - 40, 0, [long, "42"])
  with pytest.raises(CacheFullError, match=r"40 answer tokens"):
    prober.check_budget(room - len(prober.suffix_ids) - 40, 0, [long, "42"])


def test_bpe_ids_are_unchanged(synthetic_lm):
  """The built-in tokenizer and SmolLM2's read the same ids in context as alone: SPAE's synthetic numbers stay."""
  answers = sorted({p.answer for fam in ("arithmetic", "planning", "qa") for p in make_problems(fam, 40, 0, 2)})
  smol = get_tokenizer("smollm2")
  from reprobe_jax.spae.potential import BOUNDARY_TEXT, in_context, paragraph_head

  for tok in (synthetic_lm.tokenizer, smol):
    # no token holds a paragraph end and the next word: truncation closes right after the boundary token
    assert not any(paragraph_head(t) for t in tok.batch_decode([[i] for i in range(len(tok))]))
    assert in_context(tok, BOUNDARY_TEXT, ANSWER_OPENER) == _enc(tok, ANSWER_OPENER)
    assert in_context(tok, BOUNDARY_TEXT, "</think>") == _enc(tok, "</think>")
    for a in answers:
      assert in_context(tok, BOUNDARY_TEXT + ANSWER_OPENER, a) == _enc(tok, a), a
  prober = Prober(synthetic_lm)
  assert prober.suffix_ids == _enc(synthetic_lm.tokenizer, ANSWER_OPENER)
  assert prober.answer_ids(answers) == [_enc(synthetic_lm.tokenizer, a) for a in answers]
  _, prompts, responses, _ = _thinking_set(synthetic_lm, 2)
  assert prober.thinks(prompts, responses).tolist() == [True, True]
