"""SPAE's step potentials of an RL step's kept trajectories, read from the rollout's own decode state
(docs/method.md §B1, §B2).

Each rollout round's decode state stays on device until dynamic sampling has chosen the step's groups. The kept rows
are gathered from it (their prompt's shared prefix copied into their own caches, `decode_state.flatten`: a copy,
no forward pass) and every paragraph boundary of every kept row is forked from that cache and probed in batched
calls (`Prober.probe_state`: the suffix, the teacher-forced answer and N sampled continuations per boundary). Nothing
is prefilled again and nothing comes back to the host: Phi and each boundary's validity stay on device and feed the
advantages there. The host knows only where the boundaries are (`Prober.boundaries` over the tokens it already holds
for the reward), which fixes the shapes.

The same trajectory and seed give what `rollout.potentials` computes from the token ids alone by prefilling them
again (a test holds them within float tolerance): the n-th continuation at boundary c of a trajectory draws from
fold_in(fold_in(fold_in(key(probe seed), trajectory_seed), c), n) in either path.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float

import reprobe_jax.models.decode_state as decode_state
from reprobe_jax.errors import ConfigError
from reprobe_jax.models.decode_state import DecodeState
from reprobe_jax.models.sampling import bucket
from reprobe_jax.rl.rollout import STEP_BUCKET, PromptSet, StepBatch, Trajectory, token_steps, trajectory_seed
from reprobe_jax.rl.types import AdvantageInputs
from reprobe_jax.spae.potential import step_potential
from reprobe_jax.spae.prober import Prober, cut_columns


MIN_ROWS = 8  # a probing call's trajectories are padded to a power of two of at least this (or the batch size)
# A call's shapes are (trajectories, boundaries) buckets: trajectories a power of two, at least MIN_ROWS; boundaries
# the call's most rounded up to a multiple of `prober.CUT_STEP` (`cut_columns`), so a run compiles the probe a
# handful of times. Every padded boundary column costs a fork, the suffix, the answer and N samples per row: with
# 3-5 boundaries a trajectory (the built-in config), powers of two of at least 8 padded 512 slots for about 260
# boundaries, multiples of 4 about 320, and probing took a third less time.


@dataclasses.dataclass(frozen=True)
class KeptPotentials:
  """The step potentials of a step's kept trajectories, in their order. cuts (host): each trajectory's boundaries
  (the response-token index of each boundary's last token; empty without a thinking block). phi [n, K] float32
  (0 where not valid) and valid [n, K] bool stay on device; K is a power of two, at least STEP_BUCKET."""

  cuts: tuple[np.ndarray, ...]
  phi: Float[Array, "n k"]
  valid: Bool[Array, "n k"]


@jax.jit
def _flatten(state: DecodeState) -> DecodeState:
  return decode_state.flatten(state)


@functools.partial(jax.jit, donate_argnums=(0, 1))
def _place(phi_all, valid_all, acc, conf, where):
  """Writes one call's Phi and validity ([b, c] for the step's rows `where`; -1 = a padding row, dropped) into the
  step's [n, K] buffers."""
  phi = step_potential(acc, conf)
  ok = jnp.isfinite(phi) & (where[:, None] >= 0)
  k = phi_all.shape[1]
  phi = jnp.pad(jnp.where(ok, phi, 0.0).astype(jnp.float32), ((0, 0), (0, k - phi.shape[1])))
  ok = jnp.pad(ok, ((0, 0), (0, k - ok.shape[1])))
  rows = jnp.where(where >= 0, where, phi_all.shape[0])  # out of range: dropped
  return phi_all.at[rows].set(phi, mode="drop"), valid_all.at[rows].set(ok, mode="drop")


