"""The one training loop: exact resume, metrics fetched every log_every steps, best checkpoint, patience."""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from reprobe_jax.errors import CheckpointError, ConfigError
from reprobe_jax.train.tblog import read_scalars
from reprobe_jax.train.trainer import Trainer, TrainerConfig, make_train_step

W_TRUE = np.array([1.5, -2.0, 0.5], np.float32)


def _batch(i: int) -> dict:
  rng = np.random.default_rng([7, i])
  x = rng.normal(size=(16, 3)).astype(np.float32)
  return {"x": jnp.asarray(x), "y": jnp.asarray(x @ W_TRUE + 0.3)}


def _loss(params, batch, rng, frozen):
  """Squared error on a random half of the rows (the key matters) scaled by `frozen` (it is passed through)."""
  keep = jax.random.bernoulli(rng, 0.5, batch["y"].shape)
  err = batch["x"] @ params["w"] + params["b"] - batch["y"]
  return frozen * jnp.sum(jnp.where(keep, err**2, 0.0)) / jnp.maximum(jnp.sum(keep), 1)


def _params():
  return {"w": jnp.zeros(3, jnp.float32), "b": jnp.zeros((), jnp.float32)}


class Killed(Exception):
  pass


def test_step_is_jitted_value_and_grad_and_update():
  tx = optax.sgd(0.1)
  step = make_train_step(_loss, tx)
  params, batch, key = _params(), _batch(0), jax.random.key(0)
  loss, grads = jax.value_and_grad(_loss)(params, batch, key, 2.0)
  new, _, m = step(_params(), tx.init(params), batch, key, 2.0)
  assert float(m["loss"]) == pytest.approx(float(loss))
  np.testing.assert_allclose(np.asarray(new["w"]), -0.1 * np.asarray(grads["w"]), rtol=1e-6)


def test_trains_and_resumes_exactly_after_a_kill(tmp_path):
  cfg = TrainerConfig(steps=12, seed=3, log_every=5, checkpoint_every=4)
  sched = optax.linear_schedule(0.3, 0.03, 12)
  whole = Trainer(_loss, optax.adam(sched), cfg, str(tmp_path / "a"), learning_rate=sched).fit(
    _params(), _batch, frozen=1.0
  )
  losses = whole.metrics["loss"]
  assert len(losses) == 12 and np.linalg.norm(np.asarray(whole.params["w"]) - W_TRUE) < 0.5 * np.linalg.norm(W_TRUE)
  logged = read_scalars(str(tmp_path / "a" / "tb"))
  assert [s for s, _ in logged["train/loss"]] == [5, 10]
  assert logged["train/loss"][1][1] == pytest.approx(np.mean(losses[5:10]))
  assert logged["train/learning_rate"][0][1] == pytest.approx(float(sched(4)))

  def kill_at_7(step, m):
    if step == 7:
      raise Killed

  with pytest.raises(Killed):
    Trainer(_loss, optax.adam(sched), cfg, str(tmp_path / "b"), on_step=kill_at_7).fit(_params(), _batch, frozen=1.0)
  seen = []
  resumed = Trainer(_loss, optax.adam(sched), cfg, str(tmp_path / "b"), on_step=lambda s, m: seen.append(s)).fit(
    _params(), _batch, frozen=1.0
  )
  assert seen == list(range(5, 13))  # resumed from the checkpoint at step 4
  assert resumed.metrics["loss"] == losses and resumed.step == 12
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Done: a third call trains nothing and returns the same parameters.
  again = Trainer(_loss, optax.adam(sched), cfg, str(tmp_path / "b"), on_step=lambda s, m: seen.append(-s)).fit(
    _params(), _batch, frozen=1.0
  )
  assert min(seen) > 0 and again.metrics["loss"] == losses
  np.testing.assert_array_equal(np.asarray(again.params["w"]), np.asarray(whole.params["w"]))


def test_metrics_stay_on_device_between_fetches(tmp_path):
  """The loop builds batches 0..3 before it reads step 1's loss: no host sync per step."""
  events = []

  def batches(i):
    events.append(f"batch {i}")
    return _batch(i)

  cfg = TrainerConfig(steps=8, log_every=4, checkpoint_every=100)
  Trainer(_loss, optax.sgd(0.05), cfg, str(tmp_path), on_step=lambda s, m: events.append(f"step {s}")).fit(
    _params(), batches, frozen=1.0
  )
  assert events == (
    [f"batch {i}" for i in range(4)]
    + [f"step {s}" for s in range(1, 5)]
    + [f"batch {i}" for i in range(4, 8)]
    + [f"step {s}" for s in range(5, 9)]
  )


