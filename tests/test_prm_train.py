"""The PRM trained here: the loss (worked example, masking), learning on a toy signal, batched scores
against one-at-a-time rewards, reuse and exact resume of a training folder, the pipeline's 'prm' row and step
scores, and bad configs that fail before anything is trained."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reprobe_jax.errors import CheckpointError, ConfigError
from reprobe_jax.jobs import reprobe as pipeline
from reprobe_jax.jobs.reprobe_config import (
  ProbeShape,
  ReprobeConfig,
  config_from_dict,
  prm_config_from_dict,
  prm_folder,
)
from reprobe_jax.jobs.reprobe_scores import write_step_scores
from reprobe_jax.prm.model import from_target, load_prm, rewards
from reprobe_jax.prm.train import PRMTrainConfig, history, prm_scores, step_loss, train_prm
from reprobe_jax.probe.train import ProbeTrainConfig
from reprobe_jax.trajectories import StepSpan, Trajectory, TrajectoryConfig, read_trajectories

SEP = "<|pad|>"
MARK = 40  # a step whose last token is MARK is incorrect in the toy data


@pytest.fixture(scope="module")
def lm(synthetic_lm):
  return synthetic_lm


def _trajs(n: int, seed: int, labelled: bool = True) -> list[Trajectory]:
  """Random prompts (4-11 tokens) and responses of 2-5 steps of 1-4 tokens; label 1 iff the step ends with
  MARK (half of them do), an unknown label now and then, a step without tokens in some."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    prompt = rng.integers(10, 200, rng.integers(4, 12)).tolist()
    tokens, steps, labels = [], [], []
    for k in range(rng.integers(2, 6)):
      width = 0 if (i % 5 == 0 and k == 1) else int(rng.integers(1, 5))
      bad = width > 0 and rng.random() < 0.5
      body = rng.integers(50, 200, width).tolist()
      if bad:
        body[-1] = MARK
      steps.append(StepSpan(f"s{k}", len(tokens), len(tokens) + width))
      tokens += body
      labels.append(float("nan") if width == 0 or (i + k) % 7 == 0 else float(bad))
    out.append(
      Trajectory(
        id=f"t{seed}-{i}",
        problem_id=f"p{i // 2}",
        domain="arithmetic",
        mode="line",
        steps=tuple(steps),
        prompt_ids=tuple(prompt),
        response_ids=tuple(tokens),
        labels=tuple(labels) if labelled else None,
      )
    )
  return out


CFG = PRMTrainConfig(
  separator=SEP,
  batch_size=8,
  epochs=3,
  patience=3,
  optimizer=dataclasses.replace(PRMTrainConfig().optimizer, learning_rate=1e-2, warmup_frac=0.1),
)


def test_loss_worked_example_masks_unknown_labels():
  # logits (index 1 = correct); labels 1 = incorrect -> class 0, 0 = correct -> class 1, NaN masked
  logits = jnp.asarray([[2.0, 0.0], [0.0, 1.0], [1e30, -1e30], [0.5, 0.5]])
  labels = jnp.asarray([1.0, 0.0, np.nan, 0.0])
  want = (2.0 * np.log1p(np.exp(-2.0)) + np.log1p(np.exp(-1.0)) + np.log(2.0)) / 3  # mean over the 3 known
  np.testing.assert_allclose(float(step_loss(logits, labels, 2.0)), want, rtol=1e-6)
  grad = jax.grad(lambda z: step_loss(z, labels, 2.0))(logits)
  assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad[2]) == 0.0)  # the masked step gets no gradient
  # the weighted two-class cross-entropy, written out
  z = np.asarray(logits, np.float64)[[0, 1, 3]]
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  ce = -np.array([2.0 * logp[0, 0], logp[1, 1], logp[2, 1]])
  np.testing.assert_allclose(float(step_loss(logits, labels, 2.0)), ce.mean(), rtol=1e-6)
  assert np.isclose(float(step_loss(logits, jnp.full(4, np.nan), 2.0)), 0.0)  # nothing known: 0, not NaN