def probe_kept(
  prober: Prober,
  states: Mapping[int, DecodeState],
  trajs: Sequence[Trajectory],
  prompts: PromptSet,
  step: int,
  thinks: Sequence[bool],
) -> KeptPotentials:
  """Every boundary of every kept trajectory probed from its round's decode state (`states[t.round]`, row
  `t.row`). thinks[i]: trajectory i has a thinking block (its response holds `<think>`, or the prompt opened it);
  one without has no boundary and no potential (docs/method.md §B1). Calls of at most `prober.cfg.batch_size`
  trajectories each, all dispatched before anything is read."""
  if len(thinks) != len(trajs):
    raise ConfigError(f"probe_kept: {len(thinks)} thinking flags for {len(trajs)} trajectories")
  n = len(trajs)
  cuts = [np.zeros(0, np.int64) for _ in range(n)]
  probed = [i for i in range(n) if thinks[i]]
  if probed:
    for i, c in zip(probed, prober.boundaries([trajs[i].text_ids for i in probed])):
      cuts[i] = np.asarray(c, np.int64)
  k = bucket(max([len(c) for c in cuts] + [1]), minimum=STEP_BUCKET)  # every call's boundaries fit (c <= k)
  pids = sorted({t.prompt for t in trajs})
  answers = dict(zip(pids, prober.answer_ids([prompts.problems[p].answer for p in pids])))
  phi = jnp.zeros((n, k), jnp.float32)  # an unprobed trajectory keeps its zeros (no valid boundary)
  valid = jnp.zeros((n, k), bool)
  for r in sorted({trajs[i].round for i in probed if len(cuts[i])}):
    flat = _flatten(states[r])
    todo = sorted((i for i in probed if trajs[i].round == r and len(cuts[i])), key=lambda i: len(cuts[i]))
    bs = prober.cfg.batch_size
    for start in range(0, len(todo), bs):
      idx = todo[start : start + bs]
      b = bucket(len(idx), minimum=min(MIN_ROWS, bucket(bs)))
      c = cut_columns(max(len(cuts[i]) for i in idx))
      pad = idx + [idx[0]] * (b - len(idx))  # batch padding repeats a real row (its results are dropped)
      cut_arr = np.full((b, c), -1, np.int32)
      for j, i in enumerate(idx):
        cut_arr[j, : len(cuts[i])] = cuts[i]
      sub = decode_state.take(flat, jnp.asarray([trajs[i].row for i in pad], jnp.int32))
      acc, conf = prober.probe_state(
        sub,
        cut_arr,
        np.broadcast_to(np.arange(c, dtype=np.int32), (b, c)),
        [answers[trajs[i].prompt] for i in pad],
        [trajectory_seed(trajs[i], prompts, step) for i in pad],
      )
      where = np.full(b, -1, np.int32)
      where[: len(idx)] = idx
      phi, valid = _place(phi, valid, acc, conf, jnp.asarray(where))
  return KeptPotentials(cuts=tuple(cuts), phi=phi, valid=valid)


def with_potentials(sb: StepBatch, kept: KeptPotentials) -> AdvantageInputs:
  """The step batch's advantage inputs (`rollout.step_batch` without potentials) with the kept trajectories'
  potentials: Phi and validity from device, padded to the batch's rows; each token's step k(j) from the cuts."""
  inp = sb.adv_inputs
  b, t = sb.response_mask.shape
  n = kept.phi.shape[0]
  if n != sb.real_rows:
    raise ConfigError(f"with_potentials: potentials of {n} trajectories for a batch of {sb.real_rows} real rows")
  lengths = sb.response_mask[:n].sum(axis=1).astype(int)
  token_step = np.full((b, t), -1, np.int32)
  for r in range(n):
    token_step[r, : lengths[r]] = token_steps(kept.cuts[r], int(lengths[r]))
  return inp.replace(
    token_step=jnp.asarray(token_step),
    phi=jnp.pad(kept.phi, ((0, b - n), (0, 0))),
    step_valid=jnp.pad(kept.valid, ((0, b - n), (0, 0))),
  )
