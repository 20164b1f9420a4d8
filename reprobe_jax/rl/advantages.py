"""Advantage estimators registered by name (docs/method.md §B2): GRPO, DAPO, REINFORCE++-baseline and SPAE.

Each estimator is a pure jnp function `fn(inp: AdvantageInputs, cfg: AdvantageConfig) -> [B, T] float32` of
token-level advantages, exactly 0 off `response_mask` and on batch-padding rows (`row_mask` False). Padding rows never
enter a statistic: group means and standard deviations, batch whitening and SPAE's min-max run over real rows only,
so a batch with padding rows gives its real rows what the same batch without them gives. Rows are group-major with
the static group size `inp.group_size`. The learner composes them by name (`compute_advantages('spae', ...)`), as
tunix's RL code registers its estimators; docs/method.md §B2 says what each one does where the papers leave room.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from reprobe_jax.fields import Real, check_fields
from reprobe_jax.errors import ConfigError, shape_errors
from reprobe_jax.registry import Registry
from reprobe_jax.rl.types import AdvantageInputs
from reprobe_jax.spae.potential import EPS_SAT


@dataclasses.dataclass(frozen=True)
class AdvantageConfig:
  """SPAE's weights (docs/method.md §B2: alpha 0.5 saturation penalty, xi 0.5 difference shaping, eps_sat 0.9) and the
  epsilon added to every standard deviation that divides (GRPO's group std, the batch whitening)."""

  alpha: float = 0.5
  xi: float = 0.5
  eps_sat: float = 0.9
  std_eps: float = 1e-6

  def __post_init__(self):
    # alpha <= 1 keeps f = 1 - alpha (1 - exp(-C)) in [1 - alpha, 1], never flipping the sign of A_group.
    check_fields(
      self, {"alpha": Real(0.0, 1.0), "xi": Real(0.0), "eps_sat": EPS_SAT, "std_eps": Real(0.0, low_open=True)}
    )


EstimatorFn = Callable[[AdvantageInputs, AdvantageConfig], jax.Array]


@dataclasses.dataclass(frozen=True)
class Estimator:
  """A registered estimator: `needs_potentials` says whether it reads `phi` / `step_valid` / `token_step` (only
  then must the loop probe step potentials); `doc` is the first line of the function's docstring."""

  name: str
  fn: EstimatorFn
  needs_potentials: bool
  doc: str


ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


def register(name: str, *, needs_potentials: bool = False) -> Callable[[EstimatorFn], EstimatorFn]:
  """Decorator: registers `fn` under `name` as an `Estimator` (a second registration of one name is a ConfigError)."""

  def add(fn: EstimatorFn) -> EstimatorFn:
    doc = (fn.__doc__ or "").strip().splitlines()
    ESTIMATORS.register(name, Estimator(name, fn, needs_potentials, doc[0] if doc else ""))
    return fn

  return add


def get_estimator(name: str) -> Estimator:
  """The estimator registered as `name`; ConfigError listing the known names otherwise."""
  return ESTIMATORS.get(name)


def compute_advantages(
  name: str, inp: AdvantageInputs, cfg: AdvantageConfig = AdvantageConfig(), *, check_values: bool = True
) -> Float[Array, "b t"]:
  """[B, T] float32 token-level advantages of the estimator `name` (compiled once per name, config and shapes).

  The inputs are checked first (ConfigError naming the field and the row): their shapes against each other, a finite
  reward on every real row, and, for an estimator that reads step potentials, a finite Phi in [-1, 1] on every probed
  step of a real row and token steps in [-1, K) on its response tokens. Values are checked where they are concrete
  (not under an outer jit); padding rows (row_mask False) are never read, whatever they hold. check_values=False
  skips the value checks (they read the arrays back to the host): for inputs the library made itself, whose rewards
  were checked where they entered (`rollout.reward_of`) and whose Phi was made on device in [-1, 1]."""
  estimator = get_estimator(name)
  _check(inp)
  if check_values and not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(inp)):
    _check_values(inp, estimator.needs_potentials)
  return _compute(name, inp, cfg)


