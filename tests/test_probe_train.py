"""Probe training (docs/method.md §A5): the loss, learning a separable signal, early stopping, exact resume after a
kill."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from reprobe_jax.errors import CheckpointError, ConfigError
from reprobe_jax.models import make_mesh
from reprobe_jax.probe import ProbeConfig
from reprobe_jax.probe.data import Example
from reprobe_jax.train.tblog import read_scalars
from reprobe_jax.probe.train import ProbeTrainConfig, evaluate_examples, predict_examples, train_probe, weighted_bce

F = 8


def _examples(n, seed):
  """Steps whose tokens carry +1 on feature 0 when wrong, -1 when right, plus noise."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    n_steps = int(rng.integers(1, 5))
    lengths = rng.integers(2, 6, n_steps)
    ends = np.cumsum(lengths)
    spans = np.stack([ends - lengths, ends], 1).astype(np.int32)
    labels = (rng.random(n_steps) < 0.3).astype(np.float32)
    labels[rng.random(n_steps) < 0.1] = np.nan
    feats = rng.normal(0, 1, (ends[-1], F)).astype(np.float32)
    for (a, b), y in zip(spans, labels):
      feats[a:b, 0] += 1.5 if y == 1 else -1.5
    out.append(Example(f"x{seed}-{i}", "arithmetic", feats, spans, labels))
  return out


def test_weighted_bce_worked_example():
  import jax.numpy as jnp

  z = jnp.array([[0.0, 2.0, np.nan]])
  y = jnp.array([[1.0, 0.0, np.nan]])
  # known: (w * log 2) for the positive at z=0, and log(1 + e^2) for the negative at z=2; mean over 2
  expected = (3 * np.log(2) + np.log1p(np.exp(2.0))) / 2
  assert float(weighted_bce(jnp.nan_to_num(z), y, 3.0)) == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_probe_learns_and_resumes_exactly(tmp_path):
  train, val = _examples(96, 0), _examples(48, 1)
  cfg = ProbeConfig(feature_dim=F, d_model=16, n_layers=1, n_heads=2, ff_dim=32, dropout=0.1)
  tcfg = ProbeTrainConfig(
    batch_size=16, epochs=4, optimizer=dataclasses.replace(ProbeTrainConfig().optimizer, learning_rate=3e-3)
  )
  g, best, rest, hist = train_probe(cfg, train, val, tcfg, str(tmp_path / "a"))
  scores = predict_examples(g, best, rest, val, 16, F)
  m = evaluate_examples(scores, val)
  assert m["pr_auc"] > 0.9 and m["roc_auc"] > 0.9, m
  assert max(h["val_pr_auc"] for h in hist) == pytest.approx(m["pr_auc"])  # the best epoch is kept
  # TensorBoard scalars, read back through TensorBoard's own event protos: one validation PR-AUC per epoch.
  logged = read_scalars(str(tmp_path / "a" / "tb"))
  assert [v for _, v in logged["val/pr_auc"]] == pytest.approx([h["val_pr_auc"] for h in hist])
  assert [s for s, _ in logged["val/pr_auc"]] == [6 * (e + 1) for e in range(4)]  # 96 / 16 steps per epoch
  assert len(logged["train/loss"]) == 24 // 10 and all(np.isfinite(v) for _, v in logged["train/loss"])

  class Killed(Exception):
    pass

  def kill_after_epoch_1(epoch, entry):
    if epoch == 1:
      raise Killed

  with pytest.raises(Killed):
    train_probe(cfg, train, val, tcfg, str(tmp_path / "b"), on_epoch=kill_after_epoch_1)
  g2, best2, rest2, hist2 = train_probe(cfg, train, val, tcfg, str(tmp_path / "b"))
  assert hist2 == hist
  np.testing.assert_allclose(
    np.concatenate(predict_examples(g2, best2, rest2, val, 16, F)), np.concatenate(scores), atol=1e-6
  )


