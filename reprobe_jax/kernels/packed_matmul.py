"""y = x @ w for the decode path on CPU, with w pre-packed into column panels (`decode.cc`).

Why: a decode step at batch B multiplies B rows by every weight. XLA:CPU's dots read a weight at about one core's
streaming rate at B = 1 and re-pack it on every call at B = 8-32, so a batch-8 step of SmolLM2-135M took twice the
time of a batch-1 step while reading the same bytes (docs/performance.md). Packed once, a weight is read as one
contiguous stream per panel, by all cores, once per call whatever B is.

`pack(w)` turns a [K, N] weight into [P, K, PANEL] panels (P = ceil(N / PANEL), zero-padded); `packed_matmul(x, wp,
n)` runs the compiled kernel (float32, CPU) on x [..., K] with at most MAX_ROWS rows; `reference_packed_matmul` is
the same product in XLA, for tests (without the kernel the model multiplies its own unpacked weights). Who packs what is
decided in `reprobe_jax.models.transformer.with_packed_weights` (models whose matmul weights exceed MIN_MODEL_BYTES,
float32, one CPU device).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from reprobe_jax.kernels.build import Built, build

PANEL = 32  # columns per panel (two 16-float vectors in the kernel)
# Rows up to which the decode path uses the kernel: on a 2-core AMD EPYC (Zen 4) a 30-layer chain of SmolLM2's
# projection shapes ran 1.33x / 1.92x / 1.47x / 1.15x XLA's dots at 1 / 8 / 32 / 128 rows
# (`python -m bench.chain --m=1,8,32,128 --packed`, docs/kernels.md).
MAX_ROWS = 128
# Models whose matmul weights are smaller than this (the built-in 0.9M-parameter target) keep XLA's dots: their
# weights stay in cache, where XLA's dots are not the bottleneck, and their numerics (and the shipped bands) stay.
MIN_MODEL_BYTES = 64 << 20

_SOURCE, _SYMBOL, _TARGET = "decode.cc", "ReprobePackedMatmul", "reprobe_packed_matmul"


def status() -> Built:
  """The kernel's build (built on the first call): its FFI target, or why there is none and whether that is a
  failed build (`Built.failed`) or what this machine lacks."""
  return build(_SOURCE, _SYMBOL, _TARGET)


def available() -> bool:
  """True when the kernel is compiled and registered (built on the first call)."""
  return status().target is not None


def unavailable_reason() -> str:
  """Why the kernel is not available ('' when it is)."""
  return status().reason


def pack(w: jax.Array) -> jax.Array:
  """[K, N] -> [ceil(N / PANEL), K, PANEL]: panel p holds columns [p * PANEL, (p + 1) * PANEL), zero past N."""
  if w.ndim != 2:
    raise ValueError(f"pack: a [K, N] weight expected, got shape {w.shape}")
  k, n = w.shape
  p = -(-n // PANEL)
  w = jnp.pad(w, ((0, 0), (0, p * PANEL - n)))
  return w.reshape(k, p, PANEL).transpose(1, 0, 2)


def _check(x, wp, n: int) -> tuple[int, int]:
  if wp.ndim != 3 or wp.shape[2] != PANEL or x.shape[-1] != wp.shape[1]:
    raise ValueError(f"packed_matmul: x [..., K] and wp [P, K, {PANEL}] expected, got {x.shape} and {wp.shape}")
  if not (wp.shape[0] - 1) * PANEL < n <= wp.shape[0] * PANEL:
    raise ValueError(f"packed_matmul: n={n} does not match {wp.shape[0]} panels of {PANEL}")
  return math.prod(x.shape[:-1]), x.shape[-1]


def reference_packed_matmul(x: jax.Array, wp: jax.Array, n: int) -> jax.Array:
  """x @ w from the packed w, in XLA: [..., K] -> [..., n]."""
  _check(x, wp, n)
  y = jnp.einsum("...k,pkc->...pc", x, wp)
  return y.reshape(*x.shape[:-1], wp.shape[0] * PANEL)[..., :n]


def packed_matmul(x: jax.Array, wp: jax.Array, n: int) -> jax.Array:
  """x @ w through the compiled kernel: x [..., K] float32 with at most MAX_ROWS rows, wp from `pack`.

  Each row's result depends on that row alone and is summed in one order, so it is bit-identical at any number of
  rows. Raises if the kernel is unavailable: callers decide with `available()` first."""
  rows, k = _check(x, wp, n)
  if x.dtype != jnp.float32 or wp.dtype != jnp.float32:
    raise ValueError(f"packed_matmul: float32 only, got {x.dtype} and {wp.dtype}")
  if rows > MAX_ROWS:
    raise ValueError(f"packed_matmul: {rows} rows, at most MAX_ROWS={MAX_ROWS}")
  built = status()
  if built.target is None:
    raise RuntimeError(f"packed_matmul kernel unavailable: {built.reason}")
  call = jax.ffi.ffi_call(built.target, jax.ShapeDtypeStruct((rows, n), jnp.float32), vmap_method="sequential")
  return call(x.reshape(rows, k), wp).reshape(*x.shape[:-1], n)