@functools.partial(jax.jit, static_argnames=("name", "cfg"))
def _compute(name: str, inp: AdvantageInputs, cfg: AdvantageConfig) -> Float[Array, "b t"]:
  return get_estimator(name).fn(inp, cfg)


# ------------------------------------------------------------------------------------------------ statistics


def _check(inp: AdvantageInputs) -> tuple[int, int]:
  """(B, T) after checking the shapes against each other (at trace time: shapes are static)."""
  if not isinstance(inp, AdvantageInputs):
    raise ConfigError(f"compute_advantages: expected AdvantageInputs, got {type(inp).__name__}")
  if getattr(inp.response_mask, "ndim", None) != 2:
    raise ConfigError(
      f"AdvantageInputs.response_mask: expected shape [B, T], got {getattr(inp.response_mask, 'shape', None)}"
    )
  b, t = inp.response_mask.shape
  g = inp.group_size
  if not isinstance(g, int) or g < 1 or b % g:
    raise ConfigError(f"AdvantageInputs.group_size: expected an int >= 1 that divides the batch of {b} rows, got {g!r}")
  shapes = {"rewards": (b,), "row_mask": (b,), "token_step": (b, t)}
  for field, want in shapes.items():
    if getattr(inp, field).shape != want:
      raise ConfigError(f"AdvantageInputs.{field}: expected shape {want}, got {getattr(inp, field).shape}")
  if inp.phi.ndim != 2 or inp.phi.shape[0] != b or inp.step_valid.shape != inp.phi.shape:
    raise ConfigError(
      f"AdvantageInputs.phi / step_valid: expected equal shapes [{b}, K], got {inp.phi.shape} and "
      f"{inp.step_valid.shape}"
    )
  with shape_errors("AdvantageInputs.token_step: integer step indices"):
    chex.assert_type(inp.token_step, int)
  return b, t


def _check_values(inp: AdvantageInputs, potentials: bool) -> None:
  """ConfigError naming the first value a statistic would read that is not a number it can use (host-side)."""
  rows = np.asarray(inp.row_mask).astype(bool)  # [B]
  rewards = np.asarray(inp.rewards)
  bad = np.flatnonzero(rows & ~np.isfinite(rewards))
  if bad.size:
    i = int(bad[0])
    raise ConfigError(
      f"AdvantageInputs.rewards[{i}] (row {i}, group {i // inp.group_size}) is {rewards[i]}: every real row needs "
      "a finite reward (one NaN would make its group's, or the batch's, advantages NaN)"
    )
  if not potentials or inp.phi.shape[1] == 0:
    return
  phi = np.asarray(inp.phi, np.float32)
  valid = np.asarray(inp.step_valid).astype(bool) & rows[:, None]  # [B, K]
  bad = np.argwhere(valid & ~(np.abs(phi) <= 1.0 + 1e-5))  # NaN fails too (1e-5: float32 rounding of Phi)
  if bad.size:
    i, k = map(int, bad[0])
    raise ConfigError(
      f"AdvantageInputs.phi[{i}, {k}] (row {i}, step {k}) is {phi[i, k]} on a probed step (step_valid True): "
      "expected a finite Phi in [-1, 1] (docs/method.md §B1), or step_valid False where the step was not probed"
    )
  steps = np.asarray(inp.token_step)
  tokens = np.asarray(inp.response_mask).astype(bool) & rows[:, None]  # [B, T]
  bad = np.argwhere(tokens & ((steps < -1) | (steps >= phi.shape[1])))
  if bad.size:
    i, j = map(int, bad[0])
    raise ConfigError(
      f"AdvantageInputs.token_step[{i}, {j}] (row {i}, token {j}) is {steps[i, j]}: expected a step in "
      f"[-1, {phi.shape[1]}) (-1: the row has no boundary)"
    )


