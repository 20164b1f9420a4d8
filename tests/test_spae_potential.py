"""SPAE's step potential (docs/method.md §B1) and probe-truncated decoding (B3), held to direct forwards and to
one-at-a-time runs. Two tiny models: `synthetic_lm` (random, the synthetic worlds' tokenizer) for the probe's
arithmetic, and a model trained here for a few seconds to memorise four thinking traces, so that it writes paragraph
boundaries by itself for the decoding tests."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from reprobe_jax.errors import CacheFullError, ConfigError, DataFormatError
from reprobe_jax.models import SamplingParams
from reprobe_jax import steps as step_lib
from reprobe_jax.spae.decode import decode_thinking, trajectory_seed
from reprobe_jax.spae.potential import ProbeConfig, StepPotentials, saturated, step_potential
from reprobe_jax.spae.prober import Prober
from reprobe_jax.tasks import make_problems
from reprobe_jax.tasks.formats import user_prompt
from reprobe_jax.tasks.response import ANSWER_OPENER
from reprobe_jax.tasks.traces import TraceNoise, solve_many


def test_step_potential_corners_and_a_worked_example():
  acc = np.array([0.0, 1.0, 0.0, 1.0, 0.8, np.nan])
  conf = np.array([0.0, 1.0, 1.0, 0.0, 0.5, 0.3])
  phi = step_potential(acc, conf)
  # docs/method.md §B1's corners, then 1.5 * 0.8 * 0.5 + 0.5 * 0.8 - 0.5 = 0.6 + 0.4 - 0.5 = 0.5
  np.testing.assert_allclose(phi[:5], [0.0, 1.0, -1.0, 0.5, 0.5], atol=1e-12)
  assert np.isnan(phi[5])
  assert saturated(phi, 0.9).tolist() == [False, True, False, False, False, False]
  assert saturated(np.array([0.9, 0.9000001]), 0.9).tolist() == [False, True]  # strictly above eps_sat
  grid = step_potential(np.full((2, 3), 1.0), np.full((2, 3), 1.0))  # any shape
  assert grid.shape == (2, 3) and np.all(grid == 1.0)
  with pytest.raises(ConfigError, match="step_potential: acc and conf"):
    step_potential(np.zeros(3), np.zeros((3, 1)))  # would broadcast to [3, 3]


def _thinking_set(lm, n=6):
  """Prompt ids, response ids (the clean thinking trace up to and including '</think>') and answers."""
  from reprobe_jax.trajectories import prompt_text

  problems = make_problems("arithmetic", n, 11, 2)
  traces = solve_many(problems, "thinking", 0, TraceNoise.clean())
  tok = lm.tokenizer
  prompts = lm.encode([prompt_text(lm, p, "thinking") for p in problems])
  close = tok.convert_tokens_to_ids("</think>")
  responses = []
  for t in traces:
    ids = tok(t.text, add_special_tokens=False)["input_ids"]
    responses.append(ids[: ids.index(close) + 1])
  return problems, prompts, responses, [p.answer for p in problems]


def _logits(lm, ids):
  """[T, V] logits of a direct forward; right-padded to a bucket (causal: the padding changes no earlier position),
  so the many lengths here compile a few programs."""
  t = len(ids)
  size = 64 * -(-t // 64)
  out = lm.forward(np.asarray([list(ids) + [0] * (size - t)], np.int32))
  return np.asarray(out.logits[0, :t], np.float64)


def _log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_boundaries_are_the_paragraph_steps_ends(synthetic_lm):
  _, _, responses, _ = _thinking_set(synthetic_lm)
  prober = Prober(synthetic_lm)
  for ids, cuts in zip(responses, prober.boundaries(responses)):
    spans = step_lib.align(synthetic_lm.tokenizer, ids, "paragraph")
    assert cuts.tolist() == [s.end - 1 for s in spans]  # every paragraph of a clean trace closes with '.\n\n'
    assert len(cuts) >= 3


@pytest.mark.slow  # every boundary of three trajectories; the paper-reading test below covers the first three
def test_acc_is_teacher_forced_on_the_answer_tokens(synthetic_lm):
  problems, prompts, responses, answers = _thinking_set(synthetic_lm, 3)
  prober = Prober(synthetic_lm, ProbeConfig(samples=2, max_tokens=4))
  pots = prober.potentials(prompts, responses, answers, [0, 1, 2])
  tok = synthetic_lm.tokenizer
  suffix = tok(ANSWER_OPENER, add_special_tokens=False)["input_ids"]
  for p, r, a, pot in zip(prompts, responses, answers, pots):
    y = tok(a, add_special_tokens=False)["input_ids"]
    for c, cut in enumerate(pot.cuts):
      ctx = list(p) + r[: cut + 1] + suffix
      lp = _log_softmax(_logits(synthetic_lm, ctx + y))
      want = np.mean([np.exp(lp[len(ctx) - 1 + m, y[m]]) for m in range(len(y))])
      np.testing.assert_allclose(pot.acc[c], want, rtol=2e-4, atol=1e-6)


def _greedy_path(lm, ctx, close, max_tokens):
  """The near-greedy continuation (T -> 0) of ctx up to and including the first token that holds '}'."""
  eos = lm.tokenizer.eos_token_id
  out = []
  for _ in range(max_tokens):
    t = int(np.argmax(_logits(lm, ctx + out)[-1]))
    out.append(t)
    if close[t] or t == eos:
      break
  return out


def _entropy(p):
  return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0))


@pytest.mark.parametrize("reading", ["paper", "reference_code"])
def test_conf_and_acc_against_a_direct_forward_of_the_sampled_path(synthetic_lm, reading):
  # At a tiny temperature every sample follows the argmax path, which a direct forward recomputes.
  problems, prompts, responses, answers = _thinking_set(synthetic_lm, 2)
  cfg = ProbeConfig(samples=3, max_tokens=6, temperature=1e-6, reading=reading, top_logprobs=20)
  prober = Prober(synthetic_lm, cfg)
  pots = prober.potentials(prompts, responses, answers, [5, 6])
  tok = synthetic_lm.tokenizer
  suffix = tok(ANSWER_OPENER, add_special_tokens=False)["input_ids"]
  close = np.asarray(prober.close_rule.fires)
  for p, r, a, pot in zip(prompts, responses, answers, pots):
    y = tok(a, add_special_tokens=False)["input_ids"]
    for c, cut in enumerate(pot.cuts[:3]):
      ctx = list(p) + r[: cut + 1] + suffix
      path = _greedy_path(synthetic_lm, ctx, close, cfg.max_tokens)
      lp = _log_softmax(_logits(synthetic_lm, ctx + path))[len(ctx) - 1 : len(ctx) - 1 + len(path)]  # [L, V]
      probs = np.exp(lp)
      if reading == "paper":
        want_conf = np.exp(-np.mean([_entropy(q) for q in probs]))
        lp_y = _log_softmax(_logits(synthetic_lm, ctx + y))
        want_acc = np.mean([np.exp(lp_y[len(ctx) - 1 + m, y[m]]) for m in range(len(y))])
      else:  # the released script: top-20 lists of the sampled positions, unnormalised
        k = min(len(y), len(path))
        lps, hs = [], []
        for j in range(k):
          top = np.argsort(-probs[j])[:20]
          lps.append(lp[j, y[j]] if y[j] in top else -10.0)
          hs.append(_entropy(probs[j][top]))
        want_acc = np.exp(np.sum(lps)) / k
        want_conf = np.exp(-np.sum(hs)) / k
      np.testing.assert_allclose(pot.conf[c], want_conf, rtol=2e-3, atol=1e-6)
      np.testing.assert_allclose(pot.acc[c], want_acc, rtol=2e-3, atol=1e-6)


@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_a_trajectory_alone_equals_it_in_a_batch(synthetic_lm):
  problems, prompts, responses, answers = _thinking_set(synthetic_lm, 5)
  cfg = ProbeConfig(samples=3, max_tokens=5, temperature=1.0, batch_size=4)
  prober = Prober(synthetic_lm, cfg)
  seeds = [10, 11, 12, 13, 14]
  batch = prober.potentials(prompts, responses, answers, seeds)
  for i in (0, 3, 4):
    alone = prober.potentials([prompts[i]], [responses[i]], [answers[i]], [seeds[i]])[0]
    np.testing.assert_array_equal(alone.cuts, batch[i].cuts)
    np.testing.assert_allclose(alone.conf, batch[i].conf, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(alone.acc, batch[i].acc, rtol=1e-4, atol=1e-7)
  # another seed draws other continuations (Conf moves), the teacher-forced Acc does not
  other = prober.potentials([prompts[0]], [responses[0]], [answers[0]], [99])[0]
  assert not np.allclose(other.conf, batch[0].conf)
  np.testing.assert_allclose(other.acc, batch[0].acc, rtol=1e-4, atol=1e-7)


def test_bad_input_is_refused_before_any_work(synthetic_lm):
  problems, prompts, responses, answers = _thinking_set(synthetic_lm, 2)
  prober = Prober(synthetic_lm)
  tok = synthetic_lm.tokenizer
  no_think = tok("Step 1: 3 + 4 = 7.\n\nSo the answer is 7.\n\n", add_special_tokens=False)["input_ids"]
  with pytest.raises(DataFormatError, match=r"t1 has no <think>"):
    prober.potentials(prompts, [responses[0], no_think], answers, [0, 1], names=["t0", "t1"])
  with pytest.raises(DataFormatError, match=r"answer 1 \(''\) tokenizes to no tokens"):
    prober.potentials(prompts, responses, [answers[0], ""], [0, 1])
  with pytest.raises(ConfigError, match="one of each per trajectory"):
    prober.potentials(prompts, responses, answers, [0])
  long_prompt = list(prompts[0]) * (synthetic_lm.config.max_position_embeddings // len(prompts[0]))
  with pytest.raises(CacheFullError, match="probe suffix"):
    prober.potentials([long_prompt, prompts[1]], responses, answers, [0, 1])
  with pytest.raises(ConfigError, match="reading"):
    ProbeConfig(reading="top20")
  empty = prober.potentials(prompts[:1], [responses[0][:3]], answers[:1], [0])[0]  # '<think>' and no boundary
  assert len(empty) == 0 and empty.first_saturated is None
  state = prober.teacher_forced_state(prompts, responses)  # 2 rows
  ans = prober.answer_ids(answers)
  cuts = np.zeros((2, 1), np.int32)
  with pytest.raises(ConfigError, match=r"probe_state: cuts \[B, C\] and ordinals"):
    prober.probe_state(state, cuts[:1], cuts[:1], ans[:1], [0])  # one cut row for two state rows
  with pytest.raises(ConfigError, match="probe_state: cuts"):
    prober.probe_state(state, cuts, np.zeros((2, 2), np.int32), ans, [0, 1])
  with pytest.raises(ConfigError, match="probe_state: cuts"):
    prober.probe_state(state, cuts.astype(np.float32), cuts, ans, [0, 1])
  with pytest.raises(ConfigError, match="1 answers and 2 seeds for 2 rows"):
    prober.probe_state(state, cuts, cuts, ans[:1], [0, 1])


def test_step_potentials_record():
  pot = StepPotentials.of([3, 9, 14], [0.1, 1.0, 1.0], [0.2, 0.9, 1.0])
  np.testing.assert_allclose(pot.phi, [1.5 * 0.02 + 0.05 - 0.2, 1.35 + 0.5 - 0.9, 1.0])
  assert pot.saturated.tolist() == [False, True, True] and pot.first_saturated == 1


# ------------------------------------------------------------------------------------------- decoding


@pytest.fixture(scope="module")
def memoriser(tmp_path_factory):
  """A tiny Llama trained for a few seconds to write the thinking traces of four problems."""
  from reprobe_jax.models import ModelConfig, load_pretrained
  from reprobe_jax.synthetic.tokenizer import build_tokenizer, chat_prompt
  from reprobe_jax.synthetic.train_lm import TrainLMConfig, encode_examples, train_lm

  problems = make_problems("arithmetic", 4, 21, 1)
  traces = solve_many(problems, "thinking", 0, TraceNoise.clean())
  pairs = [(user_prompt(p, "thinking"), t.text) for p, t in zip(problems, traces)]
  tok = build_tokenizer([q + a for q, a in pairs], 400)
  data = encode_examples(tok, [(chat_prompt(tok, q), a) for q, a in pairs], (128, 192), prompt_weight=0.0)
  cfg = ModelConfig(
    family="llama",
    vocab_size=len(tok),
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=32,
    tie_word_embeddings=True,
    max_position_embeddings=512,
    bos_token_id=tok.bos_token_id,
    eos_token_ids=(tok.eos_token_id,),
    pad_token_id=tok.pad_token_id,
  )
  d = tmp_path_factory.mktemp("memoriser")
  opt = dataclasses.replace(TrainLMConfig().optimizer, learning_rate=1e-2, warmup_steps=10)
  lm, losses = train_lm(
    cfg, data, TrainLMConfig(steps=200, batch_size=4, optimizer=opt, checkpoint_every=1000), str(d / "train")
  )
  lm.tokenizer = tok
  lm.save_pretrained(str(d / "model"))
  prompts = [chat_prompt(tok, q) for q, _ in pairs]
  return load_pretrained(str(d / "model")), problems, prompts, [t.text for t in traces]


def _decode(lm, problems, prompts, eps_sat, truncate, temperature=0.0, samples=1):
  prober = Prober(lm, ProbeConfig(samples=2, max_tokens=4, eps_sat=eps_sat))
  ids = lm.encode(prompts)
  return (
    prober,
    ids,
    decode_thinking(
      lm,
      prober,
      ids,
      [p.answer for p in problems],
      [7, 8, 9, 10][: len(ids)],
      sampling=SamplingParams(temperature),
      max_new_tokens=96,
      samples=samples,
      truncate=truncate,
    ),
  )


@pytest.mark.slow  # trains the memoriser (about a minute) and decodes with probing
def test_the_memoriser_writes_its_traces(memoriser):
  lm, problems, prompts, texts = memoriser
  _, _, rows = _decode(lm, problems, prompts, 0.9, False)
  got = [lm.tokenizer.decode(list(r.response_ids)) for r in rows]
  # What the decoding tests assume: thinking that opens like the traces and passes at least two boundaries.
  assert all(g.startswith("<think>\nStep 1:") for g in got), got
  assert all(len(r.potentials) >= 2 for r in rows), got
  assert sum(g == t for g, t in zip(got, texts)) >= 1, got


@pytest.mark.slow  # trains the memoriser (about a minute) and decodes with probing
def test_plain_decoding_probes_every_boundary_as_the_post_hoc_prober_does(memoriser):
  lm, problems, prompts, _ = memoriser
  prober, ids, rows = _decode(lm, problems, prompts, 0.9, False, temperature=1.0, samples=2)
  assert all(r.truncated_at is None for r in rows)
  post = prober.potentials(
    [ids[r.prompt_index] for r in rows],
    [list(r.response_ids) for r in rows],
    [problems[r.prompt_index].answer for r in rows],
    [trajectory_seed([7, 8, 9, 10][r.prompt_index], r.sample, 2) for r in rows],
  )
  assert sum(len(p) for p in post) >= 8
  for r, p in zip(rows, post):
    np.testing.assert_array_equal(r.potentials.cuts, p.cuts)
    np.testing.assert_allclose(r.potentials.acc, p.acc, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(r.potentials.conf, p.conf, rtol=1e-3, atol=1e-6)


@pytest.mark.slow  # trains the memoriser (about a minute) and decodes with probing
def test_truncation_equals_decoding_the_truncated_prefix_and_think_close(memoriser):
  lm, problems, prompts, _ = memoriser
  tok = lm.tokenizer
  close = tok("</think>", add_special_tokens=False)["input_ids"]
  _, ids, plain = _decode(lm, problems, prompts, -1.0, False)
  _, _, cut = _decode(lm, problems, prompts, -1.0, True)  # every boundary saturates: truncate at the first
  checked = 0
  for p, t in zip(plain, cut):
    if t.truncated_at is None:
      assert len(p.potentials) == 0
      continue
    assert t.truncated_at == 0 and len(t.potentials) == 1
    k = int(t.potentials.cuts[0])
    assert k == int(p.potentials.cuts[0])
    assert list(t.response_ids[: k + 1]) == list(p.response_ids[: k + 1])
    assert list(t.response_ids[k + 1 : k + 1 + len(close)]) == close
    direct = lm.generate(
      [list(ids[t.prompt_index]) + list(p.response_ids[: k + 1]) + close],
      SamplingParams(0.0),
      max_new_tokens=96 - (k + 1 + len(close)),
    )
    want = [x for x in direct.token_ids(0) if x != tok.eos_token_id]
    assert list(t.response_ids[k + 1 + len(close) :]) == want
    assert len(t.potentials) < len(p.potentials)  # the plain row went on past its first boundary
    checked += 1
  assert checked >= 3


@pytest.mark.slow  # trains the memoriser (about a minute) and decodes with probing
def test_decoding_refuses_bad_input(memoriser):
  lm, problems, prompts, _ = memoriser
  prober = Prober(lm)
  ids = lm.encode(prompts[:1])
  with pytest.raises(ConfigError, match="one of each per prompt"):
    decode_thinking(lm, prober, ids, ["3", "4"], [0], sampling=SamplingParams(0.0), max_new_tokens=16)
  with pytest.raises(CacheFullError, match="max_position_embeddings"):
    decode_thinking(lm, prober, ids, ["3"], [0], sampling=SamplingParams(0.0), max_new_tokens=510)
