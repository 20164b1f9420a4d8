"""Sharding by logical axis names: one rules table maps names to mesh axes (maxtext style).

Parameters carry `logical_axes` metadata (e.g. ('embed', 'mlp')); activations are constrained with
`constrain(x, ('batch', 'seq', 'embed'), ctx)`. A dimension that the mesh axes do not divide is replicated instead
of failing, so tiny test models run on any mesh.

Multi-process jobs (several hosts of a TPU pod slice or a GPU cluster, or several processes on one machine):
`maybe_initialize_distributed` joins them, checking their settings first so that a misconfigured job stops with a
DistributedError instead of hanging; `to_host` brings arrays that span processes back to every host, `barrier`
lines the processes up (docs/scale.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from typing import Any, Mapping, Sequence

import jax
from jax.experimental import multihost_utils
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from reprobe_jax.errors import DistributedError

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


def constrain_rows(tree, ctx: ShardingCtx | None, *, put: bool = False):
  """Each array of a pytree by its rows (axis 0 'batch'); device_put when put=True (docs/scale.md, data-parallel)."""
  rows = lambda x: ctx.sharding((("batch",) + (None,) * x.ndim)[: x.ndim], x.shape)
  place = jax.device_put if put else jax.lax.with_sharding_constraint
  return tree if ctx is None else jax.tree.map(lambda x: place(x, rows(x)), tree)


# ------------------------------------------------------------------------------------------------ multi-process

# The settings of a multi-process job and the environment variables they are read from when not given.
ENV_VARS = (
  ("coordinator_address", "JAX_COORDINATOR_ADDRESS"),
  ("num_processes", "JAX_NUM_PROCESSES"),
  ("process_id", "JAX_PROCESS_ID"),
  ("local_device_ids", "JAX_LOCAL_DEVICE_IDS"),
)
_CORE = ("coordinator_address", "num_processes", "process_id")
_GRACE_S = 5  # how much longer than process 0 the others wait for its verdict


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """How this process joins a multi-process job (`maybe_initialize_distributed`). A field left None is read from its
  environment variable (ENV_VARS), else left to jax's own detection (Cloud TPU pod slices, SLURM). `where` prefixes
  the field names in messages ('--' for the CLI's flags). The given fields are checked here (DistributedError), by
  the rules that `maybe_initialize_distributed` applies to the environment's values too; local_device_ids may be
  given as strings (an absl list flag)."""

  coordinator_address: str | None = None  # 'host:port' of process 0
  num_processes: int | None = None
  process_id: int | None = None
  local_device_ids: tuple[int, ...] | None = None  # the accelerators this process drives (default: all it sees)
  timeout_s: int = 300  # for every process to reach the coordinator, and again for jax's own start-up
  where: str = "DistributedConfig."

  def __post_init__(self):
    if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, int) or self.timeout_s < 1:
      raise DistributedError(f"{self.where}timeout_s: expected an int >= 1 (seconds), got {self.timeout_s!r}")
    for name, _ in ENV_VARS:
      if getattr(self, name) is not None:
        object.__setattr__(self, name, _parse(name, getattr(self, name), f"{self.where}{name}"))


def maybe_initialize_distributed(
  cfg: DistributedConfig | None = None, *, environ: Mapping[str, str] | None = None
) -> bool:
  """Joins this process to a multi-process job (`jax.distributed.initialize`), once, and only when there is one:
  settings in `cfg` or the environment (ENV_VARS: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID,
  JAX_LOCAL_DEVICE_IDS), or a cluster that jax detects by itself (a Cloud TPU pod slice, a SLURM job of several
  tasks). A single host, a laptop or Colab is left alone. Returns whether it initialised; call it before anything
  runs on a device.

  A misconfigured job stops on every process within `cfg.timeout_s` with a DistributedError naming the setting and
  where it came from, instead of hanging or aborting: a coordinator address, count or id that is missing or
  malformed, a process id outside [0, num_processes), processes started with different counts or the same id, fewer
  processes than num_processes, a coordinator nobody reaches. With all three settings known, a rendezvous on the
  coordinator's port checks this before jax's own start-up (which aborts the process on a timeout, it does not
  raise); a detected cluster's settings are jax's own and go to it unchecked.
  """
  cfg = cfg or DistributedConfig()
  environ = os.environ if environ is None else environ
  if jax.distributed.is_initialized():
    return False
  given = _settings(cfg, environ)
  cluster = _detected_cluster(environ)
  shown = ", ".join(f"{label}={value}" for value, label in given.values()) or "no settings"
  if not any(name in given for name in _CORE):
    if cluster is None:
      return False
    return _initialize(given, cfg.timeout_s, f"{cluster}, {shown}")
  missing = [name for name in _CORE if name not in given]
  if missing and cluster is None:
    wanted = ", ".join(f"{cfg.where}{name} (or {dict(ENV_VARS)[name]})" for name in missing)
    raise DistributedError(
      f"a multi-process job needs its coordinator address, process count and process id; {shown} given, {wanted} not"
    )
  n, n_label = given.get("num_processes", (None, ""))
  pid, pid_label = given.get("process_id", (None, ""))
  if n is not None and pid is not None and pid >= n:
    raise DistributedError(f"{pid_label}={pid} is outside [0, {n}) ({n_label}={n})")
  if n == 1:
    logging.info("jax.distributed: one process (%s), nothing to join", n_label)
    return False
  if _backends_started():
    raise DistributedError(
      "jax.distributed must start before anything runs on a device, and something already "
      "did: call maybe_initialize_distributed() first"
    )
  if not missing:
    _rendezvous(given["coordinator_address"][0], n, pid, cfg.timeout_s)
  return _initialize(given, cfg.timeout_s, shown if cluster is None else f"{cluster}, {shown}")


def _settings(cfg: DistributedConfig, environ: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
  """{field: (value, where it came from)} of each setting given in `cfg` or else in its environment variable;
  DistributedError naming the first that is malformed."""
  out = {}
  for name, var in ENV_VARS:
    value, label = getattr(cfg, name), f"{cfg.where}{name}"
    if value is None:
      value, label = environ.get(var, "").strip() or None, var
    if value is not None:
      out[name] = (_parse(name, value, label), label)
  return out


def _parse(name: str, value, label: str):
  """A setting's value checked (and read from its string form when it came from the environment)."""
  if name == "coordinator_address":
    host, _, port = str(value).rpartition(":")
    if not isinstance(value, str) or not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise DistributedError(f"{label}={value!r}: expected 'host:port' (the address of process 0, a port in 1..65535)")
    return value
  if name == "local_device_ids":
    items = value.split(",") if isinstance(value, str) else value
    try:
      ids = tuple(int(i) for i in items if not isinstance(i, bool))
    except (TypeError, ValueError):
      ids = None
    if ids is None or not ids or len(ids) != len(list(items)) or min(ids) < 0 or len(set(ids)) != len(ids):
      raise DistributedError(f"{label}={value!r}: expected distinct device indices >= 0 (e.g. 0,1,2,3)")
    return ids
  low = 1 if name == "num_processes" else 0
  try:
    v = int(value) if isinstance(value, str) else value
  except ValueError:
    v = None
  if isinstance(v, bool) or not isinstance(v, int) or v < low:
    raise DistributedError(f"{label}={value!r}: expected an int >= {low}")
  return v


def _detected_cluster(environ: Mapping[str, str]) -> str | None:
  """What jax.distributed would find by itself, when it is a job of several processes."""
  if environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return "a multi-slice TPU job"
  if "," in environ.get("TPU_WORKER_HOSTNAMES", ""):  # one name: a single-host TPU VM
    return "a Cloud TPU pod slice"
  tasks = environ.get("SLURM_NTASKS", environ.get("SLURM_NPROCS", ""))
  if environ.get("SLURM_JOB_ID") and tasks.isdigit() and int(tasks) > 1:
    return f"a SLURM job of {tasks} tasks"
  return None


def _backends_started() -> bool:
  # A private module, so imported only here, where a multi-process start asks (as jax.distributed.initialize does).
  from jax._src import xla_bridge

  return bool(getattr(xla_bridge, "backends_are_initialized", lambda: False)())


def _initialize(given: dict[str, tuple[Any, str]], timeout_s: int, shown: str) -> bool:
  kwargs = {name: value for name, (value, _) in given.items()}
  if "local_device_ids" in kwargs:
    kwargs["local_device_ids"] = list(kwargs["local_device_ids"])
  try:
    jax.distributed.initialize(**kwargs, initialization_timeout=timeout_s)
  except (RuntimeError, ValueError, TypeError) as e:  # what jax raises on settings it cannot use
    raise DistributedError(f"jax.distributed.initialize ({shown}): {' '.join(str(e).split())}") from None
  logging.info("jax.distributed initialised: process %d of %d (%s)", jax.process_index(), jax.process_count(), shown)
  return True


def _rendezvous(address: str, num_processes: int, process_id: int, timeout_s: int) -> None:
  """Every process meets process 0 on the coordinator's port before jax starts there: process 0 listens, the
  others connect and send (num_processes, process_id), process 0 answers all of them 'ok' once each id in
  [1, num_processes) has arrived with its own count, or else the first thing wrong. DistributedError on a mismatch,
  and when the others do not all arrive (process 0) or process 0 cannot be reached (the others) within timeout_s.
  A process waits for the answer up to timeout_s (and a little more) after it connected, which is past process 0's
  own deadline, so it hears process 0's verdict."""
  host, port = address.rpartition(":")[0].strip("[]"), int(address.rpartition(":")[2])
  if process_id == 0:
    _coordinate(port, num_processes, timeout_s, address)
    return
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      conn = socket.create_connection((host, port), timeout=max(min(1.0, deadline - time.monotonic()), 0.05))
      break
    except OSError as e:
      if time.monotonic() >= deadline:
        raise DistributedError(
          f"process {process_id} of {num_processes}: no coordinator at {address} within "
          f"{timeout_s} s ({e.strerror or e}); is process 0 running, with that address and "
          "port, and can this host reach it?"
        ) from None
      time.sleep(0.1)
  with conn:
    conn.settimeout(timeout_s + _GRACE_S)
    try:
      conn.sendall(json.dumps({"num_processes": num_processes, "process_id": process_id}).encode() + b"\n")
      answer = _read_line(conn)
    except OSError:
      answer = None
  if not isinstance(answer, dict) or ("error" not in answer and answer.get("ok") is not True):
    raise DistributedError(
      f"process {process_id} of {num_processes}: the coordinator at {address} did not answer "
      f"within {timeout_s + _GRACE_S} s (is it another service's port?)"
    )
  if "error" in answer:
    raise DistributedError(
      f"process {process_id} of {num_processes}: the coordinator at {address} refused the job: {answer['error']}"
    )


def _coordinate(port: int, n: int, timeout_s: int, address: str) -> None:
  """Process 0's half of `_rendezvous`."""
  family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
  try:
    server = socket.create_server(("", port), family=family, dualstack_ipv6=family == socket.AF_INET6)
  except OSError as e:
    raise DistributedError(
      f"process 0: cannot listen on port {port} of {address} ({e.strerror or e}); is "
      "another job using it, or another process started with process_id=0?"
    ) from None
  deadline = time.monotonic() + timeout_s
  peers: dict[int, socket.socket] = {}
  extra: list[socket.socket] = []  # connections that claimed a taken id or another count: they hear the error
  error = None
  with server:
    while len(peers) < n - 1 and error is None:
      left = deadline - time.monotonic()
      if left <= 0:
        absent = sorted(set(range(1, n)) - set(peers))
        error = (
          f"{len(peers) + 1} of num_processes={n} processes reached the coordinator {address} within "
          f"{timeout_s} s; process id(s) {absent} did not (fewer processes started than num_processes, or "
          "they cannot reach this address)"
        )
        break
      server.settimeout(left)
      try:
        conn, _ = server.accept()
        conn.settimeout(max(deadline - time.monotonic(), 1.0))
        claim = _read_line(conn)
      except OSError:  # the accept timed out, or a connection broke before it said anything
        continue
      if not isinstance(claim, dict):  # not one of ours (a port scan, a health check)
        conn.close()
        continue
      their_n, their_id = claim.get("num_processes"), claim.get("process_id")
      if their_n != n:
        error = (
          f"process {their_id} was started with num_processes={their_n}, process 0 with {n}; every process "
          "needs the same count"
        )
      elif their_id in peers or their_id == 0 or not isinstance(their_id, int) or not 0 < their_id < n:
        error = f"two processes were started with process_id={their_id}; each needs its own id in [0, {n})"
      if error is None:
        peers[their_id] = conn
      else:
        extra.append(conn)
    answer = json.dumps({"error": error} if error else {"ok": True}).encode() + b"\n"
    for conn in [*peers.values(), *extra]:
      with conn:
        try:
          conn.sendall(answer)
          conn.settimeout(1.0)
          conn.recv(1)  # the other side closes first, so the port is not left in TIME_WAIT here for jax to bind
        except OSError:
          pass
  if error:
    raise DistributedError(f"process 0: {error}")


def _read_line(conn: socket.socket, limit: int = 4096):
  """One JSON line from a socket (None if it is not one)."""
  data = b""
  while not data.endswith(b"\n") and len(data) < limit:
    chunk = conn.recv(limit)
    if not chunk:
      break
    data += chunk
  try:
    return json.loads(data.decode())
  except (UnicodeDecodeError, ValueError):
    return None


def to_host(tree):
  """numpy copies of a pytree of arrays. An array that spans other processes' devices is all-gathered, so on a
  multi-process job every process must call this at the same point (as each called the computation that made the
  array); on one process it is `jax.device_get`."""
  leaves, treedef = jax.tree.flatten(tree)
  spanning = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and not x.is_fully_addressable]
  if spanning:
    gathered = multihost_utils.process_allgather([leaves[i] for i in spanning], tiled=True)
    for i, value in zip(spanning, gathered):
      leaves[i] = value
  return jax.tree.unflatten(treedef, jax.device_get(leaves))