def test_batched_scores_equal_one_trajectory_at_a_time(lm):
  prm = from_target(lm, separator_id=lm.tokenizer.get_vocab()[SEP], seed=3)
  trajs = _trajs(4, seed=5, labelled=False)
  got = prm_scores(prm, trajs, batch_size=3)
  for r, s in zip(trajs, got):
    one = rewards(
      prm,
      jnp.asarray([r.prompt_ids]),
      jnp.ones((1, len(r.prompt_ids)), bool),
      jnp.asarray([r.response_ids]),
      jnp.asarray([r.spans], jnp.int32).reshape(1, -1, 2),
    )
    want = 1.0 - np.asarray(one)[0]
    assert s.shape == (len(r.steps),)
    assert np.array_equal(np.isnan(s), np.isnan(want)) and np.isnan(s).any() == any(a == b for a, b in r.spans)
    np.testing.assert_allclose(s, want, atol=1e-5, equal_nan=True)


@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_training_learns_resumes_exactly_and_is_reused(lm, tmp_path, monkeypatch):
  train, val = _trajs(40, seed=1), _trajs(12, seed=2)
  whole = train_prm(lm, CFG, train, val, str(tmp_path / "whole"))
  h = history(str(tmp_path / "whole"))
  assert [e["epoch"] for e in h] == [0, 1, 2]
  assert h[-1]["train_loss"] < 0.8 * h[0]["train_loss"]
  assert h[-1]["val_pr_auc"] > 0.9  # the MARK token is a learnable signal
  # the saved folder loads with load_prm and records what it depends on
  with open(tmp_path / "whole" / "model" / "config.json") as f:
    recorded = json.load(f)["prm_training"]
  assert recorded["train_config"] == dataclasses.asdict(CFG) and set(recorded) == {
    "model_fingerprint",
    "train_config",
    "data_key",
  }
  loaded = load_prm(str(tmp_path / "whole" / "model"))
  np.testing.assert_allclose(
    np.concatenate(prm_scores(loaded, val, 8)), np.concatenate(prm_scores(whole, val, 8)), atol=1e-6
  )

  # killed after the first epoch, then rerun: the same PRM and history as the run that went through
  class Stop(Exception):
    pass

  def stop(epoch, entry):
    if epoch == 0:
      raise Stop

  with pytest.raises(Stop):
    train_prm(lm, CFG, train, val, str(tmp_path / "cut"), on_epoch=stop)
  assert not os.path.exists(tmp_path / "cut" / "model")
  resumed = train_prm(lm, CFG, train, val, str(tmp_path / "cut"))
  assert json.dumps(history(str(tmp_path / "cut"))) == json.dumps(h)
  for a, b in zip(jax.tree.leaves((resumed.params, resumed.head)), jax.tree.leaves((whole.params, whole.head))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  # a finished folder is loaded, not trained again; one trained on other data is refused
  monkeypatch.setattr("reprobe_jax.prm.train.Trainer.fit", lambda *a, **k: pytest.fail("trained again"))
  again = train_prm(lm, CFG, train, val, str(tmp_path / "whole"))
  np.testing.assert_array_equal(np.asarray(again.head.w2), np.asarray(whole.head.w2))
  with pytest.raises(CheckpointError, match="trained with"):
    train_prm(lm, CFG, train[:-1], val, str(tmp_path / "whole"))


def test_head_only_training_keeps_the_target_backbone(lm, tmp_path):
  cfg = dataclasses.replace(CFG, train_backbone=False, epochs=1)
  prm = train_prm(lm, cfg, _trajs(16, seed=1), _trajs(8, seed=2), str(tmp_path))
  start = from_target(lm, separator_id=prm.separator_id, seed=cfg.seed)
  for a, b in zip(jax.tree.leaves(prm.params), jax.tree.leaves(start.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert not np.array_equal(np.asarray(prm.head.w1), np.asarray(start.head.w1))


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("batch_size", 0, r"PRMTrainConfig\.batch_size: expected an int >= 1"),
    ("epochs", 1.5, r"PRMTrainConfig\.epochs"),
    ("patience", 0, r"PRMTrainConfig\.patience"),
    ("pos_weight", -1.0, r"PRMTrainConfig\.pos_weight"),
    ("train_backbone", 1, r"PRMTrainConfig\.train_backbone: expected one of True, False"),
    ("separator", "", r"PRMTrainConfig\.separator: expected a non-empty token string"),
  ],
)
def test_bad_config_fields_are_named(field, value, match):
  with pytest.raises(ConfigError, match=match):
    PRMTrainConfig(**{field: value})


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("learning_rate", 0.0, r"^config\.prm\.optimizer\.learning_rate: expected a finite number > 0"),
    ("warmup_frac", 1.0, r"^config\.prm\.optimizer\.warmup_frac: expected a finite number in \[0\.0, 1\.0\)"),
  ],
)
def test_bad_optimizer_fields_are_named(field, value, match):
  with pytest.raises(ConfigError, match=match):
    prm_config_from_dict({"enabled": True, "separator": SEP, "optimizer": {field: value}})


