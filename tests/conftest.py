"""Shared fixtures: a tiny word-level tokenizer and a tiny random Llama-family model saved in HF format."""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops every compiled program after each test module. One process compiles thousands of XLA programs over
  the suite; each maps its code into memory, and near the end of a full run (past the kernel's default of 65530
  memory maps) a compile crashed (abort, then a segfault, twice at the same test, which passes alone)."""
  yield
  import gc

  import jax

  jax.clear_caches()
  gc.collect()


def require_cpu_kernels(*builds):
  """Skips when this machine cannot build the CPU decode kernels (no C++ compiler, a platform other than Linux or
  macOS, REPROBE_JAX_CPU_KERNELS=0), and fails with the compiler's error when it can and the build fails: a
  broken `decode.cc` must fail the suite, not skip it. `builds` default to the matmul's and the attention's."""
  from reprobe_jax import kernels
  from reprobe_jax.kernels import attention

  for built in builds or (kernels.status(), attention.status()):
    if built.failed:
      pytest.fail(f"the CPU decode kernels failed to build: {built.reason}\n{built.log[-4000:]}", pytrace=False)
    if built.target is None:
      pytest.skip(f"no CPU decode kernels on this machine ({built.cause}): {built.reason}")


@pytest.fixture
def cpu_kernels():
  """The CPU decode kernels, built: see `require_cpu_kernels`."""
  require_cpu_kernels()


VOCAB_WORDS = (
  ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(90)] + [".\n", "a.\n", "\n\n", "=", "+", "-", "Step", ":"]
)


def make_word_tokenizer():
  """A WordLevel tokenizer (101 tokens) that `transformers` wraps; some tokens end with '.\\n'."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  vocab = {w: i for i, w in enumerate(VOCAB_WORDS)}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


@pytest.fixture(scope="session")
def word_tokenizer():
  return make_word_tokenizer()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
  """A random Llama (vocab 101, 3 layers) saved by PyTorch transformers, with the word tokenizer."""
  import torch
  import transformers

  torch.manual_seed(0)
  cfg = transformers.LlamaConfig(
    vocab_size=len(VOCAB_WORDS),
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.25,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
  )
  cfg._attn_implementation = "eager"
  model = transformers.LlamaForCausalLM(cfg).eval()
  d = tmp_path_factory.mktemp("tiny_llama")
  model.save_pretrained(d)
  make_word_tokenizer().save_pretrained(d)
  return str(d)


class CompileCounter:
  """Counts XLA backend compilations (not time) through jax.monitoring."""

  def __init__(self):
    import jax
    from jax._src import dispatch

    self.count = 0
    self._event = dispatch.BACKEND_COMPILE_EVENT
    jax.monitoring.register_event_duration_secs_listener(self._on_event)

  def _on_event(self, event, duration, **kwargs):
    if event == self._event:
      self.count += 1


@pytest.fixture(scope="session")
def compile_counter():
  """One listener for the session: `compile_counter.count` grows by one per XLA compilation."""
  return CompileCounter()


@pytest.fixture(scope="session")
def synthetic_lm():
  """A random tiny Llama with a tokenizer of the synthetic worlds (its outputs are noise: mechanics only)."""
  from reprobe_jax.models import LanguageModel, ModelConfig
  from reprobe_jax.synthetic.tokenizer import build_tokenizer
  from reprobe_jax.tasks import make_problems
  from reprobe_jax.tasks.formats import user_prompt
  from reprobe_jax.tasks.traces import solve_many

  texts = []
  for fam in ("arithmetic", "planning", "qa"):
    ps = make_problems(fam, 10, 0, 1)
    texts += [user_prompt(p, "line") + t.text for p, t in zip(ps, solve_many(ps, "line", 0))]
  tok = build_tokenizer(texts, 500)
  cfg = ModelConfig(
    family="llama",
    vocab_size=len(tok),
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    tie_word_embeddings=True,
    eos_token_ids=(tok.eos_token_id,),
    pad_token_id=tok.pad_token_id,
  )
  return LanguageModel.random(cfg, seed=0, tokenizer=tok)