def barrier(name: str) -> None:
  """Waits until every process of the job has reached `barrier(name)` (the same name); a no-op on one process."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def spans_processes(tree) -> bool:
  """Whether any array of `tree` lives partly on another process's devices (then every process must run each
  computation on it together)."""
  return any(isinstance(x, jax.Array) and not x.is_fully_addressable for x in jax.tree.leaves(tree))


def failed_processes(failed: bool) -> list[int]:
  """The ids of the processes that say `failed` here; every process of the job must call it at the same point
  (it is a barrier too), so that one that stopped on an error does not leave the others waiting for it forever."""
  if jax.process_count() == 1:
    return [0] if failed else []
  flags = multihost_utils.process_allgather(np.asarray([failed], np.int32), tiled=True)  # [processes]
  return [i for i, f in enumerate(np.asarray(flags).reshape(-1)) if f]


def as_global(tree):
  """On a multi-process job, the arrays of `tree` that each process holds whole on its own devices (with the same
  values everywhere: a probe's parameters and optimiser state) as global arrays replicated over every device of the
  job, which orbax saves once; ShapeDtypeStructs (restore targets) get that sharding too. Arrays that already span
  processes, and everything on one process, are left as they are. `as_local` undoes it."""
  if jax.process_count() == 1:
    return tree
  everywhere = NamedSharding(Mesh(np.asarray(jax.devices()), ("processes",)), P())

  def one(x):
    if isinstance(x, jax.ShapeDtypeStruct) and (x.sharding is None or x.sharding.is_fully_addressable):
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=everywhere)
    if isinstance(x, jax.Array) and x.is_fully_addressable:
      host = np.asarray(x)  # each process puts its own copy on its devices (device_put would first compare them)
      return jax.make_array_from_callback(host.shape, everywhere, lambda index: host[index])
    return x

  return jax.tree.map(one, tree)


def as_local(tree, like):
  """The arrays of `tree` that `as_global` replicated, back on the process-local shardings of `like` (arrays or
  ShapeDtypeStructs of the same structure); `tree` itself on one process."""
  if jax.process_count() == 1:
    return tree

  def one(x, ref):
    home = getattr(ref, "sharding", None)
    if isinstance(x, jax.Array) and not x.is_fully_addressable and home is not None and home.is_fully_addressable:
      return jax.device_put(x.addressable_data(0), home)
    return x

  return jax.tree.map(one, tree, like)
