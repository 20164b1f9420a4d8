"""One compiled program per RL step's update (docs/method.md §B2): old log-probabilities, the reference's, and every
mini-batch's clipped-loss update, with no host sync between them; data parallel or FSDP over a mesh.

`make_step_update` reads the old log-probabilities with the parameters it is given (the rollout's): the first
mini-batch reuses its own forward for them (its parameters have not moved yet, so r = 1 there by construction), the
others are read once up front. A `lax.scan` then runs each mini-batch's micro-batched update (`loss.update_core`).
With a mesh whose 'fsdp' (or 'tensor') axis is above 1, the parameters and optimizer state are placed by their
`logical_axes` metadata under `models.sharding.DEFAULT_RULES` and the rows over ('data', 'fsdp'): XLA gathers each
weight where it is used and reduce-scatters its gradient. A pure 'data' mesh stays data parallel (parameters
replicated, rows over 'data'), as `loss.make_update` is.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from reprobe_jax.errors import ConfigError
from reprobe_jax.fields import Int
from reprobe_jax.models.sharding import DEFAULT_RULES, ShardingCtx
from reprobe_jax.rl.loss import LossConfig, batch_counts, chunked_logprobs, update_core
from reprobe_jax.rl.types import PolicyBatch


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where a step's arrays live on `mesh` (None: one device): `shard` is the model's ShardingCtx, `axes` the mesh
  axes the rows are split over, `fsdp` whether parameters are sharded by their logical axes (else replicated)."""

  mesh: Mesh | None
  shard: ShardingCtx | None
  axes: tuple[str, ...]
  fsdp: bool

  @classmethod
  def of(cls, mesh: Mesh | None, where: str) -> "Placement":
    if mesh is None:
      return cls(None, None, ("data",), False)
    if "data" not in mesh.shape:
      raise ConfigError(f"{where}.mesh: expected a mesh with a 'data' axis, got axes {tuple(mesh.shape)}")
    if all(mesh.shape.get(a, 1) == 1 for a in ("fsdp", "tensor")):  # data parallel, as make_update
      rules = tuple((name, "data" if name == "batch" else None) for name, _ in DEFAULT_RULES)
      return cls(mesh, ShardingCtx(mesh, rules), ("data",), False)
    axes = ("data", "fsdp") if "fsdp" in mesh.shape else ("data",)
    return cls(mesh, ShardingCtx(mesh, DEFAULT_RULES), axes, True)

  @property
  def devices(self) -> int:
    """How many row shards there are."""
    return 1 if self.mesh is None else int(np.prod([self.mesh.shape[a] for a in self.axes]))

  def rows(self, lead: int = 0) -> NamedSharding:
    """[(lead axes,) B, ...] arrays with B split over the row axes."""
    return NamedSharding(self.mesh, P(*(None,) * lead, self.axes if len(self.axes) > 1 else self.axes[0]))

  def params(self, params):
    """The parameters' shardings (a tree like `params`): by logical axes under FSDP, else replicated."""
    repl = NamedSharding(self.mesh, P())
    if not self.fsdp:
      return jax.tree.map(lambda _: repl, params)
    variables = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    specs = []
    for v in variables:
      shape = v.get_value().shape if isinstance(v, nnx.Variable) else v.shape
      axes = v.get_metadata().get("logical_axes") if isinstance(v, nnx.Variable) else None
      specs.append(self.shard.sharding(axes or (None,) * len(shape), shape))
    return jax.tree.unflatten(jax.tree.structure(params), specs)

  def opt_state(self, opt_state, params):
    """The optimizer state's shardings: a leaf whose path ends with a parameter's path and has its shape (Adam's
    moments) is placed as that parameter; the rest (counts, scalars) replicated."""
    repl = NamedSharding(self.mesh, P())
    if not self.fsdp:
      return jax.tree.map(lambda _: repl, opt_state)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    by_path = {tuple(path): (x.shape, s) for (path, x), s in zip(flat, jax.tree.leaves(self.params(params)))}
    depth = {len(k) for k in by_path}

    def place(path, x):
      for d in depth:
        hit = by_path.get(tuple(path[-d:]))
        if hit is not None and hit[0] == getattr(x, "shape", None):
          return hit[1]
      return repl

    return jax.tree_util.tree_map_with_path(place, opt_state)


