"""The decode-path compiler options (docs/kernels.md): YNNPACK keeps the dots, XLA fuses the reductions; set only on the
measured jaxlib line, off with REPROBE_JAX_XLA_DEFAULTS=1; greedy decoding gives the same tokens either way."""

from __future__ import annotations

import re

import jax
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

ON_MEASURED_LINE = bool(DECODE_COMPILER_OPTIONS)


def test_options_only_on_the_measured_jaxlib_line_and_off_on_request():
  on = {YNN_FUSION_OPTION: YNN_DOTS_ONLY}
  line = xla_options.MEASURED_JAXLIB
  assert decode_compiler_options(line + (2,), env={}) == on
  assert decode_compiler_options(line + (0,), env={"REPROBE_JAX_XLA_DEFAULTS": "0"}) == on
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


@pytest.mark.skipif(
  jax.default_backend() != "cpu" or not ON_MEASURED_LINE, reason="XLA:CPU on the measured jaxlib line only"
)
def test_decode_jit_entry_keeps_only_dots_in_ynnpack_and_its_twin_nests():
  """An RMSNorm then a projection at decode shapes ([32, 576] x [576, 1536]) through `decode_jit`: the jit without
  options (XLA's defaults) makes the norm's reduction a YNNPACK fusion of its own, the entry only the dot; the twin
  runs inside another jit, where JAX refuses compiler options."""

  def f(x, w):
    x = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-5)
    return jax.nn.silu(x @ w)

  entry, in_jit = decode_jit()(f)
  args = (jnp.ones((32, 576)), jnp.ones((576, 1536)))
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


@pytest.mark.skipif(not ON_MEASURED_LINE, reason="the options are off on this jaxlib")
def test_greedy_tokens_and_logprobs_equal_under_xla_defaults(tiny_llama_dir):
  """The same greedy decode in a process with REPROBE_JAX_XLA_DEFAULTS=1 (XLA's own fusion choices) gives the same
  tokens, and log-probs to float tolerance."""
  import json
  import os
  import subprocess
  import sys

  prompts = [[1, 10, 11, 12, 13], [1, 20, 21], [1, 30, 31, 32, 33, 34, 35]]
  lm = load_pretrained(tiny_llama_dir)
  ours = lm.generate(prompts, SamplingParams(temperature=0), max_new_tokens=12)
  env = dict(os.environ, REPROBE_JAX_XLA_DEFAULTS="1")
  run = subprocess.run(
    [sys.executable, "-c", GREEDY, tiny_llama_dir, json.dumps(prompts)],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=True,
  )
  ref = json.loads(run.stdout.strip().splitlines()[-1])
  assert ref["options"] == {}
  np.testing.assert_array_equal(np.asarray(ours.tokens), np.asarray(ref["tokens"]))
  np.testing.assert_allclose(np.asarray(ours.logprobs), np.asarray(ref["logprobs"]), atol=1e-5)
