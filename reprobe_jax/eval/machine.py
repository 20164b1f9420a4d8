"""The machine a number was measured on: CPU model, the widest vector instruction set XLA can use, core count and
the JAX backend. Every reported result carries it, because XLA compiles other kernels per instruction set, so a
trained model and every timing can differ between an AVX-512 Xeon and an AVX2 EPYC (docs/results.md)."""

from __future__ import annotations

import dataclasses
import os
import platform

import jax

# Widest first: the first of these whose flags the CPU reports names its instruction set.
_ISA = (
  ("AVX-512+AMX", ("avx512f", "amx_tile")),
  ("AVX-512", ("avx512f",)),
  ("AVX2", ("avx2",)),
  ("AVX", ("avx",)),
  ("SSE4.2", ("sse4_2",)),
  ("NEON", ("asimd",)),
)
# The flags that decide which matmul kernels XLA and oneDNN pick (fp32 FMA width, bf16 dot products, AMX tiles).
EXTENSIONS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "asimd", "sve")


@dataclasses.dataclass(frozen=True)
class Machine:
  cpu: str  # `lscpu` model name, e.g. 'Intel(R) Xeon(R) Processor'
  isa: str  # widest vector instruction set, e.g. 'AVX-512+AMX', 'AVX2'
  cores: int  # logical CPUs this process sees
  backend: str  # JAX default backend: 'cpu', 'gpu', 'tpu'
  extensions: tuple[str, ...] = ()  # the EXTENSIONS the CPU reports, e.g. ('avx2', 'fma', 'avx512f')
  llc_bytes: int | None = None  # last-level cache size: a bandwidth buffer smaller than it times the cache, not DRAM

  def __str__(self) -> str:
    return f"{self.cpu} ({self.isa}, {self.cores} cores, JAX {self.backend})"

  def long(self) -> str:
    """The model name with every matmul-relevant extension, core count and last-level cache, for reports."""
    ext = " ".join(self.extensions) or "none of " + "/".join(EXTENSIONS)
    llc = f"; last-level cache {self.llc_bytes / 2**20:.0f} MiB" if self.llc_bytes else ""
    return f"{self.cpu}; {self.cores} cores; extensions: {ext}{llc}; JAX backend {self.backend}"


def isa_from_flags(flags: set[str]) -> str:
  """The widest instruction set named by a set of /proc/cpuinfo flags ('unknown' when none is)."""
  return next((name for name, need in _ISA if all(f in flags for f in need)), "unknown")


def extensions_from_flags(flags: set[str]) -> tuple[str, ...]:
  """The EXTENSIONS among a set of /proc/cpuinfo flags, in EXTENSIONS order."""
  return tuple(f for f in EXTENSIONS if f in flags)


def _llc_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
  """The largest cache level's size from sysfs ('491520K' -> bytes), or None where sysfs does not say."""
  best = None
  try:
    for entry in os.listdir(root):
      try:
        with open(os.path.join(root, entry, "size")) as f:
          text = f.read().strip()
      except OSError:
        continue
      scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
      digits = text[:-1] if text[-1:] in "KMG" else text
      if digits.isdigit():
        best = max(best or 0, int(digits) * scale)
  except OSError:
    return None
  return best


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
  model, flags = _cpuinfo()
  return Machine(
    cpu=model or platform.processor() or platform.machine() or "unknown CPU",
    isa=isa_from_flags(flags),
    cores=os.cpu_count() or 1,
    backend=jax.default_backend(),
    extensions=extensions_from_flags(flags),
    llc_bytes=_llc_bytes(),
  )
