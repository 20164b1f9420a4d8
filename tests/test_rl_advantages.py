"""Advantage estimators (docs/method.md §B2): worked examples by hand, padding rows that change nothing, SPAE's edge
cases, the registry, and jit against eager."""

from __future__ import annotations

import numpy as np
import jax.numpy as jnp
import pytest

from reprobe_jax.errors import ConfigError
from reprobe_jax.rl.advantages import (
  ESTIMATORS,
  AdvantageConfig,
  Estimator,
  compute_advantages,
  get_estimator,
  register,
)
from reprobe_jax.rl.types import AdvantageInputs

CFG = AdvantageConfig()


def _inputs(rewards, lengths, t, *, group_size, token_step=None, phi=None, row_mask=None):
  """AdvantageInputs from per-row lengths (response_mask[i, :len_i]); phi NaN marks an unprobed boundary."""
  b = len(rewards)
  mask = np.zeros((b, t), bool)
  for i, n in enumerate(lengths):
    mask[i, :n] = True
  phi = np.full((b, 1), np.nan, np.float32) if phi is None else np.asarray(phi, np.float32)
  steps = np.full((b, t), -1, np.int32) if token_step is None else np.asarray(token_step, np.int32)
  rows = np.ones(b, bool) if row_mask is None else np.asarray(row_mask, bool)
  return AdvantageInputs(
    rewards=jnp.asarray(rewards, jnp.float32),
    row_mask=jnp.asarray(rows),
    response_mask=jnp.asarray(mask),
    token_step=jnp.asarray(steps),
    phi=jnp.asarray(phi),
    step_valid=jnp.asarray(~np.isnan(phi)),
    group_size=group_size,
  )


def _pad(inp: AdvantageInputs, rows: int, seed: int = 0) -> AdvantageInputs:
  """The same batch with `rows` padding rows (row_mask False) appended, filled with values that would move every
  statistic if they were read: rewards, full response masks, extreme saturated potentials on every boundary."""
  rng = np.random.default_rng(seed)
  b, t = inp.response_mask.shape
  k = inp.phi.shape[1]
  cat = lambda a, extra: jnp.concatenate([a, jnp.asarray(extra, a.dtype)], axis=0)  # noqa: E731
  return AdvantageInputs(
    rewards=cat(inp.rewards, rng.integers(0, 2, rows)),
    row_mask=cat(inp.row_mask, np.zeros(rows, bool)),
    response_mask=cat(inp.response_mask, np.ones((rows, t), bool)),
    token_step=cat(inp.token_step, rng.integers(0, k, (rows, t))),
    phi=cat(inp.phi, rng.choice([-1.0, 0.95, 1.0], (rows, k))),
    step_valid=cat(inp.step_valid, np.ones((rows, k), bool)),
    group_size=inp.group_size,
  )


# Two groups of 3: rewards [1, 0, 0 | 1, 1, 0], response lengths [3, 1, 1 | 1, 1, 1] of T = 4.
REWARDS = [1, 0, 0, 1, 1, 0]
LENGTHS = [3, 1, 1, 1, 1, 1]


def _expected_rows(values, lengths, t):
  out = np.zeros((len(values), t), np.float32)
  for i, (v, n) in enumerate(zip(values, lengths)):
    out[i, :n] = v
  return out


# ------------------------------------------------------------------------------------------------ GRPO, DAPO


@pytest.mark.parametrize("name", ["grpo", "dapo"])
def test_grpo_and_dapo_group_z_score_worked_example(name):
  # Group 1 [1, 0, 0]: mean 1/3, deviations (2/3, -1/3, -1/3), squares 6/9, unbiased var (6/9) / 2 = 1/3,
  # std 1/sqrt(3); z = (2/3) sqrt(3) = 2/sqrt(3) = 1.1547, and -1/sqrt(3) = -0.57735 twice.
  # Group 2 [1, 1, 0]: mean 2/3, the same std; z = 1/sqrt(3), 1/sqrt(3), -2/sqrt(3).
  s3 = np.sqrt(3.0)
  z = [2 / s3, -1 / s3, -1 / s3, 1 / s3, 1 / s3, -2 / s3]
  got = np.asarray(compute_advantages(name, _inputs(REWARDS, LENGTHS, 4, group_size=3), CFG))
  np.testing.assert_allclose(got, _expected_rows(z, LENGTHS, 4), atol=1e-5)  # std_eps 1e-6 moves the 6th digit
  assert got.dtype == np.float32 and np.all(got[:, 1:][np.array(LENGTHS)[:, None] <= np.arange(1, 4)] == 0)