def _token_mask(inp: AdvantageInputs) -> jax.Array:
  """[B, T] bool: the response tokens of real rows, the only tokens that get (and shape) an advantage."""
  return inp.response_mask.astype(bool) & inp.row_mask.astype(bool)[:, None]


def _group_stats(rewards, row_mask, g: int):
  """Per-row (group mean, unbiased group std) over the real rows of its group, [B] each.

  The std divides by n - 1 (torch.std, as verl's GRPO does); a group with one real row has std 0."""
  w = row_mask.astype(jnp.float32).reshape(-1, g)  # [B / G, G]
  r = jnp.where(w > 0, rewards.astype(jnp.float32).reshape(-1, g), 0.0)  # a padding row's value is never read
  n = jnp.sum(w, axis=1, keepdims=True)  # [B / G, 1]
  mean = jnp.sum(r * w, axis=1, keepdims=True) / jnp.maximum(n, 1.0)
  var = jnp.sum(w * (r - mean) ** 2, axis=1, keepdims=True) / jnp.maximum(n - 1.0, 1.0)
  return jnp.broadcast_to(mean, r.shape).reshape(-1), jnp.broadcast_to(jnp.sqrt(var), r.shape).reshape(-1)


def _whiten(x, mask, std_eps: float):
  """(x - mean) / (std + std_eps) over the entries where `mask`, 0 elsewhere; [B, T] -> [B, T].

  The mean is taken of the differences to the first masked entry, so equal values whiten to exactly 0 (no ulp
  residue divided by std_eps); the std is unbiased (n - 1), as verl's masked_whiten."""
  m = mask.astype(bool)
  n = jnp.sum(m)
  ref = x.reshape(-1)[jnp.argmax(m.reshape(-1))]  # any masked entry: shifting by it changes nothing but rounding
  d = jnp.where(m, x - ref, 0.0)
  d = jnp.where(m, d - jnp.sum(d) / jnp.maximum(n, 1), 0.0)
  std = jnp.sqrt(jnp.sum(d * d) / jnp.maximum(n - 1, 1))
  return jnp.where(m, d / (std + std_eps), 0.0)


def _broadcast(a_row, mask):
  """[B] row values on that row's masked tokens, [B, T]."""
  return jnp.where(mask, a_row[:, None], 0.0).astype(jnp.float32)


# ------------------------------------------------------------------------------------------------ estimators


def _grpo_z(inp: AdvantageInputs, cfg: AdvantageConfig) -> jax.Array:
  _check(inp)
  mean, std = _group_stats(inp.rewards, inp.row_mask, inp.group_size)
  z = (inp.rewards.astype(jnp.float32) - mean) / (std + cfg.std_eps)
  return _broadcast(z, _token_mask(inp))


@register("grpo")
def grpo(inp: AdvantageInputs, cfg: AdvantageConfig) -> jax.Array:
  """GRPO: the group z-score (R - mean_g) / (std_g + std_eps) on every response token of the row."""
  return _grpo_z(inp, cfg)


@register("dapo")
def dapo(inp: AdvantageInputs, cfg: AdvantageConfig) -> jax.Array:
  """DAPO: GRPO's group z-score (DAPO differs in its loss and dynamic sampling, not in its advantage)."""
  return _grpo_z(inp, cfg)


@register("rf_b")
def rf_b(inp: AdvantageInputs, cfg: AdvantageConfig) -> jax.Array:
  """REINFORCE++-baseline: R - group mean on the row's tokens, whitened over all response tokens of the batch."""
  _check(inp)
  mean, _ = _group_stats(inp.rewards, inp.row_mask, inp.group_size)
  mask = _token_mask(inp)
  return _whiten(_broadcast(inp.rewards.astype(jnp.float32) - mean, mask), mask, cfg.std_eps)


