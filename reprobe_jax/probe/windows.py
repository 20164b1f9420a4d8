"""The probe over every step of a batch whose spans are on device (docs/method.md §A4): each step's window [0, step
end) packed side by side on device, as `probe.data.pack_spans` packs host spans, so that nothing is fetched first.

The packing has static shapes and no search: a window of length e goes to the narrowest class of slot width
W_k = L / 2^k (k = 0..K-1, W_k >= MIN_WINDOW) that holds it, a packed row of L slots holds 2^k windows of class k,
and windows fill their class's rows in step order. It wastes at most half of a row's slots to first fit's little
(`pack_spans`), and a packed row costs what it does there. The rows used are counted on device; `score_windows`
runs the probe's encoder over them a chunk of rows at a time (`lax.while_loop`) and its classifier once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx, struct
from jaxtyping import Array, Bool, Float, Int

from reprobe_jax.models.forward import StaticGraph
from reprobe_jax.models.sharding import ShardingCtx, constrain_rows
from reprobe_jax.probe.data import PackedSteps
from reprobe_jax.probe.model import jit_operands

MIN_WINDOW = 16  # the narrowest slot class


class WindowPlan(struct.PyTreeNode):
  """Where the window of each of the P = B x S steps of spans [B, S, 2] sits: class k's windows fill packed rows
  base[k] .. base[k + 1] - 1 (2^k per row) in the order `order` gives them (steps with tokens only)."""

  start: Int[Array, " p"]
  end: Int[Array, " p"]
  valid: Bool[Array, " p"]  # the step has tokens (end > start)
  order: Int[Array, " p"]  # steps with tokens by class, then by index
  first: Int[Array, " k"]  # where each class starts in `order`
  count: Int[Array, " k"]  # windows of each class
  base: Int[Array, " k1"]  # [K + 1] first packed row of each class; base[K]: the rows used
  slots: int = struct.field(pytree_node=False)  # L
  steps: int = struct.field(pytree_node=False)  # S: step p is step p % S of trajectory p // S

  @property
  def widths(self) -> list[int]:
    return _widths(self.slots)

  @property
  def rows(self) -> Int[Array, ""]:
    return self.base[-1]

  def chunk(self, i, rows: int) -> PackedSteps:
    """The PackedSteps [rows, L] of packed rows i * rows .. (i + 1) * rows - 1 (rows past the used ones are empty);
    segments are global step indices, so every chunk pools into the same P bins."""
    k_n, p_n = len(self.widths), self.start.shape[0]
    r = i * rows + jnp.arange(rows, dtype=jnp.int32)  # [C]
    klass = jnp.searchsorted(self.base[1:], r, side="right")  # [C]; K past the used rows
    kc = jnp.minimum(klass, k_n - 1)
    width = jnp.asarray(self.widths, jnp.int32)[kc][:, None]  # [C, 1]
    per_row = (1 << kc)[:, None]
    o = jnp.arange(self.slots, dtype=jnp.int32)[None, :]
    slot = o // width  # [C, L] the window of the row that holds slot o
    token = o - slot * width
    rank = (r - self.base[kc])[:, None] * per_row + slot  # the window's rank in its class
    ok = (klass < k_n)[:, None] & (slot < per_row) & (rank < self.count[kc][:, None])
    p = self.order[jnp.clip(self.first[kc][:, None] + rank, 0, p_n - 1)]  # [C, L] the step
    filled = ok & (token < self.end[p])
    return PackedSteps(
      row=jnp.where(filled, p // self.steps, 0),
      token=jnp.where(filled, token, 0),
      segment=jnp.where(filled, p, -1),
      in_step=filled & (token >= self.start[p]),
      num_steps=p_n,
    )


def _widths(slots: int) -> list[int]:
  out = [slots]
  while out[-1] // 2 >= MIN_WINDOW:
    out.append(out[-1] // 2)
  return out


def window_plan(spans: Int[Array, "b s 2"], slots: int) -> WindowPlan:
  """The packing of every step window of spans [B, S, 2] into rows of `slots` (>= every span's end). Jittable."""
  b, s = spans.shape[:2]
  start, end = spans[..., 0].reshape(-1), spans[..., 1].reshape(-1)  # [P]
  widths = _widths(slots)
  k_n, p_n = len(widths), b * s
  valid = end > start
  klass = sum(((end <= w).astype(jnp.int32) for w in widths[1:]), jnp.zeros_like(end))  # the narrowest that holds it
  key = jnp.where(valid, klass, k_n)
  order = jnp.argsort(key * p_n + jnp.arange(p_n, dtype=jnp.int32)).astype(jnp.int32)
  count = jnp.sum(key[:, None] == jnp.arange(k_n)[None, :], axis=0, dtype=jnp.int32)  # [K]
  per_row = 1 << jnp.arange(k_n, dtype=jnp.int32)
  rows = (count + per_row - 1) // per_row
  base = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(rows).astype(jnp.int32)])
  return WindowPlan(start, end, valid, order, jnp.cumsum(count) - count, count, base, slots=slots, steps=s)


@functools.partial(jax.jit, static_argnames=("graph", "shard"))
def _window_probabilities(graph: StaticGraph, state, features, spans, shard: ShardingCtx | None = None):
  probe = nnx.merge(graph.value, *state)
  features, spans = constrain_rows((features, spans), shard)
  b, t = features.shape[:2]
  plan = window_plan(spans, t)
  h = probe.project(features, deterministic=True)  # [B, T, d] once per trajectory
  p_n, d = plan.start.shape[0], h.shape[-1]

  def encode(carry):  # one chunk of B packed rows (a multiple of the data axis, like the trajectories)
    i, total, count = carry
    tot, cnt = probe.pooled(h, constrain_rows(plan.chunk(i, b), shard), deterministic=True, shard=shard)
    return i + 1, total + tot, count + cnt

  init = (jnp.int32(0), jnp.zeros((p_n, d), h.dtype), jnp.zeros((p_n, 1), h.dtype))
  _, total, count = jax.lax.while_loop(lambda c: c[0] * b < plan.rows, encode, init)
  prob = jax.nn.sigmoid(probe.classify(total / jnp.maximum(count, 1.0), deterministic=True))  # [P]
  return constrain_rows(jnp.where(plan.valid, prob, jnp.nan).reshape(b, -1), shard)


def score_windows(
  graphdef, params, features: Float[Array, "b t f"], spans: Int[Array, "b s 2"], shard: ShardingCtx | None = None
) -> Float[Array, "b s"]:
  """P(step incorrect) [B, S] of every step span [B, S, 2] (NaN where the step has no tokens) of trajectories with
  features [B, T, F], spans on device: the values of `score_steps` / `score_packed`, each step's window [0, end)
  encoded once. Compiles once per (config, B, T, S); params as for `score_steps`. shard: data parallel over its mesh."""
  graph, state = jit_operands(graphdef, params)
  if shard is None:
    return _window_probabilities(graph, state, features, spans)
  return _window_probabilities(graph, state, features, spans, shard=shard)