def test_cli_section_is_checked_and_named():
  assert prm_config_from_dict(None) is None
  assert prm_config_from_dict({"enabled": False, "epochs": 2}) is None
  cfg = prm_config_from_dict({"enabled": True, "separator": SEP, "epochs": 2})
  assert cfg == PRMTrainConfig(separator=SEP, epochs=2)
  for bad, match in (
    ({"enabled": "yes"}, r"config\.prm\.enabled: expected a bool"),
    ({"enabled": False, "epochs": 0}, r"config\.prm\.epochs: expected an int >= 1"),
    ({"enabled": True, "lr": 1.0}, r"config\.prm: unknown field\(s\) \['lr'\]"),
    ({"enabled": True, "batch_size": "8"}, r"config\.prm\.batch_size: expected an int"),
  ):
    with pytest.raises(ConfigError, match=match):
      prm_config_from_dict(bad)
  from configs import reprobe_smollm2, reprobe_synthetic

  c = reprobe_synthetic.get_config()
  assert prm_config_from_dict(c.prm).separator == SEP
  # the PRM section stays out of the ReProbe config, so the run folder keeps its key
  without = c.copy_and_resolve_references()
  del without["prm"]
  assert config_from_dict(c) == config_from_dict(without)
  smol = reprobe_smollm2.get_config().prm
  assert prm_config_from_dict(smol) is None  # off by default there: 65 of the job's 80 minutes
  smol.enabled = True
  assert prm_config_from_dict(smol).separator == "<file_sep>"
  a, b = prm_folder("run", cfg), prm_folder("run", dataclasses.replace(cfg, epochs=3))
  assert a.startswith(os.path.join("run", "prm", "")) and a != b and a == prm_folder("run", cfg)


def test_a_separator_the_tokenizer_lacks_fails_before_anything(lm, tmp_path):
  cfg = dataclasses.replace(CFG, separator="<extra_0>")
  with pytest.raises(ConfigError, match=r"PRMTrainConfig\.separator: the separator token '<extra_0>' is not in"):
    train_prm(lm, cfg, _trajs(4, seed=1), _trajs(4, seed=2), str(tmp_path / "prm"))
  with pytest.raises(ConfigError, match=r"config\.prm\.separator: the separator token '<extra_0>'"):
    pipeline.evaluate(lm, ReprobeConfig(), str(tmp_path / "run"), prm=cfg)
  assert os.listdir(tmp_path) == []


TINY = ReprobeConfig(
  train_problems=6,
  val_problems=3,
  test_problems=3,
  difficulties=(1,),
  feature_sets=("hidden",),
  trajectories=TrajectoryConfig(samples=2, max_new_tokens=32, batch_size=16),
  probe=ProbeShape(d_model=16, n_heads=2, ff_dim=32),
  train=ProbeTrainConfig(batch_size=8, epochs=1),
)


