"""Timing of calls (first call apart from steady state) and this machine's roofline: matmul peak, memory bandwidth."""

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

  def to_json(self) -> dict:
    # min_s: the least-disturbed repeat, a cross-check when other processes share the cores.
    return {"median_s": self.median_s, "min_s": min(self.times_s), "first_call_s": self.first_s, "xla_compile_s": self.compile_s,
            "xla_compiles": self.compiles,
            "steady_compiles": self.steady_compiles, "times_s": self.times_s, "load_1min": self.load_1min}


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


def _median_time(fn: Callable[[], object], repeats: int) -> float:
  fn()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def matmul_peaks(n: int, repeats: int) -> dict:
  """fp32 n^3 matmul throughput (FLOP/s) of JAX's default backend, NumPy and PyTorch (on its device)."""
  import torch
  rng = np.random.default_rng(0)
  a = rng.standard_normal((n, n), dtype=np.float32)
  b = rng.standard_normal((n, n), dtype=np.float32)
  flops = 2.0 * n**3
  ja, jb = jnp.asarray(a), jnp.asarray(b)
  jdot = jax.jit(jnp.dot)
  dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
  ta, tb = torch.from_numpy(a).to(dev), torch.from_numpy(b).to(dev)

  def tdot():
    torch.mm(ta, tb)
    if dev.type == "cuda":
      torch.cuda.synchronize()

  return {
      "n": n,
      "jax_flops": flops / _median_time(lambda: jdot(ja, jb).block_until_ready(), repeats),
      "numpy_flops": flops / _median_time(lambda: a @ b, repeats),
      "torch_flops": flops / _median_time(tdot, repeats),
  }


def bandwidth(mib: int, repeats: int) -> dict:
  """Memory bandwidth (bytes/s) of a large fp32 copy, counted as bytes read + bytes written (STREAM 'copy')."""
  n = mib * 2**20 // 4
  src = np.ones(n, np.float32)
  dst = np.empty_like(src)
  moved = 2.0 * src.nbytes
  np_copy = moved / _median_time(lambda: np.copyto(dst, src), repeats)
  # One read and one write per element. The input is donated so the output reuses its buffer: a fresh 512 MiB
  # output per call would time page faults, not memory bandwidth.
  inc = jax.jit(lambda v: v + 1.0, donate_argnums=0)
  state = [jnp.ones((n,), jnp.float32)]

  def step():
    state[0] = inc(state[0])
    state[0].block_until_ready()

  jax_copy = moved / _median_time(step, repeats)
  del dst, state
  return {"mib": mib, "numpy_copy_bytes_per_s": np_copy, "jax_copy_bytes_per_s": jax_copy}


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
