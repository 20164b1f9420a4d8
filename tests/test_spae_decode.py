"""Probe-truncated decoding (docs/method.md §B3) as one device program: one fetch per call, and `</think>` right after
the boundary's last token also where the tokenizer merges the paragraph end with the next word ('\\n\\nSo')."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from spae_tiny import sentencepiece_tokenizer, tiny_lm, train
from test_spae_potential import _thinking_set

from reprobe_jax.models import SamplingParams
from reprobe_jax.spae.decode import decode_thinking
from reprobe_jax.spae.potential import ProbeConfig
from reprobe_jax.spae.prober import Prober


class _Fetches:
  """Counts `jax.device_get` calls; with `jax.transfer_guard_device_to_host('disallow')` around a call, any other
  device-to-host transfer (an implicit `np.asarray`, `int(...)` of a device array) raises."""

  def __init__(self, monkeypatch):
    self.count, real = 0, jax.device_get

    def counted(x):
      self.count += 1
      return real(x)

    monkeypatch.setattr(jax, "device_get", counted)


@pytest.mark.slow  # compiles the decoding program (about 35 s on 2 shared cores)
def test_a_call_fetches_once_and_a_second_call_compiles_nothing(synthetic_lm, monkeypatch, compile_counter):
  problems, prompts, _, answers = _thinking_set(synthetic_lm, 2)  # one prompt per call, two rows: two buckets
  prober = Prober(synthetic_lm, ProbeConfig(samples=2, max_tokens=4, eps_sat=-1.0))
  fetches = _Fetches(monkeypatch)
  ticks = []
  with jax.transfer_guard_device_to_host("disallow"):
    rows = decode_thinking(
      synthetic_lm,
      prober,
      prompts[:1],
      answers[:1],
      [1],
      sampling=SamplingParams(1.0),
      max_new_tokens=24,
      samples=2,
      truncate=True,
      progress=ticks.append,
    )
  assert fetches.count == 1 and ticks == [2]
  assert [(r.prompt_index, r.sample) for r in rows] == [(0, 0), (0, 1)]
  assert all(len(r.response_ids) <= 24 + 4 for r in rows)
  before = compile_counter.count  # other prompts and seeds in the same buckets: the same programs
  again = decode_thinking(
    synthetic_lm,
    prober,
    prompts[1:],
    answers[1:],
    [7],
    sampling=SamplingParams(1.0),
    max_new_tokens=24,
    samples=2,
    truncate=True,
  )
  assert compile_counter.count == before and len(again) == 2


MERGED = "<think>\nsix times seven is 42.\n\nSo the answer is 42.\n\n</think>"


@pytest.mark.slow  # trains a tiny model (about 20 s) and compiles the decoding program twice
def test_truncation_follows_the_boundary_token_when_the_paragraph_end_merges_with_the_next_word(monkeypatch):
  tok = sentencepiece_tokenizer()
  enc = lambda t: list(tok(t, add_special_tokens=False)["input_ids"])
  lm = tiny_lm(tok)
  prompt, response = enc("What is seven times six?"), enc(MERGED)
  names = tok.convert_ids_to_tokens(response)
  merged = names.index("\n\nSo")
  train(lm, [prompt + response + [tok.eos_token_id]])
  prober = Prober(lm, ProbeConfig(samples=2, max_tokens=4, eps_sat=-1.0))  # every boundary saturates
  # The merged token completes '.\\n\\n', so it closes the first paragraph step: the probe reads it whole.
  assert prober.merged_ends == {response[merged]: "\n\n"}
  assert prober.boundaries([response])[0].tolist()[0] == merged
  run = lambda truncate: decode_thinking(
    lm, prober, [prompt], ["42"], [5], sampling=SamplingParams(0.0), max_new_tokens=40, truncate=truncate
  )[0]
  plain = run(False)
  assert list(plain.response_ids) == response  # the model writes its trace
  assert plain.potentials.cuts.tolist()[0] == merged
  fetches = _Fetches(monkeypatch)
  with jax.transfer_guard_device_to_host("disallow"):
    cut = run(True)
  assert fetches.count == 1
  # Truncated: the plain tokens before the merged one, then the paragraph end and '</think>' as the tokenizer
  # writes them after a word ('So' goes, it opens the next paragraph), then what the model writes after them.
  tail = tok.convert_ids_to_tokens(list(cut.response_ids[merged:]))
  assert list(cut.response_ids[:merged]) == response[:merged]
  assert tail[:3] == ["\n", "\n", "</think>"], tail
  assert cut.truncated_at == 0 and cut.potentials.cuts.tolist() == [merged]
  np.testing.assert_allclose(cut.potentials.acc, plain.potentials.acc[:1], rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(cut.potentials.conf, plain.potentials.conf[:1], rtol=1e-4, atol=1e-6)