@pytest.mark.slow  # over 20 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_early_stopping(tmp_path):
  train, val = _examples(32, 2), _examples(16, 3)
  for e in val:  # validation labels unrelated to the features: no epoch improves after the first for long
    e.labels[:] = np.random.default_rng(0).random(len(e.labels)) < 0.5
  cfg = ProbeConfig(feature_dim=F, d_model=16, n_layers=1, n_heads=2, ff_dim=32)
  tcfg = ProbeTrainConfig(batch_size=16, epochs=30, patience=2)
  _, _, _, hist = train_probe(cfg, train, val, tcfg, str(tmp_path))
  assert len(hist) < 30
  assert not hist[-1]["improved"] and not hist[-2]["improved"]
  # The best epoch's checkpoint gone: the resumed run says so rather than hand back the last epoch's parameters.
  best_epoch = max(h["epoch"] for h in hist if h["improved"])
  shutil.rmtree(tmp_path / "train_state" / str((best_epoch + 1) * 2))  # 32 examples / 16 = 2 steps per epoch
  with pytest.raises(CheckpointError, match="best"):
    train_probe(cfg, train, val, tcfg, str(tmp_path))


def test_bad_trajectory_records_name_the_trajectory_and_step():
  from reprobe_jax.errors import DataFormatError
  from reprobe_jax.probe.data import examples

  class Store(dict):
    directory = "features/hidden"

  store = Store(t0=np.zeros((5, F), np.float32))

  def rec(**kw):
    base = {
      "id": "t0",
      "domain": "arithmetic",
      "response_ids": [1, 2, 3, 4, 5],
      "labels": [0, 1],
      "steps": [{"text": "12 + 5 = 17", "start": 0, "end": 3}, {"text": "<Answer>: 17", "start": 3, "end": 5}],
    }
    return {**base, **kw}

  assert examples([rec()], store)[0].labels.tolist() == [0.0, 1.0]
  cases = [
    (rec(labels=[0]), "t0': 1 labels for 2 steps"),
    (rec(steps=[{"text": " ", "start": 0, "end": 3}, {"text": "x", "start": 3, "end": 5}]), "step 0 is empty"),
    (
      rec(steps=[{"text": "a", "start": 0, "end": 3}, {"text": "b", "start": 3, "end": 9}]),
      r"steps\[1\] spans tokens \[3, 9\), past the response's 5 tokens",
    ),  # the record schema's check
    (rec(id="t9"), "'t9' has no stored features in features/hidden"),
    (rec(labels=None), "no labels"),
  ]
  for bad, match in cases:
    with pytest.raises(DataFormatError, match=match):
      examples([bad], store)


@pytest.mark.slow  # two probe trainings: over 30 s on 2 cores (the default suite must stay under 15 minutes)
def test_a_mesh_of_one_device_trains_the_same_probe_and_a_bad_mesh_is_refused(tmp_path):
  """mesh= puts the batches' rows on the data axis and the parameters on every device (on 8 devices:
  tests/test_sharded_dp.py); on a mesh of one device that is the same program, so the same parameters, bit for bit."""
  import jax

  train, val = _examples(16, 0), _examples(8, 1)
  cfg = ProbeConfig(feature_dim=F, d_model=8, n_layers=1, n_heads=2, ff_dim=8)
  tcfg = ProbeTrainConfig(batch_size=8, epochs=1)
  _, a, _, ha = train_probe(cfg, train, val, tcfg, str(tmp_path / "a"))
  g, b, rest, hb = train_probe(cfg, train, val, tcfg, str(tmp_path / "b"), mesh=make_mesh(data=1))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert ha == hb
  one = predict_examples(g, b, rest, val, 8, F)
  for x, y in zip(one, predict_examples(g, b, rest, val, 8, F, mesh=make_mesh(data=1)), strict=True):
    np.testing.assert_array_equal(x, y)
  with pytest.raises(ConfigError, match="mesh: expected a jax Mesh, a ShardingCtx or None, got str"):
    train_probe(cfg, train, val, tcfg, str(tmp_path / "c"), mesh="data")
