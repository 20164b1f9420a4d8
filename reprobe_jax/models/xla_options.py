"""XLA compiler options for the decode-path programs (prefill, decode, force, fork, `extend`, the step-level search,
SPAE's probes): one place, so every jitted program that decodes compiles the same way.

XLA:CPU (jaxlib 0.10) hands dots, elementwise ops and reductions to YNNPACK fusions by default. Inside a decode step
at batch 8-32 the small non-dot ones are slow: the profile (docs/kernels.md) of SmolLM2-135M's batch-32 decode loop
(per-thunk trace, Intel Xeon, 2 cores) spent 32 ms per step in the RMSNorms' [32, 576] mean-of-squares reductions alone
(61 YNNPACK calls of about 0.5 ms) and about 30 ms in the softmax reductions over a 96-slot cache. Keeping YNNPACK
for the dots only (`LIBRARY_FUSION_TYPE_DOT`) lets XLA's own emitter fuse the rest. Greedy tokens are unchanged
(tests/test_xla_options.py); the gain is measured in docs/performance.md.

JAX accepts compiler options on top-level jits only, so `decode_jit` makes each decode-path function twice: the
entry (`decoding.decode`, with the options) that host code calls, and its twin (`decoding.decode_in_jit`, XLA's
defaults) for calls from inside another jitted program, which then compiles under that program's options.

The option is a `DebugOptions` field, accepted on every backend (GPUs and TPUs ignore `xla_cpu_*` fields), but a
jaxlib without the field rejects it at compile time, so it is set only on the jaxlib line it was measured on.
`REPROBE_JAX_XLA_DEFAULTS=1` in the environment turns it off (XLA's defaults everywhere).
"""

from __future__ import annotations

import os

import jax
import jaxlib

YNN_FUSION_OPTION = "xla_cpu_experimental_ynn_fusion_type"
YNN_DOTS_ONLY = "LIBRARY_FUSION_TYPE_DOT"
MEASURED_JAXLIB = (0, 10)  # the jaxlib minor line whose XLA:CPU has the option and was measured (bench/)


def _jaxlib_version() -> tuple[int, ...]:
  parts = []
  for p in jaxlib.__version__.split(".")[:3]:
    digits = "".join(ch for ch in p if ch.isdigit())
    parts.append(int(digits) if digits else 0)
  return tuple(parts)


def decode_compiler_options(version: tuple[int, ...] | None = None, env=None) -> dict[str, str]:
  """The compiler options of the decode-path jits: {} (XLA's defaults) unless this jaxlib is the measured line and
  the environment does not ask for the defaults."""
  env = os.environ if env is None else env
  if env.get("REPROBE_JAX_XLA_DEFAULTS", "") not in ("", "0"):
    return {}
  version = _jaxlib_version() if version is None else version
  if tuple(version[:2]) != MEASURED_JAXLIB:
    return {}
  return {YNN_FUSION_OPTION: YNN_DOTS_ONLY}


DECODE_COMPILER_OPTIONS: dict[str, str] = decode_compiler_options()


def decode_jit(**jit_kwargs):
  """A decorator: `fun` jitted twice, as (the top-level entry with DECODE_COMPILER_OPTIONS, the same jit without
  them for calls from inside other jitted programs: JAX accepts compiler options on top-level jits only).

      _extend = ...; extend, extend_in_jit = decode_jit(static_argnames=(...))(_extend)
  """

  def wrap(fun):
    return (jax.jit(fun, compiler_options=DECODE_COMPILER_OPTIONS or None, **jit_kwargs), jax.jit(fun, **jit_kwargs))

  return wrap