def test_aux_metrics_are_logged(tmp_path):
  def loss_with_aux(params, batch, rng, frozen):
    loss = _loss(params, batch, rng, frozen)
    return loss, {"b": params["b"]}

  cfg = TrainerConfig(steps=4, log_every=2, checkpoint_every=4)
  r = Trainer(loss_with_aux, optax.sgd(0.1), cfg, str(tmp_path), has_aux=True).fit(_params(), _batch, frozen=1.0)
  assert set(r.metrics) == {"loss", "b"} and r.metrics["b"][0] == 0.0 and r.metrics["b"][-1] != 0.0
  assert [s for s, _ in read_scalars(str(tmp_path / "tb"))["train/b"]] == [2, 4]


def test_best_checkpoint_ties_patience_and_a_missing_best(tmp_path):
  """Scores 0.5, 0.7, 0.7 (a tie is no improvement), NaN, 0.6: patience 3 stops after the fifth evaluation, and
  the best parameters are those of the second, restored from orbax, which kept only it and the latest."""
  scores = iter([0.5, 0.7, 0.7, float("nan"), 0.6])
  at_eval = []

  def evaluate(params):
    at_eval.append(np.asarray(params["w"]).copy())
    return {"score": next(scores), "other": 1.0}

  cfg = TrainerConfig(steps=40, log_every=10, checkpoint_every=100, eval_every=2, best_metric="score", patience=3)
  workdir = str(tmp_path)
  r = Trainer(_loss, optax.sgd(0.05), cfg, workdir, evaluate=evaluate).fit(_params(), _batch, frozen=1.0)
  assert [h["improved"] for h in r.history] == [True, True, False, False, False]
  assert [h["step"] for h in r.history] == [2, 4, 6, 8, 10] and r.step == 10 and r.stopped_early
  assert r.history[1]["val_other"] == 1.0
  assert r.history[2]["train_loss"] == pytest.approx(np.mean(r.metrics["loss"][4:6]))
  np.testing.assert_array_equal(np.asarray(r.best_params["w"]), at_eval[1])
  assert not np.array_equal(np.asarray(r.params["w"]), at_eval[1])
  assert sorted(int(d) for d in os.listdir(os.path.join(workdir, "train_state")) if d.isdigit()) == [4, 10]
  logged = read_scalars(os.path.join(workdir, "tb"))
  assert [s for s, _ in logged["val/score"]] == [2, 4, 6, 10]  # the NaN is not written
  # Resuming a stopped run trains nothing and hands back the same best parameters.
  again = Trainer(_loss, optax.sgd(0.05), cfg, workdir, evaluate=evaluate).fit(_params(), _batch, frozen=1.0)
  assert json.dumps(again.history) == json.dumps(r.history) and again.step == 10  # (NaN != NaN)
  np.testing.assert_array_equal(np.asarray(again.best_params["w"]), at_eval[1])
  shutil.rmtree(os.path.join(workdir, "train_state", "4"))
  with pytest.raises(CheckpointError, match="names step 4 as the best"):
    Trainer(_loss, optax.sgd(0.05), cfg, workdir, evaluate=evaluate).fit(_params(), _batch, frozen=1.0)


def test_min_mode_and_no_improvement(tmp_path):
  scores = iter([3.0, 1.0, 2.0])
  cfg = TrainerConfig(steps=3, checkpoint_every=100, eval_every=1, best_metric="loss", best_mode="min")
  r = Trainer(_loss, optax.sgd(0.05), cfg, str(tmp_path / "a"), evaluate=lambda p: {"loss": next(scores)}).fit(
    _params(), _batch, frozen=1.0
  )
  assert [h["improved"] for h in r.history] == [True, True, False]
  cfg = TrainerConfig(steps=2, checkpoint_every=100, eval_every=1, best_metric="loss")
  r = Trainer(_loss, optax.sgd(0.05), cfg, str(tmp_path / "b"), evaluate=lambda p: {"loss": float("nan")}).fit(
    _params(), _batch, frozen=1.0
  )
  assert r.best_params is None and not any(h["improved"] for h in r.history)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"steps": 0}, "steps must be >= 1"),
    ({"steps": 5, "eval_every": 2}, "set both or neither"),
    ({"steps": 5, "patience": 2}, "needs a best_metric"),
    ({"steps": 5, "eval_every": 1, "best_metric": "x", "best_mode": "up"}, "best_mode"),
  ],
)
def test_bad_config_names_the_field(kwargs, match):
  with pytest.raises(ConfigError, match=match):
    TrainerConfig(**kwargs)
