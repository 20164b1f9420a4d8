"""The probe module of docs/method.md §A4: size, batched scoring, masking; one compiled inference path; the saved
bundle."""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from reprobe_jax.errors import CheckpointError, ConfigError
from reprobe_jax.io import write_seal
from reprobe_jax.features import FeatureMismatchError, FeatureSpec
from reprobe_jax.models.safetensors_io import SafetensorsFile, write_safetensors
from reprobe_jax.probe import (
  Probe,
  ProbeBundle,
  ProbeConfig,
  abstract_probe,
  count_params,
  load_probe,
  save_probe,
  score_steps,
)


def test_paper_probe_has_fewer_than_10m_parameters():
  probe = nnx.eval_shape(lambda: Probe(ProbeConfig(feature_dim=4096), rngs=nnx.Rngs(0)))
  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(probe, nnx.Param)))
  # Linear(4096,1024)+LN+Linear(1024,512)+LN, marker (2,512), 1 post-LN layer (attn 4x512^2, FFN 2x512x2048),
  # classifier Linear(512,512)+LN+Linear(512,1): about 8.1M.
  expected = (
    4096 * 1024
    + 1024
    + 2 * 1024
    + 1024 * 512
    + 512
    + 2 * 512
    + 2 * 512
    + 4 * (512 * 512 + 512)
    + 2 * 512
    + 512 * 2048
    + 2048
    + 2048 * 512
    + 512
    + 2 * 512
    + 512 * 512
    + 512
    + 2 * 512
    + 512
    + 1
  )
  assert n == expected
  assert n < 10_000_000


def _setup(seed=0):
  cfg = ProbeConfig(feature_dim=12, d_model=32, n_layers=2, n_heads=4, ff_dim=64, dropout=0.1)
  probe = Probe(cfg, rngs=nnx.Rngs(seed))
  graphdef, params = nnx.split(probe)
  rng = np.random.RandomState(seed)
  feats = jnp.asarray(rng.randn(2, 20, 12), jnp.float32)
  mask = jnp.asarray(np.arange(20)[None] < np.array([[20], [15]]))
  spans = jnp.asarray([[[1, 6], [6, 12], [12, 20]], [[1, 5], [5, 15], [0, 0]]], jnp.int32)
  return probe, graphdef, params, feats, mask, spans


def test_batched_scores_equal_one_step_at_a_time():
  _, graphdef, params, feats, mask, spans = _setup()
  all_steps = np.asarray(score_steps(graphdef, params, feats, mask, spans))
  for b in range(2):
    for s in range(2):
      one = score_steps(graphdef, params, feats[b : b + 1], mask[b : b + 1], spans[b : b + 1, s : s + 1])
      np.testing.assert_allclose(all_steps[b, s], np.asarray(one)[0, 0], atol=1e-5)
  assert np.all((all_steps > 0) & (all_steps < 1))


def test_a_step_does_not_see_what_follows_it_or_padding():
  _, graphdef, params, feats, mask, spans = _setup()
  base = np.asarray(score_steps(graphdef, params, feats, mask, spans))
  changed = feats.at[:, 12:].set(99.0)  # after the second step of row 0, and padding of row 1 past 15
  after = np.asarray(score_steps(graphdef, params, changed, mask, spans))
  np.testing.assert_allclose(after[0, :2], base[0, :2], atol=1e-5)
  assert not np.allclose(after[0, 2], base[0, 2])  # the third step contains those tokens
  padded = feats.at[1, 15:].set(-50.0)
  np.testing.assert_allclose(
    np.asarray(score_steps(graphdef, params, padded, mask, spans))[1, :2], base[1, :2], atol=1e-5
  )


