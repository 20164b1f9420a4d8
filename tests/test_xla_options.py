"""The decode-path compiler options (docs/kernels.md): YNNPACK keeps the dots, XLA fuses the reductions; set only on the
measured jaxlib line, off with REPROBE_JAX_XLA_DEFAULTS=1; greedy decoding gives the same tokens either way."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jax
import jaxlib
import jax.numpy as jnp
import numpy as np
import pytest

from reprobe_jax.models import SamplingParams, load_pretrained
from reprobe_jax.models import xla_options
from reprobe_jax.models.xla_options import (
  DECODE_COMPILER_OPTIONS,
  YNN_DOTS_ONLY,
  YNN_FUSION_OPTION,
  decode_compiler_options,
  decode_jit,
)

ON = {YNN_FUSION_OPTION: YNN_DOTS_ONLY}


def test_options_are_on_for_the_installed_jaxlib():
  """pyproject allows the measured jaxlib line only (tests/hostile/test_hostile_suite.py holds it to that), so the
  tests below run wherever the suite does: none of them skips on another jaxlib."""
  assert decode_compiler_options(env={}) == ON, f"jaxlib {jaxlib.__version__} is not the measured line"
  on_request = os.environ.get("REPROBE_JAX_XLA_DEFAULTS", "") not in ("", "0")
  assert DECODE_COMPILER_OPTIONS == ({} if on_request else ON)


def test_options_only_on_the_measured_jaxlib_line_and_off_on_request():
  line = xla_options.MEASURED_JAXLIB
  assert decode_compiler_options(line + (2,), env={}) == ON
  assert decode_compiler_options(line + (0,), env={"REPROBE_JAX_XLA_DEFAULTS": "0"}) == ON
  assert decode_compiler_options(line + (2,), env={"REPROBE_JAX_XLA_DEFAULTS": "1"}) == {}
  assert decode_compiler_options((line[0], line[1] - 1, 9), env={}) == {}
  assert decode_compiler_options((line[0], line[1] + 1, 0), env={}) == {}


def _ynn_ops(compiled_text: str) -> list[str]:
  """The op each YNNPACK fusion of a compiled CPU program was made from (its metadata's last op name)."""
  ops = []
  for line in compiled_text.split("\n"):
    if '"kind":"__ynn_fusion"' in line:
      m = re.search(r'op_name="([^"]*)"', line)
      ops.append(m.group(1).split("/")[-1] if m else "?")
  return ops


def test_decode_jit_entry_keeps_only_dots_in_ynnpack_and_its_twin_nests(monkeypatch):
  """An RMSNorm then a projection at decode shapes ([32, 576] x [576, 1536]) through `decode_jit`: the jit without
  options (XLA's defaults) makes the norm's reduction a YNNPACK fusion of its own, the entry only the dot; the twin
  runs inside another jit, where JAX refuses compiler options. On XLA:CPU whatever the default backend, with the
  options whatever REPROBE_JAX_XLA_DEFAULTS says (it decides the decode path's, not this test's)."""

  def f(x, w):
    x = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-5)
    return jax.nn.silu(x @ w)

  monkeypatch.setattr(xla_options, "DECODE_COMPILER_OPTIONS", decode_compiler_options(env={}))
  entry, in_jit = decode_jit()(f)
  args = jax.device_put((jnp.ones((32, 576)), jnp.ones((576, 1536))), jax.devices("cpu")[0])
  default = _ynn_ops(in_jit.lower(*args).compile().as_text())
  ours = _ynn_ops(entry.lower(*args).compile().as_text())
  assert "reduce_sum" in default  # if XLA stops doing this, the option may no longer be needed
  assert "dot_general" in ours and "reduce_sum" not in ours
  np.testing.assert_allclose(
    np.asarray(entry(*args)), np.asarray(jax.jit(lambda *a: in_jit(*a) * 1.0)(*args)), rtol=1e-6
  )
  with pytest.raises(ValueError, match="compiler_options"):
    jax.jit(lambda *a: entry(*a))(*args)


GREEDY = """
import json, sys
import numpy as np
from reprobe_jax.models import SamplingParams, load_pretrained
from reprobe_jax.models.xla_options import DECODE_COMPILER_OPTIONS
lm = load_pretrained(sys.argv[1])
out = lm.generate(json.loads(sys.argv[2]), SamplingParams(temperature=0), max_new_tokens=12)
print(json.dumps({"options": DECODE_COMPILER_OPTIONS, "tokens": np.asarray(out.tokens).tolist(),
                  "logprobs": np.asarray(out.logprobs).tolist()}))
"""


def test_greedy_tokens_and_logprobs_equal_under_xla_defaults(tiny_llama_dir):
  """The same greedy decode in a process with the other setting of REPROBE_JAX_XLA_DEFAULTS (XLA's own fusion
  choices against the options) gives the same tokens, and log-probs to float tolerance."""
  prompts = [[1, 10, 11, 12, 13], [1, 20, 21], [1, 30, 31, 32, 33, 34, 35]]
  lm = load_pretrained(tiny_llama_dir)
  ours = lm.generate(prompts, SamplingParams(temperature=0), max_new_tokens=12)
  env = dict(os.environ, REPROBE_JAX_XLA_DEFAULTS="1" if DECODE_COMPILER_OPTIONS else "0")
  run = subprocess.run(
    [sys.executable, "-c", GREEDY, tiny_llama_dir, json.dumps(prompts)],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=True,
  )
  ref = json.loads(run.stdout.strip().splitlines()[-1])
  assert {json.dumps(ref["options"]), json.dumps(DECODE_COMPILER_OPTIONS)} == {"{}", json.dumps(ON)}
  np.testing.assert_array_equal(np.asarray(ours.tokens), np.asarray(ref["tokens"]))
  np.testing.assert_allclose(np.asarray(ours.logprobs), np.asarray(ref["logprobs"]), atol=1e-5)