def make_step_update(
  graph,
  tx: optax.GradientTransformation,
  cfg: LossConfig,
  *,
  mini_batches: int,
  micro_batches: int,
  mesh: Mesh | None = None,
  with_ref: bool = False,
  unroll: bool = False,
):
  """One jitted, donated program for an RL step's whole update:

      step(params, opt_state, tokens, attention_mask, response_mask, advantages[, ref_params])
        -> (params, opt_state, metrics)

  tokens, attention_mask [B, P + T] int (prompt left-padded to P columns, then the response right-padded);
  response_mask [B, T] (1 on trained response tokens); advantages [B, T] float32 (read on the mask only);
  ref_params (only with `with_ref`, required when cfg.kl_coef > 0): the frozen reference's parameters, not donated.
  params and opt_state are the rollout's parameters and the optimizer state, donated (pass a copy of what is still
  needed). The old log-probabilities (and the reference's) are computed inside with the parameters given; then
  mini-batch m = rows [m * B / M, (m + 1) * B / M) (M = mini_batches, B divisible by M) takes one optimizer update
  as `loss.make_update` does (micro_batches micro-batches of gradient accumulation, divided by that mini-batch's
  own token and row counts), in order, in one `lax.scan`. metrics: `make_update`'s keys, each a float32 array
  [mini_batches] (mini-batch m's values; fetch once after the step). One compile per shape (B, P + T, T);
  nothing value-like is static. With `mesh` ('data', and optionally 'fsdp'/'tensor' axes of
  `models.make_mesh`): the rows are split over the mesh's row axes (`Placement`), every micro-batch of
  B / (M x micro_batches) rows divisible by them; parameters and opt_state come back sharded as they are kept
  (`Placement.params`, `Placement.opt_state`), metrics replicated. unroll: loops unrolled (`update_flops`)."""
  for name, v in (("mini_batches", mini_batches), ("micro_batches", micro_batches)):
    if not Int(1).ok(v):
      raise ConfigError(f"make_step_update.{name}: expected {Int(1)}, got {v!r}")
  if with_ref != (cfg.kl_coef > 0):
    raise ConfigError(
      f"make_step_update.with_ref={with_ref}: the reference's parameters are read exactly when LossConfig.kl_coef > 0 "
      f"(kl_coef={cfg.kl_coef})"
    )
  place = Placement.of(mesh, "make_step_update")
  core = update_core(
    graph, tx, cfg, micro_batches=micro_batches, shard=place.shard, mesh=mesh, axes=place.axes, unroll=unroll
  )
  lp = functools.partial(chunked_logprobs, graph, shard=place.shard, mesh=mesh, axes=place.axes, unroll=unroll)
  m = mini_batches

  def step(params, opt_state, tokens, attention_mask, response_mask, advantages, ref_params=None):
    b, t = response_mask.shape
    if b % m:
      raise ConfigError(f"make_step_update: mini_batches={m} must divide the batch of {b} rows")
    per = b // m
    resp = response_mask.astype(jnp.float32)
    old = jnp.zeros((b, t), jnp.float32)  # mini-batch 0 reads its own forward ('fresh')
    if m > 1:
      rest = lp(params, tokens[per:], attention_mask[per:], resp[per:], chunks=(m - 1) * micro_batches)
      old = old.at[per:].set(rest)
    ref = jnp.zeros((b, t), jnp.float32)
    if with_ref:
      ref = lp(ref_params, tokens, attention_mask, resp, chunks=m * micro_batches)
    batch = PolicyBatch(tokens, attention_mask, resp, old, advantages.astype(jnp.float32) * resp, ref)
    minis = jax.tree.map(lambda x: x.reshape(m, per, *x.shape[1:]), batch)  # [M, B / M, ...]
    if mesh is not None:
      minis = jax.lax.with_sharding_constraint(minis, place.rows(lead=1))

    def body(carry, xs):
      mb, fresh = xs
      params, opt_state, metrics = core(*carry, mb, *batch_counts(mb), fresh)  # the mini-batch's own counts
      return (params, opt_state), metrics

    (params, opt_state), metrics = jax.lax.scan(
      body, (params, opt_state), (minis, jnp.arange(m) == 0), unroll=m if unroll else 1
    )
    return params, opt_state, metrics

  return _StepProgram(step, place, with_ref)


