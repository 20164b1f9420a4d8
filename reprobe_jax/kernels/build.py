"""Compile a kernel's C++ source against XLA's FFI headers at first use, cache the shared library, register it.

The library is built with the machine's C++ compiler (`CXX`, else g++, else c++) at `-O3 -march=native`, so it
uses whatever vector units this CPU has, and is cached under `REPROBE_JAX_KERNEL_CACHE` (default
`~/.cache/reprobe_jax/kernels`) by a hash of the source, the compiler's version, jaxlib's version and the CPU's
model and flags: a home directory shared between machines of different CPUs gets one library each. The build
writes to a temporary file and renames it into place, so concurrent processes (pytest-xdist workers) never load a
half-written library. No compiler, a failed build or `REPROBE_JAX_CPU_KERNELS=0` leaves the kernel unavailable
(`unavailable_reason` says why) and the callers keep XLA's own dots.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import jax
import jaxlib

SOURCE_DIR = os.path.dirname(os.path.abspath(__file__))
DISABLE_ENV = "REPROBE_JAX_CPU_KERNELS"
CACHE_ENV = "REPROBE_JAX_KERNEL_CACHE"


@dataclass(frozen=True)
class Built:
  """A registered kernel (`target` is its FFI name) or the reason there is none (`target` None)."""

  target: str | None
  reason: str = ""
  library: str = ""


def _cpu_signature() -> str:
  """The CPU's model name and feature flags (Linux), else the platform string: part of the cache key."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
      lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    seen = []
    for ln in lines:
      if ln not in seen:
        seen.append(ln)
    if seen:
      return "".join(seen)
  except OSError:
    pass
  return platform.platform() + platform.processor()


def _compiler() -> str | None:
  for name in (os.environ.get("CXX", ""), "g++", "c++", "clang++"):
    if name and shutil.which(name):
      return shutil.which(name)
  return None


def _cache_dir() -> str:
  return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "reprobe_jax", "kernels")


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
  return subprocess.run(cmd, capture_output=True, text=True, check=False)


@functools.lru_cache(maxsize=None)
def build(source: str, symbol: str, target: str) -> Built:
  """Compiles `source` (a file beside this one), loads it and registers its FFI handler `symbol` as `target` on
  the CPU platform. Cached per process; returns Built(None, reason) instead of raising."""
  if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
    return Built(None, f"{DISABLE_ENV}={os.environ[DISABLE_ENV]}")
  cxx = _compiler()
  if cxx is None:
    return Built(None, "no C++ compiler found (set CXX, or install g++)")
  path = os.path.join(SOURCE_DIR, source)
  with open(path, "rb") as f:
    text = f.read()
  version = _run([cxx, "--version"]).stdout.splitlines()[:1]
  flags = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w", "-I", jax.ffi.include_dir()]
  key = hashlib.sha256(
    b"\0".join(
      [
        text,
        repr(version).encode(),
        jaxlib.__version__.encode(),
        _cpu_signature().encode(),
        " ".join(flags[:-2]).encode(),
      ]
    )
  ).hexdigest()[:16]
  directory = os.path.join(_cache_dir(), key)
  library = os.path.join(directory, os.path.splitext(source)[0] + ".so")
  if not os.path.exists(library):
    try:
      os.makedirs(directory, exist_ok=True)
      fd, tmp = tempfile.mkstemp(suffix=".so", dir=directory)
      os.close(fd)
    except OSError as e:
      return Built(None, f"cannot write the kernel cache {directory} ({e}); set {CACHE_ENV}")
    res = _run([cxx, *flags, path, "-o", tmp])
    if res.returncode != 0:
      os.unlink(tmp)
      tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
      return Built(None, f"{os.path.basename(cxx)} failed on {source}: " + " | ".join(tail))
    os.replace(tmp, library)
  try:
    lib = ctypes.cdll.LoadLibrary(library)
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
  except (OSError, AttributeError) as e:  # a library from another machine's cache entry, a missing symbol
    return Built(None, f"loading {library} failed: {e}")
  return Built(target, "", library)