@register("spae", needs_potentials=True)
def spae(inp: AdvantageInputs, cfg: AdvantageConfig) -> jax.Array:
  """SPAE (docs/method.md §B2): A_group f(C_sat) + xi g(dPhi~) per token's step, whitened over the batch's response
  tokens.

  A_group = R - group mean; f = 1 - alpha (1 - exp(-C_sat)), C_sat the saturated (Phi > eps_sat) probed steps
  strictly before the token's step; g = exp(dPhi~) - mean exp(dPhi~), dPhi~ the min-max normalised step difference
  of Phi over every probed step of the batch's real rows. An unprobed boundary (step_valid False) counts as no
  boundary: its tokens take the next probed step of the row (the last probed one when none follows), whose dPhi is
  taken to the previous probed step; a row without a probed step (or with token_step -1) has f = 1, g = 0.
  """
  _check(inp)
  k_steps = inp.phi.shape[1]
  mask = _token_mask(inp)  # [B, T]
  mean, _ = _group_stats(inp.rewards, inp.row_mask, inp.group_size)
  a_group = jnp.where(inp.row_mask, inp.rewards.astype(jnp.float32) - mean, 0.0)  # [B]
  if k_steps == 0:  # no boundary anywhere: A_group alone, as on a row without boundaries
    return _whiten(_broadcast(a_group, mask), mask, cfg.std_eps)

  valid = inp.step_valid.astype(bool) & inp.row_mask.astype(bool)[:, None]  # [B, K]
  phi = jnp.where(valid, inp.phi.astype(jnp.float32), 0.0)  # unprobed entries may be NaN: never read
  ks = jnp.arange(k_steps, dtype=jnp.int32)
  last_upto = jax.lax.cummax(jnp.where(valid, ks, -1), axis=1)  # [B, K] last probed step <= k, -1 if none
  prev = jnp.concatenate([jnp.full_like(last_upto[:, :1], -1), last_upto[:, :-1]], axis=1)  # last probed < k
  phi_prev = jnp.take_along_axis(phi, jnp.maximum(prev, 0), axis=1)
  dphi = jnp.where(valid & (prev >= 0), phi - phi_prev, 0.0)  # 0 at the first probed step of a row

  sat = (valid & (phi > cfg.eps_sat)).astype(jnp.float32)
  c_sat = jnp.cumsum(sat, axis=1) - sat  # saturated probed steps strictly before k
  f = 1.0 - cfg.alpha * (1.0 - jnp.exp(-c_sat))  # [B, K]

  any_valid = jnp.any(valid)
  lo = jnp.where(any_valid, jnp.min(jnp.where(valid, dphi, jnp.inf)), 0.0)
  hi = jnp.where(any_valid, jnp.max(jnp.where(valid, dphi, -jnp.inf)), 0.0)
  span = hi - lo
  dphi_n = jnp.where(valid & (span > 0), (dphi - lo) / jnp.where(span > 0, span, 1.0), 0.0)  # all equal -> 0
  e = jnp.where(valid, jnp.exp(dphi_n), 0.0)
  g = jnp.where(valid, e - jnp.sum(e) / jnp.maximum(jnp.sum(valid), 1), 0.0)  # [B, K]

  # The probed step that holds each token: the next probed step at or after its own, else the row's last probed one.
  nxt = jax.lax.cummin(jnp.where(valid, ks, k_steps), axis=1, reverse=True)  # [B, K], K if none at or after
  target = jnp.where(nxt < k_steps, nxt, last_upto[:, -1:])  # [B, K], -1 when the row has no probed step
  step = jnp.clip(inp.token_step, 0, k_steps - 1)
  kt = jnp.take_along_axis(target, step, axis=1)  # [B, T]
  has = (inp.token_step >= 0) & (kt >= 0)
  kt = jnp.maximum(kt, 0)
  f_tok = jnp.where(has, jnp.take_along_axis(f, kt, axis=1), 1.0)
  g_tok = jnp.where(has, jnp.take_along_axis(g, kt, axis=1), 0.0)
  a = a_group[:, None] * f_tok + cfg.xi * g_tok  # [B, T]
  return _whiten(jnp.where(mask, a, 0.0), mask, cfg.std_eps)
