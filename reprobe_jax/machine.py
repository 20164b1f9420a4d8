"""The machine a number was measured on: CPU model, the widest vector instruction set XLA can use, core count and
the JAX backend. Every reported result carries it, because XLA compiles other kernels per instruction set, so a
trained model and every timing can differ between an AVX-512 Xeon and an AVX2 EPYC (README, "Reproducibility")."""

from __future__ import annotations

import dataclasses
import os
import platform

# Widest first: the first of these whose flags the CPU reports names its instruction set.
_ISA = (("AVX-512+AMX", ("avx512f", "amx_tile")), ("AVX-512", ("avx512f",)), ("AVX2", ("avx2",)),
        ("AVX", ("avx",)), ("SSE4.2", ("sse4_2",)), ("NEON", ("asimd",)))


@dataclasses.dataclass(frozen=True)
class Machine:
  cpu: str       # `lscpu` model name, e.g. 'Intel(R) Xeon(R) Processor'
  isa: str       # widest vector instruction set, e.g. 'AVX-512+AMX', 'AVX2'
  cores: int     # logical CPUs this process sees
  backend: str   # JAX default backend: 'cpu', 'gpu', 'tpu'

  def __str__(self) -> str:
    return f"{self.cpu} ({self.isa}, {self.cores} cores, JAX {self.backend})"


def isa_from_flags(flags: set[str]) -> str:
  """The widest instruction set named by a set of /proc/cpuinfo flags ('unknown' when none is)."""
  return next((name for name, need in _ISA if all(f in flags for f in need)), "unknown")


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, set[str]]:
  model, flags = "", set()
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      for line in f:
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and not model:
          model = value.strip()
        elif key in ("flags", "features") and not flags:
          flags = set(value.split())
  except OSError:
    pass
  return model, flags


def describe() -> Machine:
  """This machine (Linux reads /proc/cpuinfo; elsewhere the platform module's processor name)."""
  import jax
  model, flags = _cpuinfo()
  return Machine(cpu=model or platform.processor() or platform.machine() or "unknown CPU",
                 isa=isa_from_flags(flags), cores=os.cpu_count() or 1, backend=jax.default_backend())