def test_packed_steps_score_what_the_padded_layout_scores():
  """pack_steps + Probe.packed (what training and evaluation run) against the padded reference `score_steps`:
  windows of several trajectories share rows, steps with no tokens get no window, unknown labels are left out of
  a labelled-only pack, and dropout draws per packed slot only in training."""
  from reprobe_jax.probe.data import Example, collate, pack_shape, pack_steps
  from reprobe_jax.probe.model import score_packed

  probe, graphdef, params, *_ = _setup()
  rng = np.random.default_rng(3)
  exs = []
  for i in range(6):
    n = int(rng.integers(4, 30))
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(3, n - 1), replace=False))
    b = np.r_[0, cuts, n]
    spans = np.stack([b[:-1], b[1:]], 1).astype(np.int32)
    spans = np.concatenate([spans, [[n, n]]]).astype(np.int32)  # a step with no tokens
    labels = rng.integers(0, 2, len(spans)).astype(np.float32)
    labels[0], labels[-1] = np.nan, np.nan
    exs.append(Example(f"e{i}", "arithmetic", rng.normal(size=(n, 12)).astype(np.float32), spans, labels))
  c = collate(exs, 8, 12)
  ref = np.asarray(
    score_steps(graphdef, params, jnp.asarray(c["features"]), jnp.asarray(c["token_mask"]), jnp.asarray(c["spans"]))
  )
  shape = pack_shape([exs], 8, labelled_only=False)
  feats, pack, labels, chosen = pack_steps(exs, shape, 12, labelled_only=False)
  assert shape.rows * shape.slots < 8 * c["spans"].shape[1] * c["features"].shape[1]  # less compute than padded
  assert len(chosen) == sum(len(e.spans) - 1 for e in exs)  # every step but the empty ones
  got = np.asarray(score_packed(graphdef, params, jnp.asarray(feats), jax.tree.map(jnp.asarray, pack)))
  for p, (i, k) in enumerate(chosen):
    np.testing.assert_allclose(got[p], ref[i, k], atol=1e-5)
    np.testing.assert_array_equal(labels[p], exs[i].labels[k])
  assert np.all(np.isnan(labels[len(chosen) :]))
  lab_shape = pack_shape([exs], 8, labelled_only=True)
  _, _, lab, lab_chosen = pack_steps(exs, lab_shape, 12, labelled_only=True)
  assert [ik for ik in chosen if not np.isnan(exs[ik[0]].labels[ik[1]])] == lab_chosen
  assert not np.any(np.isnan(lab[: len(lab_chosen)]))
  jpack = jax.tree.map(jnp.asarray, pack)
  a = probe.packed(jnp.asarray(feats), jpack, deterministic=False, rngs=nnx.Rngs(dropout=0))
  b = probe.packed(jnp.asarray(feats), jpack, deterministic=False, rngs=nnx.Rngs(dropout=0))
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert not np.allclose(np.asarray(a)[: len(chosen)], got[: len(chosen)])


def test_windows_packed_on_device_score_what_the_padded_layout_scores():
  """`probe.windows.score_windows` (each step's window [0, end) packed on device, from spans on device, a chunk of
  rows at a time) against the padded reference `score_steps`: steps with no tokens and padding steps score NaN, short
  windows share a packed row, and one trajectory whose windows fill three rows takes three chunks."""
  from reprobe_jax.probe.windows import score_windows, window_plan

  _, graphdef, params, *_ = _setup()
  rng = np.random.default_rng(4)
  cases = []
  for b, t, s in ((4, 64, 8), (3, 32, 4)):
    spans, lengths = np.zeros((b, s, 2), np.int32), rng.integers(1, t + 1, b)
    for i, n in enumerate(lengths):
      bounds = np.r_[0, np.sort(rng.integers(0, n + 1, s - 1)), n]  # repeated bounds: steps with no tokens
      k = int(rng.integers(1, s + 1))
      spans[i, :k] = np.stack([bounds[:-1], bounds[1:]], 1)[:k]
    cases.append((spans, lengths, t))
  cases.append((np.asarray([[[0, 4], [4, 9], [9, 16], [16, 16]]], np.int32), np.asarray([16]), 16))
  for spans, lengths, t in cases:
    b = len(spans)
    feats = jnp.asarray(rng.normal(size=(b, t, 12)), jnp.float32)
    mask = jnp.asarray(np.arange(t)[None] < lengths[:, None])
    ref = np.asarray(score_steps(graphdef, params, feats, mask, jnp.asarray(spans)))
    got = np.asarray(score_windows(graphdef, params, feats, jnp.asarray(spans)))
    steps = spans[..., 1] > spans[..., 0]
    assert got.shape == spans.shape[:2] and np.isnan(got[~steps]).all()
    np.testing.assert_allclose(got[steps], ref[steps], atol=1e-5)
    assert int(window_plan(jnp.asarray(spans), t).rows) < steps.sum() or b == 1
  assert int(window_plan(jnp.asarray(spans), t).rows) == 3 and b == 1  # three chunks of one row


def test_dropout_only_in_training():
  probe, _, _, feats, mask, spans = _setup()
  a = probe(feats, mask, spans, deterministic=True)
  b = probe(feats, mask, spans, deterministic=True)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  c = probe(feats, mask, spans, deterministic=False, rngs=nnx.Rngs(dropout=0))
  assert not np.allclose(np.asarray(a), np.asarray(c))
  np.testing.assert_array_equal(
    np.asarray(probe(feats, mask, spans, deterministic=False, rngs=nnx.Rngs(dropout=0))), np.asarray(c)
  )  # dropout reads only the stream it is given
  assert count_params(probe) > 0


