"""The same weights in both frameworks, and real-token inputs for them.

`--model=smollm2` reads the SmolLM2-135M GGUF on both sides; `--model=tiny` builds a random Llama with PyTorch
`transformers`, saves it, and loads both sides from that directory, and `--model=smollm2-shape` likewise a random
Llama of SmolLM2-135M's shape (where the 98 MB GGUF is not at hand: the GPU check, bench/gpu_check.sh); anything else
is a Hugging Face directory, a `.gguf` file or a hub id in the local cache.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Any

import numpy as np

from reprobe_jax.errors import ConfigError
from reprobe_jax.models import LanguageModel, load_pretrained, resolve_path, smollm2_gguf_path


@dataclasses.dataclass
class Pair:
  """One checkpoint loaded twice: `lm` (reprobe-jax) and `hf` (PyTorch, eval mode, on `device`)."""

  name: str
  source: str
  lm: LanguageModel
  hf: Any
  device: Any
  tokenizer: Any | None  # None: inputs are random ids in the vocabulary
  tmpdir: str | None = None

  def close(self):
    if self.tmpdir is not None:
      shutil.rmtree(self.tmpdir, ignore_errors=True)


def torch_device():
  """CUDA when PyTorch sees a GPU, else the CPU: the harness runs unchanged on a GPU machine."""
  import torch

  return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# The random Llamas `build_random` saves: a tiny one, and one of SmolLM2-135M's shape (its GGUF's configuration:
# 30 layers, d=576, 9 query and 3 KV heads, FFN 1536, vocabulary 49152, tied embeddings, RoPE base 1e5).
SHAPES = {
  "tiny": dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=2048,
  ),
  "smollm2-shape": dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
    tie_word_embeddings=True,
  ),
}  # fmt: skip


def build_random(directory: str, shape: str = "tiny") -> str:
  """A random Llama of `SHAPES[shape]` saved by `transformers` (no EOS, so greedy decoding always runs to
  max_new_tokens; no tokenizer: inputs are random ids)."""
  import torch
  import transformers

  torch.manual_seed(0)
  cfg = transformers.LlamaConfig(
    **SHAPES[shape], initializer_range=0.1, bos_token_id=None, eos_token_id=None, pad_token_id=None
  )
  transformers.LlamaForCausalLM(cfg).eval().save_pretrained(directory)
  return directory


def load_pair(model: str) -> Pair:
  """Loads `model` ('smollm2', a random shape of `SHAPES`, or a path / hub id) into reprobe-jax (float32) and into
  transformers."""
  import torch
  import transformers

  transformers.utils.logging.set_verbosity_error()
  transformers.utils.logging.disable_progress_bar()
  device = torch_device()
  tmpdir = None
  if model == "smollm2":
    path = smollm2_gguf_path()
  elif model in SHAPES:
    tmpdir = tempfile.mkdtemp(prefix=f"bench-{model}-")
    path = build_random(tmpdir, model)
  else:
    path = resolve_path(model)
  if os.path.isfile(path) and not path.endswith(".gguf"):
    raise ConfigError(f"--model={model}: a file must be a .gguf checkpoint; for safetensors pass the directory")
  lm = load_pretrained(path, dtype="float32")
  if os.path.isfile(path):
    directory, name = os.path.split(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
  else:
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  hf = hf.to(device).eval()
  return Pair(name=model, source=path, lm=lm, hf=hf, device=device, tokenizer=lm.tokenizer, tmpdir=tmpdir)


def token_stream(pair: Pair, n_tokens: int, seed: int = 0) -> np.ndarray:
  """At least `n_tokens` ids [N]: the project's arithmetic problems with step-by-step traces, tokenized by the
  model's tokenizer (the text the probe reads in practice); random ids in the vocabulary without a tokenizer."""
  rng = np.random.default_rng(seed)
  if pair.tokenizer is None:
    return rng.integers(0, pair.lm.config.vocab_size, size=n_tokens, dtype=np.int64).astype(np.int32)
  from reprobe_jax import tasks

  ids: list[int] = []
  n = 32
  while len(ids) < n_tokens:
    ids = []
    for p in tasks.make_problems("arithmetic", n, seed=seed, difficulty=2):
      trace = tasks.solve(p, "arithmetic", rng, "line")
      ids += pair.tokenizer(tasks.user_prompt(p, "line") + "\n\n" + trace.text + "\n\n")["input_ids"]
    n *= 2
  return np.asarray(ids[:n_tokens], np.int32)


def windows(stream: np.ndarray, batch: int, length: int) -> np.ndarray:
  """[batch, length] ids: consecutive, non-overlapping windows of the stream (so no padding is needed)."""
  if stream.size < batch * length:
    raise ConfigError(f"token stream of {stream.size} ids is shorter than {batch} x {length}")
  return stream[: batch * length].reshape(batch, length)


def step_trajectories(pair: Pair, batch: int, length: int, seed: int = 1):
  """PRM inputs: `batch` trajectories (question + steps), each step ended by a separator token.

  Returns ids [B, T] (right-padded), mask [B, T], step_ends [B, S] (position of each step's separator; padded with
  the last one), step_valid [B, S] bool, and spans [B, S, 2]: each step's half-open token span [start, end)
  (separator included; (0, 0) for padding steps), as the probe reads them. With a tokenizer the separator is the
  newline that ends each '- Step k: ...' line (SmolLM2 has no PRM `<extra_0>` token); without one, every 8th
  random id, and `length` is the trajectory length.
  """
  rng = np.random.default_rng(seed)
  pad = pair.lm.pad_id()
  rows, ends, starts = [], [], []
  if pair.tokenizer is None:
    for _ in range(batch):
      rows.append(rng.integers(0, pair.lm.config.vocab_size, size=length).tolist())
      ends.append(list(range(7, length, 8)))
      starts.append(list(range(0, length - 7, 8)))
  else:
    from reprobe_jax import tasks

    nl = pair.tokenizer("\n")["input_ids"][-1:]
    for p in tasks.make_problems("arithmetic", batch, seed=seed, difficulty=3):
      trace = tasks.solve(p, "arithmetic", rng, "line")
      ids = list(pair.tokenizer(tasks.user_prompt(p, "line") + "\n\n")["input_ids"])
      row_ends, row_starts = [], []
      for k, step in enumerate(trace.steps):
        row_starts.append(len(ids))
        ids += list(pair.tokenizer(f"- Step {k + 1}: {step}")["input_ids"]) + nl
        row_ends.append(len(ids) - 1)
      rows.append(ids)
      ends.append(row_ends)
      starts.append(row_starts)
  t = max(len(r) for r in rows) if pair.tokenizer is not None else length
  s = max(len(e) for e in ends)
  out = np.full((batch, t), pad, np.int32)
  mask = np.zeros((batch, t), np.int32)
  step_ends = np.zeros((batch, s), np.int32)
  step_valid = np.zeros((batch, s), bool)
  spans = np.zeros((batch, s, 2), np.int32)
  for i, (r, e, st) in enumerate(zip(rows, ends, starts)):
    out[i, : len(r)], mask[i, : len(r)] = r, 1
    step_ends[i, : len(e)], step_ends[i, len(e) :] = e, e[-1]
    step_valid[i, : len(e)] = True
    spans[i, : len(e), 0], spans[i, : len(e), 1] = st, np.asarray(e) + 1
  return out, mask, step_ends, step_valid, spans