def test_grpo_groups_of_equal_rewards_and_of_one_row_give_zero():
  # [1, 1] has std 0: (1 - 1) / (0 + eps) = 0; a group of one has R - mean = 0 and std 0 by convention.
  got = np.asarray(compute_advantages("grpo", _inputs([1, 1, 0, 0], [2, 2, 2, 2], 2, group_size=2), CFG))
  assert np.all(got == 0)
  got = np.asarray(compute_advantages("grpo", _inputs([1, 0], [2, 2], 2, group_size=1), CFG))
  assert np.all(got == 0)


# ------------------------------------------------------------------------------------------------ RF-B


def test_rf_b_worked_example():
  # R - group mean: group 1 (mean 1/3): 2/3, -1/3, -1/3; group 2 (mean 2/3): 1/3, 1/3, -2/3.
  # Tokens: row 0 has 3, the others 1, so the token values are 2/3 x3, -1/3, -1/3, 1/3, 1/3, -2/3: 8 tokens,
  # sum = 2 - 2/3 + 2/3 - 2/3 = 4/3, mean 1/6. Centred: 1/2 x3, -1/2 x2, 1/6 x2, -5/6; squares 3/4 + 2/4 + 2/36 +
  # 25/36 = 2; unbiased var 2/7, std sqrt(2/7); whitened = centred * sqrt(7/2).
  centred = [1 / 2, -1 / 2, -1 / 2, 1 / 6, 1 / 6, -5 / 6]
  want = _expected_rows(np.array(centred) * np.sqrt(7 / 2), LENGTHS, 4)
  got = np.asarray(compute_advantages("rf_b", _inputs(REWARDS, LENGTHS, 4, group_size=3), CFG))
  np.testing.assert_allclose(got, want, atol=1e-5)
  m = want != 0
  assert abs(got[m].mean()) < 1e-6 and got[m].std(ddof=1) == pytest.approx(1.0, abs=1e-5)


# ------------------------------------------------------------------------------------------------ SPAE

# Two groups of 2 (alpha = xi = 0.5, eps_sat = 0.9), K = 4 boundaries, T = 8.
# row 0: R = 1, A_group = +0.5; phi [0.95, 0.95, 0.5, 0.92], all probed; 8 tokens on steps [0,0,1,2,2,3,3,3]: the
#        last two tokens come after the last boundary and take step 3 (token_step says so).
# row 1: R = 0, A_group = -0.5; phi [0.0, 0.5], 2 boundaries; 5 tokens on steps [0,0,1,1,1] (3 after the last).
# row 2: R = 0, A_group = -0.5; no boundary (token_step -1): f = 1, g = 0; 4 tokens.
# row 3: R = 1, A_group = +0.5; phi [-0.5, 0.3, 0.1]; 6 tokens on steps [0,1,1,2,2,2].
SPAE_REWARDS = [1, 0, 0, 1]
SPAE_LENGTHS = [8, 5, 4, 6]
NAN = np.nan
SPAE_PHI = [[0.95, 0.95, 0.5, 0.92], [0.0, 0.5, NAN, NAN], [NAN] * 4, [-0.5, 0.3, 0.1, NAN]]
SPAE_STEPS = [[0, 0, 1, 2, 2, 3, 3, 3], [0, 0, 1, 1, 1, -1, -1, -1], [-1] * 8, [0, 1, 1, 2, 2, 2, -1, -1]]


def _spae_example(**kw):
  return _inputs(SPAE_REWARDS, SPAE_LENGTHS, 8, group_size=2, token_step=SPAE_STEPS, phi=SPAE_PHI, **kw)