def test_probe_holds_parameters_only_and_one_graph_per_config():
  probe, graphdef, params, *_ = _setup()
  assert all(isinstance(v, nnx.Param) for _, v in nnx.to_flat_state(params))  # no dropout RNG state to carry
  graph, abstract = abstract_probe(probe.config)
  assert graph.value == graphdef and abstract_probe(probe.config)[0] is graph
  assert jax.tree.structure(abstract) == jax.tree.structure(params)


def test_predict_examples_compiles_once_per_shape():
  from reprobe_jax.probe.data import Example
  from reprobe_jax.probe.data import pack_shape
  from reprobe_jax.probe.model import _packed_probabilities
  from reprobe_jax.probe.train import new_probe, predict_examples

  cfg = ProbeConfig(feature_dim=6, d_model=16, n_layers=1, n_heads=2, ff_dim=32)
  rng = np.random.default_rng(0)

  def exs(n):  # 9..16 tokens, 2..4 steps: one (T=16, S=4) bucket
    out = []
    for i in range(n):
      t = int(rng.integers(9, 17))
      cut = sorted(rng.choice(np.arange(1, t), int(rng.integers(1, 4)), replace=False))
      b = np.r_[0, cut, t]
      out.append(
        Example(
          f"e{i}",
          "arithmetic",
          rng.normal(size=(t, 6)).astype(np.float32),
          np.stack([b[:-1], b[1:]], 1).astype(np.int32),
          np.zeros(len(b) - 1, np.float32),
        )
      )
    return out

  g, params, rest = new_probe(cfg, 0)
  first_ex, second_ex = exs(5), exs(7)
  chunks = lambda e: [e[s : s + 4] for s in range(0, len(e), 4)]
  # new examples that pack into the same shape (the shape is the precondition of "compiles nothing")
  assert pack_shape(chunks(first_ex), 4, labelled_only=False) == pack_shape(chunks(second_ex), 4, labelled_only=False)
  first = predict_examples(g, params, rest, first_ex, 4, 6)
  size = _packed_probabilities._cache_size()
  assert size >= 1
  g2, params2, rest2 = new_probe(cfg, 1)  # another probe of the same config
  second = predict_examples(g2, params2, rest2, second_ex, 4, 6)
  assert _packed_probabilities._cache_size() == size, "predict_examples compiled again for the same shapes"
  assert len(first) == 5 and len(second) == 7 and all(np.all((p > 0) & (p < 1)) for p in first + second)
  # the packed path gives what the padded reference path (score_steps) gives, step for step
  from reprobe_jax.probe.data import collate

  for e in chunks(second_ex):
    b = collate(e, 4, 6)
    direct = np.asarray(
      score_steps(g2, params2, jnp.asarray(b["features"]), jnp.asarray(b["token_mask"]), jnp.asarray(b["spans"]))
    )
    for i, p in enumerate(predict_examples(g2, params2, rest2, e, 4, 6)):
      np.testing.assert_allclose(p, direct[i, : len(e[i].spans)], atol=1e-6)


def _bundle(seed=0):
  probe, _, params, feats, mask, spans = _setup(seed)
  spec = FeatureSpec.from_name("hidden+logit", hidden_layers=(0, -1))
  return ProbeBundle.create(probe.config, params, spec, "abc123"), feats, mask, spans


def test_bundle_round_trip_is_exact(tmp_path):
  bundle, feats, mask, spans = _bundle()
  save_probe(bundle, str(tmp_path / "probe"))
  assert sorted(os.listdir(tmp_path / "probe")) == [
    "config.json",
    "config.json.sha256",
    "model.safetensors",
    "model.safetensors.sha256",
  ]
  meta = json.loads((tmp_path / "probe" / "config.json").read_text())
  assert meta["format_version"] == 2 and meta["model_fingerprint"] == "abc123" and meta["probe"]["d_model"] == 32
  back = load_probe(str(tmp_path / "probe"), model_fingerprint="abc123")
  assert back.config == bundle.config and back.features == bundle.features and back.model_fingerprint == "abc123"
  for (pa, a), (pb, b) in zip(nnx.to_flat_state(bundle.params), nnx.to_flat_state(back.params)):
    assert pa == pb
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()))
  np.testing.assert_array_equal(
    np.asarray(back.probabilities(feats, mask, spans)), np.asarray(bundle.probabilities(feats, mask, spans))
  )
  with pytest.raises(FeatureMismatchError, match="abc123"):
    load_probe(str(tmp_path / "probe"), model_fingerprint="other")