def test_step_scores_file_layout(tmp_path):
  val, test = _trajs(3, seed=1), _trajs(4, seed=2)
  test = [dataclasses.replace(r, domain=d) for r, d in zip(test, ("qa", "arithmetic", "qa", "planning"))]
  val_scores = {"prm": [np.arange(len(r.steps), dtype=np.float32) for r in val]}
  per = {
    d: np.concatenate([np.full(len(r.steps), i, np.float32) for i, r in enumerate(test) if r.domain == d])
    for d in ("arithmetic", "planning", "qa")
  }
  path = str(tmp_path / "s.npz")
  write_step_scores(path, val, val_scores, test, ["arithmetic", "planning", "qa"], {"prm": per})
  with np.load(path) as z:
    assert z["val/trajectory_id"].tolist() == [r.id for r in val for _ in r.steps]
    assert z["val/step"].tolist() == [k for r in val for k in range(len(r.steps))]
    np.testing.assert_array_equal(z["val/labels"], np.concatenate([r.label_array() for r in val]))
    np.testing.assert_array_equal(z["val/score/prm"], np.concatenate(val_scores["prm"]))
    order = [test[i] for i in (1, 3, 0, 2)]  # by domain, file order within each
    assert z["test/trajectory_id"].tolist() == [r.id for r in order for _ in r.steps]
    assert z["test/domain"].tolist() == [r.domain for r in order for _ in r.steps]
    assert z["test/problem_id"].tolist() == [r.problem_id for r in order for _ in r.steps]
    assert z["test/score/prm"].tolist() == [float(i) for i in (1, 3, 0, 2) for _ in test[i].steps]
    assert not z["test/answer"].any()


@pytest.mark.slow
def test_pipeline_scores_the_prm_beside_the_probes_and_keeps_step_scores(lm, tmp_path):
  prm_cfg = dataclasses.replace(CFG, epochs=1)
  events = []
  metrics = pipeline.evaluate(lm, TINY, str(tmp_path), prm=prm_cfg, progress=lambda *e: events.append(e[0]))
  assert "prm" in metrics["methods"] and "probe[hidden]" in metrics["methods"]
  assert set(metrics["methods"]["prm"]) >= {"arithmetic", "planning", "qa", "ood_mean_pr_auc"}
  assert any(e.startswith("prm") for e in events)
  folder = prm_folder(str(tmp_path), prm_cfg)
  assert metrics["prm_training"]["folder"] == os.path.relpath(folder, tmp_path)
  assert "prm" in (tmp_path / "table.md").read_text() and "prm" in metrics["timings_s"]
  # fusion rows (fitted on val) and the cascade from the probe best on val, in the table and as a PNG
  assert "fusion[hidden]" in metrics["methods"] and "Cascade from probe[" in (tmp_path / "table.md").read_text()
  assert set(metrics["prm_combined"]["cascades"]) == {"arithmetic", "planning", "qa"}
  assert (tmp_path / "cascade.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  trajs = {s: read_trajectories(tmp_path / f"trajectories_{s}.jsonl") for s in ("val", "test")}
  prm = load_prm(os.path.join(folder, "model"))
  with np.load(os.path.join(folder, "step_scores.npz")) as z:
    for split in ("val", "test"):
      n = sum(len(r.steps) for r in trajs[split])
      assert {f"{split}/score/prm", f"{split}/score/probe[hidden]"} <= set(z.files)
      for k in ("labels", "trajectory_id", "problem_id", "domain", "step", "answer", "score/prm"):
        assert z[f"{split}/{k}"].shape == (n,), (split, k)
    # the stored val scores are the PRM's; test is ordered by domain as the metrics read it
    np.testing.assert_allclose(z["val/score/prm"], np.concatenate(prm_scores(prm, trajs["val"], 8)), atol=1e-6)
    dom = z["test/domain"]
    assert list(dict.fromkeys(dom.tolist())) == ["arithmetic", "planning", "qa"]
    ours = np.asarray(z["test/score/prm"])[dom == "planning"]
    planning = [r for r in trajs["test"] if r.domain == "planning"]
    np.testing.assert_allclose(ours, np.concatenate(prm_scores(prm, planning, 8)), atol=1e-6)
  # a rerun of the stage reuses the PRM: no training, the same parameters
  events.clear()
  again = pipeline.train_prm_stage(lm, TINY, prm_cfg, str(tmp_path), progress=lambda *e: events.append(e[0]))
  assert not events and again.folder == folder and again.config == prm_cfg
  assert np.array_equal(np.asarray(again.model.head.w2), np.asarray(prm.head.w2))