def _spae_by_hand():
  # Saturation penalty, row 0: saturated steps 0, 1, 3 (phi > 0.9), so C_sat = [0, 1, 2, 2] and
  # f = [1, 1 - 0.5 (1 - e^-1), 1 - 0.5 (1 - e^-2), same] = [1, 0.683940, 0.567668, 0.567668]; rows 1 and 3
  # never saturate: f = 1.
  f1, f2 = 0.5 + 0.5 * np.exp(-1.0), 0.5 + 0.5 * np.exp(-2.0)
  # dPhi (0 at the first step): row 0 [0, 0, -0.45, 0.42], row 1 [0, 0.5], row 3 [0, 0.8, -0.2].
  # Min-max over these 9 steps: min -0.45, max 0.8, span 1.25; dPhi~ = (dPhi + 0.45) / 1.25:
  # row 0 [0.36, 0.36, 0, 0.696], row 1 [0.36, 0.76], row 3 [0.36, 1.0, 0.2].
  e = np.exp([0.36, 0.36, 0.0, 0.696, 0.36, 0.76, 0.36, 1.0, 0.2])
  # mean of exp(dPhi~) = 14.81698 / 9 = 1.646332; g = e - 1.646332.
  g = e - e.mean()
  assert e.mean() == pytest.approx(1.646332, abs=1e-6)
  # A = A_group f + 0.5 g per step:
  r0 = [0.5 * 1 + 0.5 * g[0], 0.5 * f1 + 0.5 * g[1], 0.5 * f2 + 0.5 * g[2], 0.5 * f2 + 0.5 * g[3]]
  r1 = [-0.5 + 0.5 * g[4], -0.5 + 0.5 * g[5]]
  r3 = [0.5 + 0.5 * g[6], 0.5 + 0.5 * g[7], 0.5 + 0.5 * g[8]]
  np.testing.assert_allclose(r0, [0.393498, 0.235468, -0.039332, 0.463524], atol=1e-6)
  np.testing.assert_allclose(r1 + r3, [-0.606502, -0.254028, 0.393498, 1.035975, 0.287535], atol=1e-6)
  before = np.zeros((4, 8))
  before[0] = [r0[0], r0[0], r0[1], r0[2], r0[2], r0[3], r0[3], r0[3]]
  before[1, :5] = [r1[0], r1[0], r1[1], r1[1], r1[1]]
  before[2, :4] = -0.5  # no boundary: A_group alone
  before[3, :6] = [r3[0], r3[1], r3[1], r3[2], r3[2], r3[2]]
  # Whitening over the 23 response tokens: mean 0.0733626, unbiased std 0.4939468.
  m = np.zeros((4, 8), bool)
  for i, n in enumerate(SPAE_LENGTHS):
    m[i, :n] = True
  mean, std = before[m].mean(), before[m].std(ddof=1)
  assert (mean, std) == (pytest.approx(0.0733626, abs=1e-6), pytest.approx(0.4939468, abs=1e-6))
  return np.where(m, (before - mean) / std, 0.0)


def test_spae_worked_example():
  want = _spae_by_hand()
  got = np.asarray(compute_advantages("spae", _spae_example(), CFG))
  np.testing.assert_allclose(got, want, atol=2e-5)
  # spot checks: row 0 token 0 (0.393498 - 0.0733626) / 0.4939468 = 0.648118; row 2 is constant
  assert got[0, 0] == pytest.approx(0.648118, abs=2e-5)
  np.testing.assert_allclose(got[2, :4], (-0.5 - 0.0733626) / 0.4939468, atol=2e-5)


