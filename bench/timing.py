"""Timing of calls (first call apart from steady state) and this machine's roofline: matmul peaks on the model's own
GEMM shapes and a square one, memory bandwidth of copy, read and GEMV kernels; every roofline figure a best of
several runs."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import dispatch


class _CompileClock:
  """Sums XLA backend compile time (jax.monitoring events), so compile time is measured, not inferred."""

  def __init__(self):
    self.seconds = 0.0
    self.count = 0
    jax.monitoring.register_event_duration_secs_listener(self._on_event)

  def _on_event(self, event, duration, **kwargs):
    if event == dispatch.BACKEND_COMPILE_EVENT:
      self.seconds += duration
      self.count += 1


COMPILE_CLOCK = _CompileClock()


@dataclasses.dataclass
class Timing:
  """first_s: the warm-up call (tracing + compilation + one run); times_s: the steady-state repeats."""

  first_s: float
  times_s: list[float]
  compile_s: float  # XLA compile time during the warm-up call (0 for PyTorch)
  compiles: int
  steady_compiles: int  # compilations during the repeats: should be 0
  load_1min: float  # 1-minute load average right after the repeats

  @property
  def median_s(self) -> float:
    return statistics.median(self.times_s)

  @property
  def min_s(self) -> float:
    """The least-disturbed repeat, a cross-check when other processes share the cores."""
    return min(self.times_s)

  def to_json(self) -> dict:
    return {
      "median_s": self.median_s,
      "min_s": self.min_s,
      "first_call_s": self.first_s,
      "xla_compile_s": self.compile_s,
      "xla_compiles": self.compiles,
      "steady_compiles": self.steady_compiles,
      "times_s": self.times_s,
      "load_1min": self.load_1min,
    }


def time_call(fn: Callable[[], object], repeats: int) -> tuple[Timing, object]:
  """Runs `fn` once to warm up, then `repeats` times. `fn` must block until its result is computed.

  Returns the timing and the last result. Compilations during the repeats are counted too (`steady_compiles`):
  a nonzero count means a recompile in steady state, and the report flags that row's numbers.
  """
  c0, n0 = COMPILE_CLOCK.seconds, COMPILE_CLOCK.count
  t0 = time.perf_counter()
  out = fn()
  first = time.perf_counter() - t0
  c1, n1 = COMPILE_CLOCK.seconds, COMPILE_CLOCK.count
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - t0)
  return Timing(first, times, c1 - c0, n1 - n0, COMPILE_CLOCK.count - n1, os.getloadavg()[0]), out


def best_time(fn: Callable[[], object], repeats: int, *, min_sample_s: float = 2e-3) -> float:
  """Seconds per call of `fn` (which must block), the BEST of `repeats` samples after one warm-up call.

  Best, not median: on shared cores every disturbance only adds time, so the fastest sample is the closest to what
  the machine can do, and a peak taken from it is the least likely to sit below what a later measurement reaches.
  A sample runs `fn` enough times to last `min_sample_s`, so microsecond kernels are not timer noise.
  """
  t0 = time.perf_counter()
  fn()
  once = max(time.perf_counter() - t0, 1e-7)
  inner = max(1, min(1000, int(min_sample_s / once)))
  best = float("inf")
  for _ in range(max(1, repeats)):
    t0 = time.perf_counter()
    for _ in range(inner):
      fn()
    best = min(best, (time.perf_counter() - t0) / inner)
  return best


def threads() -> dict:
  """The thread counts the timings ran with: XLA's CPU intra-op pool (its 'tf_XLAEigen' threads, counted after a
  computation has started them), PyTorch's intra-op threads, and the CPUs this process may run on."""
  import torch

  jnp.dot(jnp.ones((256, 256)), jnp.ones((256, 256))).block_until_ready()
  names = []
  for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ():
    try:
      with open(f"/proc/self/task/{tid}/comm") as f:
        names.append(f.read().strip())
    except OSError:
      pass
  eigen = sum(n.startswith("tf_XLAEigen") for n in names) if names else None
  cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {
    "xla_intra_op": eigen,
    "torch_intra_op": torch.get_num_threads(),
    "torch_inter_op": torch.get_num_interop_threads(),
    "affinity_cpus": cpus,
    "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }


@dataclasses.dataclass(frozen=True)
class Gemm:
  """One weight matmul of the decoder: [m, k] activations times a [k, n] weight; `name` lists every projection of
  that shape ('k_proj/v_proj')."""

  name: str
  m: int
  k: int
  n: int

  @property
  def flops(self) -> float:
    return 2.0 * self.m * self.k * self.n

  def to_json(self) -> dict:
    return {"name": self.name, "m": self.m, "k": self.k, "n": self.n, "flops": self.flops}


def gemm_shapes(cfg, ms) -> list[Gemm]:
  """The decoder's weight GEMMs at each row count in `ms` (prefill: batch * seq; decode: the batch): q, k, v and o
  projections, gate, up and down, the LM head. Projections of equal [k, n] are one entry (their names joined)."""
  d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
  q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
  weights = [
    ("q_proj", d, q),
    ("k_proj", d, kv),
    ("v_proj", d, kv),
    ("o_proj", q, d),
    ("gate_proj", d, f),
    ("up_proj", d, f),
    ("down_proj", f, d),
    ("lm_head", d, cfg.vocab_size),
  ]
  by_shape: dict[tuple[int, int], list[str]] = {}
  for name, k, n in weights:
    by_shape.setdefault((k, n), []).append(name)
  return [Gemm("/".join(names), int(m), k, n) for m in ms for (k, n), names in by_shape.items()]


def _operands(m: int, k: int, n: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  return rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)


def matmul_peaks(shapes: list[Gemm], square_n: int, repeats: int) -> dict:
  """fp32 matmul throughput (FLOP/s), best of `repeats`, of JAX (its default backend) and PyTorch (on its device)
  on each of `shapes` and on a square_n^3 matmul (NumPy too). `peak_flops_per_s` is the max over every figure: a
  lower bound on what the machine can do, so no model FLOP rate should exceed it; `peak_from` names the figure."""
  import torch

  dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  jdot = jax.jit(jnp.dot)

  def measure(m, k, n, with_numpy=False):
    a, b = _operands(m, k, n)
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    ta, tb = torch.from_numpy(a).to(dev), torch.from_numpy(b).to(dev)

    def tdot():
      torch.mm(ta, tb)
      if dev.type == "cuda":
        torch.cuda.synchronize()

    flops = 2.0 * m * k * n
    out = {"jax_flops_per_s": flops / best_time(lambda: jdot(ja, jb).block_until_ready(), repeats)}
    with torch.inference_mode():
      out["torch_flops_per_s"] = flops / best_time(tdot, repeats)
    if with_numpy:
      out["numpy_flops_per_s"] = flops / best_time(lambda: a @ b, repeats)
    return out

  rows = [{**g.to_json(), **measure(g.m, g.k, g.n)} for g in shapes]
  square = {
    "name": "square",
    "m": square_n,
    "k": square_n,
    "n": square_n,
    "flops": 2.0 * square_n**3,
    **measure(square_n, square_n, square_n, with_numpy=True),
  }
  return _peak_summary(
    {"repeats": repeats, "passes": 1, "statistic": "best", "threads": threads(), "shapes": rows, "square": square}
  )


def _peak_summary(peaks: dict) -> dict:
  """`peaks` with its maxima filled in: over every figure (peak_flops_per_s, peak_from) and per framework."""
  every = peaks["shapes"] + [peaks["square"]]
  figures = [
    (v, f"{key.split('_')[0]} {r['name']} M={r['m']}" if r["name"] != "square" else f"{key.split('_')[0]} {r['n']}^3")
    for r in every
    for key, v in r.items()
    if key.endswith("_flops_per_s")
  ]
  peak, source = max(figures)
  return {
    **peaks,
    "jax_peak_flops_per_s": max(r["jax_flops_per_s"] for r in every),
    "torch_peak_flops_per_s": max(r["torch_flops_per_s"] for r in every),
    "peak_flops_per_s": peak,
    "peak_from": source,
  }


def _bandwidth_summary(bw: dict) -> dict:
  bound, source = max((v, f"{kind} ({fw})") for kind, by in bw["kinds"].items() for fw, v in by.items())
  return {**bw, "bound_bytes_per_s": bound, "bound_from": source}


def best_of(first: dict, second: dict) -> dict:
  """Two passes of `matmul_peaks` (or of `bandwidth`) over the same shapes as one: every figure the faster of the
  two, the maxima recomputed. A run measures its bounds at its start and at its end, so that load at one moment
  (other jobs on shared cores) does not leave a bound below what the run's own kernels reach."""
  rate = lambda key: key.endswith("_per_s")
  merge = lambda a, b: {k: max(v, b[k]) if rate(k) else v for k, v in a.items()}
  out = {**first, "repeats": first["repeats"] + second["repeats"], "passes": first["passes"] + second["passes"]}
  if "shapes" in first:
    out["shapes"] = [merge(a, b) for a, b in zip(first["shapes"], second["shapes"], strict=True)]
    out["square"] = merge(first["square"], second["square"])
    return _peak_summary(out)
  out["kinds"] = {
    kind: {fw: max(v, second["kinds"][kind][fw]) for fw, v in by.items()} for kind, by in first["kinds"].items()
  }
  return _bandwidth_summary(out)


def bandwidth(nbytes: int, repeats: int) -> dict:
  """Memory bandwidth (bytes/s), best of `repeats`, of three kinds of kernel over an fp32 buffer of `nbytes`:
  copy (NumPy, JAX: bytes read + bytes written, STREAM 'copy'), read (a sum over the buffer: NumPy, JAX, PyTorch)
  and GEMV (a [1, 1024] row times a [1024, nbytes / 4096] weight, JAX and PyTorch: what a batch-1 decode step
  does to every weight). `bound_bytes_per_s` is the max over all of them (`bound_from` names it).

  A batch-1 decode step reads every weight once and writes almost nothing, so read and GEMV are its kernels;
  copies are kept in the max because any rate the memory system was seen to deliver is one the bound must reach.
  Size the buffer at least as large as the decode's weights (and the last-level cache): a smaller one would let
  the bound run from cache while the decode cannot.
  """
  import torch

  k = 1024
  n = max(k, nbytes // 4 // k * k)  # elements; a multiple of the GEMV's row length
  src = np.ones(n, np.float32)
  size = float(src.nbytes)
  figures: dict[str, dict[str, float]] = {"copy": {}, "read": {}, "gemv": {}}
  dst = np.empty_like(src)
  figures["copy"]["numpy"] = 2 * size / best_time(lambda: np.copyto(dst, src), repeats)
  del dst
  # The input is donated so the output reuses its buffer: a fresh output per call would time page faults.
  inc = jax.jit(lambda v: v + 1.0, donate_argnums=0)
  state = [jnp.ones((n,), jnp.float32)]

  def step():
    state[0] = inc(state[0])
    state[0].block_until_ready()

  figures["copy"]["jax"] = 2 * size / best_time(step, repeats)
  jsum = jax.jit(jnp.sum)
  figures["read"]["jax"] = size / best_time(lambda: jsum(state[0]).block_until_ready(), repeats)
  figures["read"]["numpy"] = size / best_time(lambda: src.sum(), repeats)
  w = state[0].reshape(k, n // k)
  x = jnp.ones((1, k), jnp.float32)
  jgemv = jax.jit(jnp.dot)
  figures["gemv"]["jax"] = size / best_time(lambda: jgemv(x, w).block_until_ready(), repeats)
  del state, w
  t = torch.from_numpy(src)
  tw, tx = t.view(k, n // k), torch.ones((1, k))
  with torch.inference_mode():
    figures["read"]["torch"] = size / best_time(lambda: t.sum(), repeats)
    figures["gemv"]["torch"] = size / best_time(lambda: torch.mm(tx, tw), repeats)
  del src, t, tw
  return _bandwidth_summary(
    {"bytes": int(size), "repeats": repeats, "passes": 1, "statistic": "best", "kinds": figures}
  )


def forward_flops(cfg, batch: int, seq: int) -> float:
  """Model FLOPs of a causal forward over [batch, seq]: weight matmuls, the LM head, and causal attention
  (QK^T and PV over keys <= query only, the useful work whatever an implementation computes)."""
  d, f, h, kv, hd = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  per_token = cfg.num_layers * 2 * (d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * f) + 2 * d * cfg.vocab_size
  attention = cfg.num_layers * 4 * h * hd * seq * (seq + 1) / 2
  return batch * (seq * per_token + attention)


def decode_param_bytes(lm) -> int:
  """Parameter bytes one batch-1 decode step must read: every weight once; an untied embedding table is only
  gathered (one row), a tied one is read whole as the LM head."""
  leaves = jax.tree.leaves(lm.params)
  total = sum(x.size * x.dtype.itemsize for x in leaves)
  if not lm.config.tie_word_embeddings:
    emb = lm.params["embed_tokens"]
    emb = emb.get_value() if hasattr(emb, "get_value") else emb
    total -= emb.size * emb.dtype.itemsize
  return int(total)