def test_load_probe_names_the_file_and_field(tmp_path):
  bundle, *_ = _bundle()
  good = tmp_path / "good"
  save_probe(bundle, str(good))
  meta = json.loads((good / "config.json").read_text())
  tensors = {
    k: SafetensorsFile(str(good / "model.safetensors")).get(k).copy()
    for k in SafetensorsFile(str(good / "model.safetensors")).keys()
  }

  def variant(name, meta_change=None, tensors_change=None):
    d = tmp_path / name
    shutil.copytree(good, d)
    if meta_change is not None:
      (d / "config.json").write_text(json.dumps(meta_change(json.loads(json.dumps(meta)))))
      write_seal(str(d / "config.json"))  # sealed again, so the field checks behind the seal are reached
    if tensors_change is not None:
      write_safetensors(str(d / "model.safetensors"), tensors_change(dict(tensors)))
      write_seal(str(d / "model.safetensors"))
    return str(d)

  def drop(m, *path):
    x = m
    for p in path[:-1]:
      x = x[p]
    del x[path[-1]]
    return m

  cases = [
    (variant("no_probe", lambda m: drop(m, "probe")), r"config.json: missing key 'probe'"),
    (variant("no_dim", lambda m: drop(m, "probe", "feature_dim")), r"missing key 'probe.feature_dim'"),
    (variant("extra_key", lambda m: {**m, "probe": {**m["probe"], "width": 3}}), r"unknown keys \['width'\]"),
    (variant("bad_type", lambda m: {**m, "probe": {**m["probe"], "n_heads": "4"}}), r"'probe.n_heads' must be an int"),
    (variant("bad_parts", lambda m: {**m, "features": {**m["features"], "parts": ["colour"]}}), r"'features'.*colour"),
    (variant("version", lambda m: {**m, "format_version": 9}), r"version 9"),
    (variant("missing_tensor", tensors_change=lambda t: drop(t, "cls2.bias")), r"missing tensors \['cls2.bias'\]"),
    (
      variant("extra_tensor", tensors_change=lambda t: {**t, "head.kernel": np.zeros(2, np.float32)}),
      r"unexpected tensors \['head.kernel'\]",
    ),
    (
      variant("shape", tensors_change=lambda t: {**t, "proj1.kernel": np.zeros((12, 65), np.float32)}),
      r"model.safetensors: tensor 'proj1.kernel' has shape \[12, 65\], the config expects \[12, 64\]",
    ),
    (
      variant("dtype", tensors_change=lambda t: {**t, "proj1.kernel": t["proj1.kernel"].astype(np.float16)}),
      r"tensor 'proj1.kernel' has dtype float16, expected float32",
    ),
  ]
  for path, match in cases:
    with pytest.raises(CheckpointError, match=match):
      load_probe(path)
  (tmp_path / "broken").mkdir()
  (tmp_path / "broken" / "config.json").write_text("{not json")
  (tmp_path / "broken" / "model.safetensors").write_bytes(b"")
  with pytest.raises(CheckpointError, match=r"config.json:1: probe config is not valid JSON"):
    load_probe(str(tmp_path / "broken"))
  with pytest.raises(CheckpointError, match="no config.json"):
    load_probe(str(tmp_path / "nothing"))
  with pytest.raises(ConfigError, match="missing tensors"):
    ProbeBundle.create(bundle.config, nnx.State({}), bundle.features)


def test_save_probe_failure_keeps_the_previous_save(tmp_path, monkeypatch):
  from reprobe_jax.probe import bundle as bundle_module

  bundle, *_ = _bundle()
  target = tmp_path / "probe"
  save_probe(bundle, str(target))
  before = {n: (target / n).read_bytes() for n in os.listdir(target)}

  def full_disk(path, tensors, metadata=None):
    with open(path, "wb") as f:
      f.write(b"\x00" * 10)
    raise OSError("No space left on device (simulated)")

  monkeypatch.setattr(bundle_module, "write_safetensors", full_disk)
  with pytest.raises(OSError, match="No space left"):
    save_probe(_bundle(1)[0], str(target))
  assert os.listdir(tmp_path) == ["probe"]
  assert {n: (target / n).read_bytes() for n in os.listdir(target)} == before
