"""Feature extraction (docs/method.md §A3): next-token alignment, sets, resumable shards, refusal of foreign shards."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from reprobe_jax.features import FeatureMismatchError, FeatureSpec, FeatureStore, extract, token_features, with_logprobs
from reprobe_jax.features import extraction as extract_mod
from reprobe_jax.models import CaptureSpec, LanguageModel, load_pretrained
from reprobe_jax.trajectories import Trajectory


@pytest.fixture(scope="module")
def lm(tiny_llama_dir):
  return load_pretrained(tiny_llama_dir)


def _record(tid, prompt_ids, response_ids):
  """A trajectory record with only what extraction reads: its id and token ids."""
  return Trajectory(tid, "", "", "line", (), prompt_ids=tuple(prompt_ids), response_ids=tuple(response_ids))


def _records(n=5, seed=0):
  rng = np.random.RandomState(seed)
  return [
    _record(f"t{i}", rng.randint(3, 90, rng.randint(3, 9)).tolist(), rng.randint(3, 90, rng.randint(2, 12)).tolist())
    for i in range(n)
  ]


def test_next_token_alignment_and_sets(lm):
  recs = _records()
  spec = FeatureSpec.from_name("hidden+attn+logit", hidden_layers=(0, -1))
  feats = token_features(lm, recs, spec, batch_size=4)
  L, H, D = lm.config.num_layers, lm.config.num_heads, lm.config.hidden_size
  assert spec.dim(lm.config) == 2 * D + 5 * H * L + 4 + 2
  for rec, f in zip(recs, feats):
    seq = np.asarray([rec.prompt_ids + rec.response_ids])
    ref = lm.forward(seq, capture=CaptureSpec(hidden_layers=(0, L), attn_window=5, top_k_probs=4))
    p, n = len(rec.prompt_ids), len(rec.response_ids)
    at = slice(p - 1, p - 1 + n)  # token j's features come from position j - 1
    assert f.shape == (n, spec.dim(lm.config))
    np.testing.assert_allclose(f[:, :D], np.asarray(ref.hidden_states[0])[0, at], atol=1e-5)
    np.testing.assert_allclose(f[:, D : 2 * D], np.asarray(ref.hidden_states[L])[0, at], atol=1e-4)
    np.testing.assert_allclose(f[:, 2 * D : -6], np.asarray(ref.attn_window)[0, at].reshape(n, -1), atol=1e-5)
    np.testing.assert_allclose(f[:, -6:-2], np.asarray(ref.top_probs)[0, at], atol=1e-5)
    # Then the token's own log-probability and the entropy of the distribution it came from, from the logits.
    z = np.asarray(ref.logits, np.float64)[0, at]
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    np.testing.assert_allclose(f[:, -2], logp[np.arange(n), list(rec.response_ids)], atol=1e-4)
    np.testing.assert_allclose(f[:, -1], -(np.exp(logp) * logp).sum(-1), atol=1e-4)
  # The top-4 probabilities of token j's feature are those of the distribution that sampled it.
  logp = np.log(np.asarray(ref.top_probs)[0, p - 1, 0])
  assert logp <= 0


def test_extraction_resumes_and_refuses_foreign_shards(lm, tmp_path, monkeypatch):
  recs = _records(7, seed=1)
  spec = FeatureSpec.from_name("hidden")
  whole = extract(lm, recs, spec, str(tmp_path / "a"), shard_size=2, batch_size=2)
  real = extract_mod.token_features
  calls = {"n": 0}

  def dies_on_third_shard(*a, **k):
    calls["n"] += 1
    if calls["n"] == 3:
      raise KeyboardInterrupt
    return real(*a, **k)

  monkeypatch.setattr(extract_mod, "token_features", dies_on_third_shard)
  with pytest.raises(KeyboardInterrupt):
    extract(lm, recs, spec, str(tmp_path / "b"), shard_size=2, batch_size=2)
  assert not [f for f in os.listdir(tmp_path / "b") if f.endswith(".tmp")]
  assert len(FeatureStore(str(tmp_path / "b")).ids) == 4  # two finished shards survive
  monkeypatch.setattr(extract_mod, "token_features", real)
  resumed = extract(lm, recs, spec, str(tmp_path / "b"), shard_size=2, batch_size=2)
  assert sorted(resumed.ids) == sorted(whole.ids) == sorted(r.id for r in recs)
  for tid in whole.ids:
    np.testing.assert_array_equal(resumed[tid], whole[tid])
  assert resumed.manifest["complete"] and resumed.manifest["counts"]["trajectories"] == 7
  with pytest.raises(FeatureMismatchError, match="spec"):
    extract(lm, recs, FeatureSpec.from_name("attn+logit"), str(tmp_path / "b"))
  other = LanguageModel.random(lm.config, seed=3, tokenizer=lm.tokenizer)
  with pytest.raises(FeatureMismatchError, match="model_fingerprint"):
    extract(other, recs, spec, str(tmp_path / "b"))
  with pytest.raises(FeatureMismatchError, match="model_fingerprint"):
    FeatureStore(str(tmp_path / "b"), expect={"model_fingerprint": "0" * 16})


def test_sampler_captured_features_equal_teacher_forced(lm, tmp_path):
  """Features the sampler records while generating (left-padded prompts of different lengths, rows that finish
  early on a stop token) equal the teacher-forced extraction of the same tokens, for every feature set, and a store
  filled from them runs no forward."""
  from reprobe_jax.models import SamplingParams
  from reprobe_jax.features import union_capture

  specs = [
    FeatureSpec.from_name("hidden", hidden_layers=(-1, 1)),
    FeatureSpec.from_name("attn+logit"),
    FeatureSpec.from_name("hidden+attn+logit", hidden_layers=(0,), attn_window=3, top_k=2),
  ]
  prompts = [[1, 5, 6, 7, 8, 9, 10, 11], [1, 20], [1, 30, 31, 32]]
  g = lm.generate(
    prompts,
    SamplingParams(2.0),
    max_new_tokens=14,
    n=2,
    seed=7,
    stop_strings=(".\n", "\n\n"),
    capture=union_capture(specs),
  )
  assert len(set(g.lengths.tolist())) > 1, "every row ran to the same length: no early finish was tested"
  recs = [_record(f"r{r}", prompts[g.prompt_index[r]], g.token_ids(r)) for r in range(len(g.lengths))]
  for spec in specs:
    sampled = np.asarray(spec.assemble(with_logprobs(g.features, g.logprobs), lm.config.num_layers))  # [R, N, F]
    forced = token_features(lm, recs, spec, batch_size=4)
    for r, ref in enumerate(forced):  # 1e-5 of the tensor's scale (hidden states of this random model reach ~20)
      np.testing.assert_allclose(
        sampled[r, : len(ref)], ref, atol=1e-5 * max(1.0, np.abs(ref).max()), err_msg=f"{spec.name} row {r}"
      )
  spec = specs[1]
  sampled = np.asarray(spec.assemble(with_logprobs(g.features, g.logprobs), lm.config.num_layers))
  captured = {rec.id: sampled[r, : len(rec.response_ids)] for r, rec in enumerate(recs)}
  calls = []
  real = extract_mod.token_features
  try:
    extract_mod.token_features = lambda *a, **k: calls.append(len(a[1])) or real(*a, **k)
    store = extract(lm, recs, spec, str(tmp_path / "s"), shard_size=4, captured=captured)
  finally:
    extract_mod.token_features = real
  assert sum(calls) == 0, "a store filled from captured features ran the model"
  for rec in recs:
    np.testing.assert_allclose(store[rec.id], captured[rec.id], atol=0)
  with pytest.raises(FeatureMismatchError, match="captured features have shape"):
    extract(lm, recs[:1], spec, str(tmp_path / "t"), captured={recs[0].id: np.zeros((1, 3), np.float32)})


def test_resume_refuses_features_made_from_other_tokens(lm, tmp_path):
  recs = _records(3, seed=2)
  extract(lm, recs, FeatureSpec.from_name("hidden"), str(tmp_path / "a"), shard_size=2)
  changed = list(recs)
  changed[1] = dataclasses.replace(recs[1], response_ids=recs[1].response_ids[:-1] + (91,))  # same id, another response
  with pytest.raises(FeatureMismatchError, match="trajectory 't1'.*other tokens"):
    extract(lm, changed, FeatureSpec.from_name("hidden"), str(tmp_path / "a"), shard_size=2)