def test_spae_saturation_penalty_shrinks_the_group_term():
  # xi = 0 leaves A_group f: row 0's tokens on steps 1 and 2 carry f = 0.683940 and 0.567668 of A_group = 0.5.
  no_shape = AdvantageConfig(xi=0.0)
  got = np.asarray(compute_advantages("spae", _spae_example(), no_shape))
  # Tokens 0, 2, 3 of row 0 sit on steps 0, 1, 2: before whitening 0.5, 0.5 f1, 0.5 f2. Whitening is affine, so
  # differences keep their ratios: (0.5 f1 - 0.5) / (0.5 f2 - 0.5) = (1 - e^-1) / (1 - e^-2)
  # = 0.632121 / 0.864665 = 0.731059.
  ratio = (got[0, 2] - got[0, 0]) / (got[0, 3] - got[0, 0])
  assert ratio == pytest.approx(0.731059, rel=1e-4)
  # alpha = 0 removes the penalty: rows 0 and 3 (both A_group = 0.5, no shaping) are then equal everywhere.
  flat = np.asarray(compute_advantages("spae", _spae_example(), AdvantageConfig(xi=0.0, alpha=0.0)))
  np.testing.assert_allclose(flat[0, :8], flat[3, 0], atol=1e-6)
  np.testing.assert_allclose(flat[3, :6], flat[3, 0], atol=1e-6)
  assert flat[3, 0] > 0 > flat[1, 0]


def test_spae_an_unprobed_boundary_counts_as_no_boundary():
  # Row 0 with boundary 1 unprobed (its Phi NaN) equals row 0 without that boundary: steps [0, 2, 3] renumbered
  # [0, 1, 2], tokens of old steps 1 and 2 both on new step 1. dPhi of the new step 1 is 0.5 - 0.95 = -0.45, as
  # the old step 2's difference to the carried Phi of step 0; C_sat of it is 1 (only step 0 before it saturates).
  phi = [row[:] for row in SPAE_PHI]
  phi[0][1] = NAN
  gap = _inputs(SPAE_REWARDS, SPAE_LENGTHS, 8, group_size=2, token_step=SPAE_STEPS, phi=phi)
  phi_removed = [[0.95, 0.5, 0.92, NAN]] + [row for row in SPAE_PHI[1:]]
  steps_removed = [[0, 0, 1, 1, 1, 2, 2, 2]] + SPAE_STEPS[1:]
  removed = _inputs(SPAE_REWARDS, SPAE_LENGTHS, 8, group_size=2, token_step=steps_removed, phi=phi_removed)
  a = np.asarray(compute_advantages("spae", gap, CFG))
  b = np.asarray(compute_advantages("spae", removed, CFG))
  np.testing.assert_allclose(a, b, atol=1e-6)
  assert np.all(np.isfinite(a))
  # a last boundary unprobed: tokens on it take the last probed step (3 -> 2 here)
  phi_last = [row[:] for row in SPAE_PHI]
  phi_last[0][3] = NAN
  steps_last = [[0, 0, 1, 2, 2, 2, 2, 2]] + SPAE_STEPS[1:]
  a = np.asarray(
    compute_advantages(
      "spae", _inputs(SPAE_REWARDS, SPAE_LENGTHS, 8, group_size=2, token_step=SPAE_STEPS, phi=phi_last), CFG
    )
  )
  b = np.asarray(
    compute_advantages(
      "spae", _inputs(SPAE_REWARDS, SPAE_LENGTHS, 8, group_size=2, token_step=steps_last, phi=phi_last), CFG
    )
  )
  np.testing.assert_allclose(a, b, atol=1e-6)


def test_spae_edge_cases_give_no_nan():
  # All dPhi equal (one boundary per row: every dPhi is 0, min == max): dPhi~ = 0, g = e^0 - 1 = 0, and with no
  # saturation SPAE is RF-B's whitened A_group.
  one = _inputs(REWARDS, LENGTHS, 4, group_size=3, token_step=np.zeros((6, 4)), phi=np.full((6, 1), 0.3))
  np.testing.assert_allclose(
    np.asarray(compute_advantages("spae", one, CFG)), np.asarray(compute_advantages("rf_b", one, CFG)), atol=1e-6
  )
  # No probed step anywhere: RF-B again.
  none = _inputs(REWARDS, LENGTHS, 4, group_size=3)
  np.testing.assert_allclose(
    np.asarray(compute_advantages("spae", none, CFG)), np.asarray(compute_advantages("rf_b", none, CFG)), atol=1e-6
  )
  # No boundary column at all (K = 0).
  empty = _inputs(REWARDS, LENGTHS, 4, group_size=3, phi=np.zeros((6, 0)))
  np.testing.assert_allclose(
    np.asarray(compute_advantages("spae", empty, CFG)), np.asarray(compute_advantages("rf_b", none, CFG)), atol=1e-6
  )
  # Whitening std 0: equal rewards in every group (A_group = 0) and equal shaping (one boundary each) make every
  # token's value the same; the whitened result is exactly 0, not NaN or eps noise.
  flat = _inputs([1, 1, 1, 0, 0, 0], LENGTHS, 4, group_size=3, token_step=np.zeros((6, 4)), phi=np.full((6, 1), 0.1))
  for name in ESTIMATORS:
    got = np.asarray(compute_advantages(name, flat, CFG))
    assert np.all(got == 0), name
  # A batch of only padding rows: zeros everywhere.
  pad_only = _inputs(
    [1, 0], [2, 2], 2, group_size=2, token_step=np.zeros((2, 2)), phi=np.full((2, 1), 0.95), row_mask=[False, False]
  )
  for name in ESTIMATORS:
    assert np.all(np.asarray(compute_advantages(name, pad_only, CFG)) == 0), name