class _StepProgram:
  """The jitted step; on a mesh its shardings are derived from the first call's parameters and optimizer state,
  and every call first puts its arguments there (a no-op for arrays already placed), so the first call's outputs
  feed the second without a compile. `lower` and `_cache_size` are the jitted function's."""

  def __init__(self, step, place: Placement, with_ref: bool):
    self.step, self.place, self.with_ref = step, place, with_ref
    self._jitted, self._shardings = None, None
    if place.mesh is None:
      self._jitted = jax.jit(step, donate_argnums=(0, 1))

  def _build(self, params, opt_state):
    place = self.place
    ps, os_ = place.params(params), place.opt_state(opt_state, params)
    rows, repl = place.rows(), NamedSharding(place.mesh, P())
    self._shardings = (ps, os_, rows, rows, rows, rows) + ((ps,) if self.with_ref else ())
    self._jitted = jax.jit(
      self.step, donate_argnums=(0, 1), in_shardings=self._shardings, out_shardings=(ps, os_, repl)
    )

  def _args(self, args):
    if len(args) != 6 + self.with_ref:
      raise ConfigError(
        f"make_step_update: expected {6 + self.with_ref} arguments (params, opt_state, tokens, attention_mask, "
        f"response_mask, advantages{', ref_params' if self.with_ref else ''}), got {len(args)}"
      )
    if self.place.mesh is None:
      return args
    if self._jitted is None:
      self._build(args[0], args[1])
    return tuple(jax.device_put(a, s) for a, s in zip(args, self._shardings))

  def __call__(self, *args):
    args = self._args(args)
    return self._jitted(*args)

  def put_params(self, params):
    """`params` (e.g. the frozen reference) placed as the step keeps parameters, once, so that later calls move
    nothing; unchanged without a mesh."""
    if self.place.mesh is None:
      return params
    return jax.device_put(params, self.place.params(params))

  def lower(self, *args):
    args = self._args(args)
    return self._jitted.lower(*args)

  def _cache_size(self) -> int:
    return 0 if self._jitted is None else self._jitted._cache_size()


def update_flops(
  graph,
  tx: optax.GradientTransformation,
  cfg: LossConfig,
  params,
  *,
  rows: int,
  prompt_len: int,
  response_len: int,
  mini_batches: int,
  micro_batches: int,
) -> float:
  """XLA's FLOP count (`compile().cost_analysis()`) of `make_step_update`'s program for a batch of `rows` x
  (prompt_len + response_len) columns on one device: the old (and reference) log-probabilities and every
  mini-batch's update. Counted on the loops unrolled (XLA counts a loop's body once); compiles that twin, nothing
  runs. What bench/rl.py sets against the measured matmul rate."""
  step = make_step_update(
    graph, tx, cfg, mini_batches=mini_batches, micro_batches=micro_batches, with_ref=cfg.kl_coef > 0, unroll=True
  )
  spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)  # noqa: E731
  p = jax.tree.map(spec, params)
  opt = jax.eval_shape(tx.init, p)
  ids = jax.ShapeDtypeStruct((rows, prompt_len + response_len), jnp.int32)
  resp = jax.ShapeDtypeStruct((rows, response_len), jnp.float32)
  args = (p, opt, ids, ids, resp, resp) + ((p,) if cfg.kl_coef > 0 else ())
  cost = step.lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost["flops"])
