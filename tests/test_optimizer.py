"""The one optimizer config: each learner's default builds the optax chain that learner built by hand before
(the same transformations in the same order, the same hyperparameters, the same schedule), checked update by
update to the last bit."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from reprobe_jax.errors import ConfigError
from reprobe_jax.prm.train import PRMTrainConfig
from reprobe_jax.probe.train import ProbeTrainConfig
from reprobe_jax.rl.loop import RLConfig
from reprobe_jax.synthetic.train_lm import TrainLMConfig
from reprobe_jax.train.optimizer import OptimizerConfig, make_optimizer


# The chains as each learner spelled them before they shared OptimizerConfig (the reference to hold them to).


def _target_lm_by_hand(lr, warmup_steps, weight_decay, grad_clip, steps):
  warmup = min(warmup_steps, max(steps // 10, 1))
  schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(steps, warmup + 1), lr * 0.05)
  return optax.chain(
    optax.clip_by_global_norm(grad_clip), optax.adamw(schedule, b2=0.98, weight_decay=weight_decay)
  ), schedule


def _probe_by_hand(lr, warmup_frac, weight_decay, grad_clip, total):
  warmup = max(int(total * warmup_frac), 1)
  schedule = optax.join_schedules(
    [optax.linear_schedule(0.0, lr, warmup), optax.linear_schedule(lr, 0.0, max(total - warmup, 1))], [warmup]
  )
  return optax.chain(optax.clip_by_global_norm(grad_clip), optax.adamw(schedule, weight_decay=weight_decay)), schedule


def _prm_by_hand(lr, warmup_frac, weight_decay, grad_clip, total):
  warmup = max(int(total * warmup_frac), 1)
  schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total, warmup + 1), 0.0)
  return optax.chain(optax.clip_by_global_norm(grad_clip), optax.adamw(schedule, weight_decay=weight_decay)), schedule


def _rl_by_hand(lr, warmup_steps, grad_clip, weight_decay):
  schedule = optax.linear_schedule(0.0, lr, warmup_steps) if warmup_steps else optax.constant_schedule(lr)
  parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip > 0 else []
  parts.append(optax.adamw(schedule, weight_decay=weight_decay) if weight_decay else optax.adam(schedule))
  return optax.chain(*parts), schedule


def _assert_same(ours, theirs, total: int):
  """Equal schedules at every step and bit-equal parameters and optimizer states after `total` updates."""
  (tx, schedule), (ref_tx, ref_schedule) = ours, theirs
  for i in range(total + 2):
    assert float(schedule(i)) == float(ref_schedule(i)), i
  key = jax.random.key(0)
  params = {"w": jax.random.normal(key, (4, 3)), "b": jnp.zeros(3)}
  state, ref_state = tx.init(params), ref_tx.init(params)
  assert jax.tree.structure(state) == jax.tree.structure(ref_state)
  p, q = params, params
  for i in range(total):
    g = jax.tree.map(lambda x: 3.0 * jax.random.normal(jax.random.fold_in(key, i + 1), x.shape), params)
    u, state = tx.update(g, state, p)
    v, ref_state = ref_tx.update(g, ref_state, q)
    p, q = optax.apply_updates(p, u), optax.apply_updates(q, v)
  for a, b in zip(jax.tree.leaves((p, state)), jax.tree.leaves((q, ref_state))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("steps", [3, 25, 120])
def test_target_lm_default_builds_its_old_chain(steps):
  cfg = TrainLMConfig().optimizer
  _assert_same(make_optimizer(cfg, steps), _target_lm_by_hand(3e-3, 40, 0.01, 1.0, steps), steps)
  # the built-in target's config (configs/target_synthetic.py) overrides four fields
  cfg = dataclasses.replace(cfg, learning_rate=4e-3, warmup_steps=50, weight_decay=0.01, grad_clip=1.0)
  _assert_same(make_optimizer(cfg, steps), _target_lm_by_hand(4e-3, 50, 0.01, 1.0, steps), steps)


@pytest.mark.parametrize("total", [1, 7, 60])
def test_probe_default_builds_its_old_chain(total):
  cfg = ProbeTrainConfig().optimizer
  _assert_same(make_optimizer(cfg, total), _probe_by_hand(5e-4, 0.05, 0.1, 1.0, total), total)


@pytest.mark.parametrize("total", [1, 9, 40])
def test_prm_default_builds_its_old_chain(total):
  cfg = dataclasses.replace(PRMTrainConfig().optimizer, learning_rate=1e-3)  # configs/reprobe_synthetic.py's rate
  _assert_same(make_optimizer(cfg, total), _prm_by_hand(1e-3, 0.1, 0.01, 1.0, total), total)


@pytest.mark.parametrize("warmup_steps, grad_clip, weight_decay", [(0, 1.0, 0.0), (3, 0.0, 0.0), (2, 0.5, 0.01)])
def test_rl_builds_its_old_chain(warmup_steps, grad_clip, weight_decay):
  """Adam without weight decay, AdamW with it; no clipping when grad_clip is 0; a constant rate after the warmup."""
  cfg = dataclasses.replace(
    RLConfig().optimizer, warmup_steps=warmup_steps, grad_clip=grad_clip, weight_decay=weight_decay
  )
  _assert_same(make_optimizer(cfg, 40), _rl_by_hand(5e-4, warmup_steps, grad_clip, weight_decay), 8)


def test_warmup_steps_fraction_and_both():
  assert OptimizerConfig().warmup(100) == 0
  assert OptimizerConfig(warmup_steps=7).warmup(100) == 7
  assert OptimizerConfig(warmup_frac=0.05).warmup(100) == 5
  assert OptimizerConfig(warmup_frac=0.05).warmup(3) == 1  # at least one step
  assert OptimizerConfig(warmup_frac=0.0).warmup(100) == 1
  assert OptimizerConfig(warmup_steps=40, warmup_frac=0.1).warmup(1000) == 40  # the smaller of the two
  assert OptimizerConfig(warmup_steps=40, warmup_frac=0.1).warmup(120) == 12
  # the target LM's old rule, min(warmup_steps, max(steps // 10, 1)), for every run length it could have
  cfg = OptimizerConfig(warmup_steps=10**7, warmup_frac=0.1)
  assert all(cfg.warmup(n) == max(n // 10, 1) for n in range(1, 200_000))


@pytest.mark.parametrize(
  "field, value, match",
  [
    ("learning_rate", 0.0, r"^OptimizerConfig\.learning_rate: expected a finite number > 0\.0, got 0\.0$"),
    ("learning_rate", float("nan"), r"^OptimizerConfig\.learning_rate: expected a finite number"),
    ("schedule", "step", r"^OptimizerConfig\.schedule: expected one of 'cosine', 'linear', 'constant', got 'step'$"),
    ("warmup_steps", -1, r"^OptimizerConfig\.warmup_steps: expected an int >= 0, got -1$"),
    ("warmup_frac", 1.0, r"^OptimizerConfig\.warmup_frac: expected a finite number in \[0\.0, 1\.0\), got 1\.0$"),
    ("end_frac", 1.5, r"^OptimizerConfig\.end_frac: expected a finite number in \[0\.0, 1\.0\]"),
    ("weight_decay", -0.1, r"^OptimizerConfig\.weight_decay: expected a finite number >= 0\.0"),
    ("b1", 1.0, r"^OptimizerConfig\.b1: expected a finite number in \[0\.0, 1\.0\)"),
    ("b2", -0.5, r"^OptimizerConfig\.b2: expected a finite number in \[0\.0, 1\.0\)"),
    ("grad_clip", -1.0, r"^OptimizerConfig\.grad_clip: expected a finite number >= 0\.0"),
  ],
)
def test_bad_fields_are_named(field, value, match):
  with pytest.raises(ConfigError, match=match):
    OptimizerConfig(**{field: value})


def test_linear_and_cosine_end_where_told():
  for schedule in ("linear", "cosine"):
    opt = make_optimizer(OptimizerConfig(learning_rate=1.0, schedule=schedule, warmup_steps=2, end_frac=0.25), 10)
    assert float(opt.schedule(0)) == 0.0 and float(opt.schedule(2)) == 1.0
    assert float(opt.schedule(10)) == pytest.approx(0.25)
  opt = make_optimizer(OptimizerConfig(learning_rate=0.5, schedule="constant"), 10)
  assert [float(opt.schedule(i)) for i in (0, 5, 50)] == [0.5, 0.5, 0.5]
