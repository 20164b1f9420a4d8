"""Sharding by logical axis names: one rules table maps names to mesh axes (maxtext style).

Parameters carry `logical_axes` metadata (e.g. ('embed', 'mlp')); activations are constrained with
`constrain(x, ('batch', 'seq', 'embed'), ctx)`. A dimension that the mesh axes do not divide is replicated instead
of failing, so tiny test models run on any mesh.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or tuple of mesh axes, or None = replicated).
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("seq", None),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
    ("layers", None),
    ("cache_seq", None),
)


@dataclasses.dataclass(frozen=True)
class ShardingCtx:
  """A mesh plus the rules table; hashable, so it can be a static jit argument."""

  mesh: Mesh
  rules: tuple[tuple[str, str | tuple[str, ...] | None], ...] = DEFAULT_RULES

  def spec(self, names: Sequence[str | None], shape: Sequence[int] | None = None) -> P:
    table = dict(self.rules)
    axes = []
    used: set[str] = set()
    for i, name in enumerate(names):
      target = table.get(name) if name is not None else None
      if target is None:
        axes.append(None)
        continue
      group = (target,) if isinstance(target, str) else tuple(target)
      group = tuple(a for a in group if a in self.mesh.shape and a not in used)
      size = int(np.prod([self.mesh.shape[a] for a in group])) if group else 1
      if not group or size == 1 or (shape is not None and shape[i] % size):
        axes.append(None)
        continue
      used.update(group)
      axes.append(group if len(group) > 1 else group[0])
    return P(*axes)

  def sharding(self, names: Sequence[str | None], shape: Sequence[int] | None = None) -> NamedSharding:
    return NamedSharding(self.mesh, self.spec(names, shape))


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh over all devices; -1 takes what the other two leave."""
  n = len(devices) if devices is not None else jax.device_count()
  sizes = [data, fsdp, tensor]
  if sizes.count(-1) > 1:
    raise ValueError("at most one mesh axis may be -1")
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if n % known:
      raise ValueError(f"{n} devices do not divide into fsdp*tensor={known}")
    sizes[sizes.index(-1)] = n // known
  if int(np.prod(sizes)) != n:
    raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {int(np.prod(sizes))} devices, have {n}")
  # Auto axes: sharding follows with_sharding_constraint (GSPMD); jax.make_mesh defaults to Explicit axes.
  axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  if devices is not None:
    return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES, axis_types=axis_types)
  return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=axis_types)


def constrain(x, names: Sequence[str | None], ctx: ShardingCtx | None):
  """with_sharding_constraint by logical names; identity without a mesh."""
  if ctx is None:
    return x
  return jax.lax.with_sharding_constraint(x, ctx.sharding(names, x.shape))


def maybe_initialize_distributed() -> bool:
  """Calls `jax.distributed.initialize()` once, only on multi-host runs (Cloud TPU pods, SLURM, or
  JAX_COORDINATOR_ADDRESS set); a single host, a laptop or Colab is left alone. Returns whether it initialised."""
  multi_host = any(k in os.environ for k in ("JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "TPU_WORKER_HOSTNAMES",
                                             "MEGASCALE_COORDINATOR_ADDRESS"))
  if not multi_host:
    return False
  if jax.distributed.is_initialized():
    return False
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  if "TPU_WORKER_HOSTNAMES" in os.environ and "," not in hosts and not os.environ.get("JAX_COORDINATOR_ADDRESS"):
    return False  # a single-host TPU VM
  jax.distributed.initialize()
  logging.info("jax.distributed initialised: process %d of %d", jax.process_index(), jax.process_count())
  return True
