"""bfloat16 held to PyTorch `transformers` in bfloat16: on a GPU (bench/gpu_check.sh), and on a CPU when asked
(REPROBE_BF16_PARITY=1; the float32 parity tests in tests/test_model_parity.py cover the CPU).

The tolerance is PyTorch's own bfloat16 error. bfloat16 keeps 8 significant bits (a relative rounding of 2^-9 per
operation) and the error it leaves in the logits grows with depth and with the weights' scale, so no fixed bound
fits every model. Both sides run the same weights in bfloat16 and are measured against the float32 forward; ours
must stay within ERROR_FACTOR times PyTorch's error (the two round at different points: XLA fuses and keeps some
intermediates in float32, PyTorch rounds after every op, so neither is the exact one), plus a floor of 2^-8 of the
logits' scale for a model where PyTorch's error comes out near zero by chance. And the next token the logits pick
agrees with float32's at all but TOP1_SLACK of the positions where PyTorch's bfloat16 agrees.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from reprobe_jax.models import load_pretrained
from test_model_parity import VOCAB, _common

pytestmark = pytest.mark.skipif(
  jax.default_backend() == "cpu" and os.environ.get("REPROBE_BF16_PARITY") != "1",
  reason="bfloat16 parity runs on an accelerator (bench/gpu_check.sh), or on a CPU with REPROBE_BF16_PARITY=1",
)

ERROR_FACTOR = 2.0
FLOOR = 2.0**-8
TOP1_SLACK = 0.1


def _config(cls, **kw):
  return cls(**_common(**kw))  # the float32 parity tests' tiny shapes


# Llama, and Gemma 3 (its embedding scale rounds to the model's dtype, a local and a global layer).
CASES = {
  "llama": lambda: transformers.LlamaForCausalLM(_config(transformers.LlamaConfig)),
  "gemma3": lambda: transformers.Gemma3ForCausalLM(
    _config(
      transformers.Gemma3TextConfig,
      head_dim=16,
      sliding_window=4,
      layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )
  ),
}


def _rel(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


@pytest.mark.parametrize("name", sorted(CASES))
def test_bfloat16_logits_stay_within_pytorchs_own_bfloat16_error(name, tmp_path):
  torch.manual_seed(0)
  hf = CASES[name]().eval()
  if name == "gemma3":  # Gemma's zero-centred norm weights (1 + w) start at zero; make them matter
    with torch.no_grad():
      for n, p in hf.named_parameters():
        if "norm" in n:
          p.normal_(0, 0.5)
  hf.save_pretrained(tmp_path)
  ids = np.random.RandomState(0).randint(3, VOCAB, (2, 16))
  with torch.no_grad():
    ref = hf(torch.tensor(ids)).logits.numpy()
    hf16 = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    theirs = hf16(torch.tensor(ids)).logits.float().numpy()
  lm = load_pretrained(str(tmp_path), dtype="bfloat16")
  assert all(str(x.dtype) == "bfloat16" for x in jax.tree.leaves(lm.params))
  ours = np.asarray(lm.forward(ids).logits, np.float32)
  e_ours, e_hf = _rel(ours, ref), _rel(theirs, ref)
  assert e_ours <= ERROR_FACTOR * e_hf + FLOOR, (name, e_ours, e_hf)
  top1 = lambda x: float(np.mean(x.argmax(-1) == ref.argmax(-1)))
  assert top1(ours) >= top1(theirs) - TOP1_SLACK, (name, top1(ours), top1(theirs))
