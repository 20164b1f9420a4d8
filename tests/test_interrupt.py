"""Interrupted-thinking training examples (the SPAE target's skill) and their loss weights."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from reprobe_jax.errors import ConfigError
from reprobe_jax.jobs.runs import run_key
from reprobe_jax.jobs import target_config as build
from reprobe_jax.synthetic.interrupt import boundary_ends, interrupted_examples
from reprobe_jax.synthetic.train_lm import encode_examples
from reprobe_jax.tasks import make_problems
from reprobe_jax.tasks.formats import answers_so_far
from reprobe_jax.tasks.response import ANSWER_OPENER, parse_thinking
from reprobe_jax.tasks.traces import solve_many


def test_boundary_ends_stop_at_think_close():
  text = "<think>\nStep 1: 2 + 3 = 5.\n\nSo the answer is 5.\n\n</think>\n\n**Final Answer**\n\\boxed{5}.\n\n"
  ends = boundary_ends(text)
  assert len(ends) == 2 and text[: ends[0]].endswith("2 + 3 = 5.\n\n") and text[: ends[1]].endswith("is 5.\n\n")


def test_answers_so_far_worked_example():
  p = make_problems("arithmetic", 1, 3, 2)[0]
  ops = p.data["ops"]
  text = solve_many([p], "thinking", 0)[0].text
  paragraphs = parse_thinking(text)[0]
  so_far = answers_so_far(p, paragraphs)
  assert len(so_far) == len(paragraphs)
  assert [done for _, done in so_far][: len(ops)] == [False] * (len(ops) - 1) + [True]
  # the answer after the last work step is what 'So the answer is X.' claims in a trace without slips
  assert so_far[len(ops)][0] == paragraphs[len(ops)].removeprefix("So the answer is ").rstrip(".")


def test_examples_hold_the_answer_a_solver_has_there():
  problems = make_problems("arithmetic", 40, 5, 2) + make_problems("qa", 20, 5, 2)
  texts = [t.text for t in solve_many(problems, "thinking", 0)]
  ex = interrupted_examples(problems, texts, share=1.0, seed=0, guess_share=0.0)
  assert len(ex) == len(problems)
  by_id = {p.id: (p, t) for p, t in zip(problems, texts)}
  for e in ex:
    p, text = by_id[e.problem_id]
    assert e.prefix.endswith(".\n\n" + ANSWER_OPENER) and text.startswith(e.prefix[: -len(ANSWER_OPENER)])
    paragraphs = parse_thinking(e.prefix[: -len(ANSWER_OPENER)])[0]
    assert len(paragraphs) == e.paragraph + 1
    assert (e.answer, e.complete) == answers_so_far(p, paragraphs)[-1]  # guess_share 0: always the running value
  assert {e.complete for e in ex} == {False, True}
  guessed = interrupted_examples(problems, texts, share=1.0, seed=0, guess_share=1.0)
  for e, g in zip(ex, guessed):
    assert g.paragraph == e.paragraph and (g.answer == e.answer or not e.complete)
  assert sum(g.answer != e.answer for e, g in zip(ex, guessed)) > 5  # unfinished chains answer another problem's
  half = interrupted_examples(problems, texts, share=0.5, seed=0)
  assert 15 <= len(half) <= 45 and {e.problem_id for e in half} <= {e.problem_id for e in ex}
  with pytest.raises(ConfigError, match="share"):
    interrupted_examples(problems, texts, share=1.5, seed=0)


def test_encode_examples_weights_per_pair(synthetic_lm):
  tok = synthetic_lm.tokenizer
  data = encode_examples(
    tok, [("Q one", "A"), ("Q two", "B")], (64,), prompt_weight=[0.5, 0.0], response_weight=[1.0, 4.0]
  )
  tokens, mask = data[64]
  for row, (pw, rw) in enumerate([(0.5, 1.0), (0.0, 4.0)]):
    n_prompt = len(tok("Q one" if row == 0 else "Q two", add_special_tokens=False)["input_ids"])
    n = int(np.sum(tokens[row] != tok.pad_token_id))
    assert np.all(mask[row, 1:n_prompt] == pw) and np.all(mask[row, n_prompt:n] == rw) and mask[row, 0] == 0
  with pytest.raises(ValueError, match="prompt weight"):
    encode_examples(tok, [("Q", "A")], (64,), prompt_weight=[0.1, 0.2])


def test_builds_without_interruptions_keep_their_key():
  cfg = build.SyntheticBuildConfig()
  d = dataclasses.asdict(cfg)
  # The fields added later, at the values that mean 'as before' (world v2, no procedure forks), stay out too.
  for name in ("interrupt_share", "interrupt_guess_share", "interrupt_loss_weight", "world"):
    d.pop(name)
  d["noise"].pop("procedures")
  assert cfg.key() == run_key(d, build._task_code_fingerprint(cfg))
  assert dataclasses.replace(cfg, interrupt_share=0.5).key() != cfg.key()
