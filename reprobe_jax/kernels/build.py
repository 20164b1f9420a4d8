"""Compile a kernel's C++ source against XLA's FFI headers at first use, cache the shared library, register it.

The library is built with the machine's C++ compiler (`CXX`, else g++, else c++) at `-O3 -march=native`, so it
uses whatever vector units this CPU has, and is cached under `REPROBE_JAX_KERNEL_CACHE` (default
`~/.cache/reprobe_jax/kernels`) by a hash of the source, the compiler's version, jaxlib's version and the CPU's
model and flags: a home directory shared between machines of different CPUs gets one library each. The build
writes to a temporary file and renames it into place, so concurrent processes (pytest-xdist workers) never load a
half-written library. The sources are the `.cc` files beside this module, or those in `REPROBE_JAX_KERNEL_SOURCES`
(a folder: a changed kernel tried without reinstalling; the tests build a broken copy from there).

When the kernel is unavailable the callers keep XLA's own dots and `Built.reason` says why; `Built.cause` tells
what this machine lacks (`OFF`: `REPROBE_JAX_CPU_KERNELS=0`; `NO_COMPILER`; `UNSUPPORTED`: a platform other than
Linux or macOS, whose gcc-style flags and ctypes-loaded `.so` the build assumes) from a build that was tried and
failed (`FAILED`: the compiler's error, an unwritable cache, a library that does not load), which is also logged
as a warning, once per process.
"""

from __future__ import annotations
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import jax
import jaxlib
from absl import logging

SOURCE_DIR = os.path.dirname(os.path.abspath(__file__))
DISABLE_ENV = "REPROBE_JAX_CPU_KERNELS"
CACHE_ENV = "REPROBE_JAX_KERNEL_CACHE"
SOURCES_ENV = "REPROBE_JAX_KERNEL_SOURCES"
PLATFORMS = ("linux", "darwin")  # the `sys.platform`s whose toolchains take the gcc-style flags below

# Why a kernel is unavailable (`Built.cause`): the first three are what this machine lacks, FAILED a tried build.
OFF, NO_COMPILER, UNSUPPORTED, FAILED = "off", "no compiler", "unsupported platform", "failed"
_REGISTERED: dict[str, str] = {}  # FFI target -> the library it was registered from (XLA keeps one per name)


@dataclass(frozen=True)
class Built:
  """A registered kernel (`target` is its FFI name) or the reason there is none (`target` None; `cause` one of
  OFF, NO_COMPILER, UNSUPPORTED, FAILED; `log` the compiler's whole output when it failed)."""

  target: str | None
  reason: str = ""
  library: str = ""
  cause: str = ""
  log: str = ""

  @property
  def failed(self) -> bool:
    """True when this machine could build the kernel and the build (or loading it) failed: a bug, not a lack."""
    return self.target is None and self.cause == FAILED


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


def source_dir() -> str:
  """The folder the kernels' sources are read from: `REPROBE_JAX_KERNEL_SOURCES`, else this package's."""
  return os.environ.get(SOURCES_ENV) or SOURCE_DIR


def build(source: str, symbol: str, target: str) -> Built:
  """Compiles `source` (a file in `source_dir()`), loads it and registers its FFI handler `symbol` as `target` on
  the CPU platform; once per process and source path. Returns Built(None, reason, cause) instead of raising."""
  off = os.environ.get(DISABLE_ENV, "1")
  if off.strip().lower() in ("0", "false", "no", "off"):
    return Built(None, f"{DISABLE_ENV}={off}", cause=OFF)
  return _register(os.path.join(source_dir(), source), symbol, target)


@functools.lru_cache(maxsize=None)
def _register(path: str, symbol: str, target: str) -> Built:
  compiled = _compile(path)
  if not compiled.library:
    return compiled
  if _REGISTERED.get(target, compiled.library) != compiled.library:
    return _unavailable(f"{target} is already registered from {_REGISTERED[target]}: one build per process", FAILED)
  try:
    lib = ctypes.cdll.LoadLibrary(compiled.library)
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
  except (OSError, AttributeError) as e:  # a library from another machine's cache entry, a missing symbol
    return _unavailable(f"loading {compiled.library} failed: {e}", FAILED)
  _REGISTERED[target] = compiled.library
  return Built(target, "", compiled.library)


def _unavailable(reason: str, cause: str, log: str = "") -> Built:
  logging.warning("reprobe_jax CPU decode kernels unavailable, decoding with XLA's dots: %s", reason)
  return Built(None, reason, cause=cause, log=log)


@functools.lru_cache(maxsize=None)
def _compile(path: str) -> Built:
  """The library built from the source at `path` (`Built.library`, `target` None), or why there is none."""
  if sys.platform not in PLATFORMS:
    return _unavailable(f"the kernels build on Linux and macOS only, not on {sys.platform}", UNSUPPORTED)
  cxx = _compiler()
  if cxx is None:
    return _unavailable("no C++ compiler found (set CXX, or install g++)", NO_COMPILER)
  try:
    with open(path, "rb") as f:
      text = f.read()
  except OSError as e:
    return _unavailable(f"cannot read the kernel source {path} ({e})", FAILED)
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
  library = os.path.join(directory, os.path.splitext(os.path.basename(path))[0] + ".so")
  if not os.path.exists(library):
    try:
      os.makedirs(directory, exist_ok=True)
      fd, tmp = tempfile.mkstemp(suffix=".so", dir=directory)
      os.close(fd)
    except OSError as e:
      return _unavailable(f"cannot write the kernel cache {directory} ({e}); set {CACHE_ENV}", FAILED)
    res = _run([cxx, *flags, path, "-o", tmp])
    if res.returncode != 0:
      os.unlink(tmp)
      log = (res.stderr or res.stdout).strip()
      errors = [ln for ln in log.splitlines() if "error" in ln] or log.splitlines()[-3:]
      return _unavailable(f"{os.path.basename(cxx)} failed on {path}: " + " | ".join(errors[:3]), FAILED, log)
    os.replace(tmp, library)
  return Built(None, "", library)