# ------------------------------------------------------------------------------------------------ every estimator


EXAMPLES = {
  "grpo": lambda: _inputs(REWARDS, LENGTHS, 4, group_size=3),
  "dapo": lambda: _inputs(REWARDS, LENGTHS, 4, group_size=3),
  "rf_b": lambda: _inputs(REWARDS, LENGTHS, 4, group_size=3),
  "spae": _spae_example,
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_padding_rows_change_nothing(name):
  inp = EXAMPLES[name]()
  b, g = inp.rewards.shape[0], inp.group_size
  plain = np.asarray(compute_advantages(name, inp, CFG))
  padded = np.asarray(compute_advantages(name, _pad(inp, 2 * g), CFG))
  np.testing.assert_allclose(padded[:b], plain, atol=1e-6)
  assert np.all(padded[b:] == 0)
  # the same padding rows marked real do change the real rows' values: the test can fail
  real = _pad(inp, 2 * g)
  real = real.replace(row_mask=jnp.ones_like(real.row_mask))
  if name not in ("grpo", "dapo"):  # z-scores are per group: padding groups could only move batch statistics
    assert not np.allclose(np.asarray(compute_advantages(name, real, CFG))[:b], plain, atol=1e-3)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_jit_equals_eager(name):
  inp = EXAMPLES[name]()
  eager = np.asarray(get_estimator(name).fn(inp, CFG))
  np.testing.assert_allclose(np.asarray(compute_advantages(name, inp, CFG)), eager, atol=1e-6)
  assert np.all(eager[~np.asarray(inp.response_mask)] == 0)


def test_registry():
  assert sorted(ESTIMATORS) == ["dapo", "grpo", "rf_b", "spae"]
  assert [n for n, e in ESTIMATORS.items() if e.needs_potentials] == ["spae"]
  assert all(isinstance(e, Estimator) and e.doc and e.name == n for n, e in ESTIMATORS.items())
  known = r"^unknown advantage estimator 'ppo'; known: dapo, grpo, rf_b, spae$"
  with pytest.raises(ConfigError, match=known):
    get_estimator("ppo")
  with pytest.raises(ConfigError, match="known:"):
    compute_advantages("ppo", EXAMPLES["grpo"](), CFG)
  with pytest.raises(ConfigError, match="already registered"):
    register("grpo")(lambda inp, cfg: inp.rewards)


def test_bad_inputs_and_config():
  with pytest.raises(ConfigError, match="group_size"):
    compute_advantages("grpo", _inputs(REWARDS, LENGTHS, 4, group_size=4), CFG)
  float_steps = _inputs(REWARDS, LENGTHS, 4, group_size=2).replace(token_step=jnp.zeros((len(REWARDS), 4)))
  with pytest.raises(ConfigError, match="AdvantageInputs.token_step: integer step indices"):
    compute_advantages("spae", float_steps, CFG)
  with pytest.raises(ConfigError, match=r"AdvantageConfig.alpha: expected a finite number in \[0.0, 1.0\]"):
    AdvantageConfig(alpha=1.5)
  with pytest.raises(ConfigError, match="AdvantageConfig.std_eps"):
    AdvantageConfig(std_eps=0.0)
  hash(CFG)  # a static jit argument
