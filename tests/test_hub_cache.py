"""Hub ids resolve through `huggingface_hub` from a local cache laid out as the HF cache is, with no network.

huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE once, when it is imported. The subprocess test sets them in
the environment before Python starts, as a user does; the in-process tests also patch `huggingface_hub.constants`,
since another test may have imported huggingface_hub (through transformers) already.
"""

import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from reprobe_jax.errors import CheckpointError, ConfigError
from reprobe_jax.models import LanguageModel, ModelConfig, load_pretrained, resolve_path

REPO_ID = "org/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
_CFG = ModelConfig(
  family="llama",
  vocab_size=64,
  hidden_size=32,
  intermediate_size=64,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
  max_position_embeddings=64,
  bos_token_id=1,
  eos_token_ids=(2,),
)


def _tokenizer():
  """A word-level tokenizer over 64 tokens, built offline."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, 64)}}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  return PreTrainedTokenizerFast(
    tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
  )


def _populate_cache(cache_dir, source, repo_id=REPO_ID, commit=COMMIT):
  """models--org--name/{blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/<sha256>, refs/main}."""
  repo = os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"))
  snap = os.path.join(repo, "snapshots", commit)
  os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
  os.makedirs(snap, exist_ok=True)
  os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
  for name in sorted(os.listdir(source)):
    with open(os.path.join(source, name), "rb") as f:
      data = f.read()
    blob = hashlib.sha256(data).hexdigest()
    with open(os.path.join(repo, "blobs", blob), "wb") as f:
      f.write(data)
    os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(snap, name))
  with open(os.path.join(repo, "refs", "main"), "w") as f:
    f.write(commit)  # the hub client writes the bare hash, no newline
  return snap


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
  """(source directory, cache directory, snapshot directory) for REPO_ID."""
  root = tmp_path_factory.mktemp("hub")
  source = str(root / "source")
  LanguageModel.random(_CFG, seed=3, tokenizer=_tokenizer()).save_pretrained(source)
  cache = str(root / "cache")
  snap = _populate_cache(cache, source)
  return source, cache, snap


@pytest.fixture
def offline_cache(hub, monkeypatch):
  """Points huggingface_hub at the test cache, offline, whether or not it was imported already."""
  _, cache, _ = hub
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_HUB_CACHE", cache)
  from huggingface_hub import constants

  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(constants, "HF_HUB_CACHE", cache)
  return cache


def test_hub_id_resolves_to_the_cached_snapshot(hub, offline_cache):
  _, _, snap = hub
  resolved = resolve_path(REPO_ID)
  assert os.path.realpath(resolved) == os.path.realpath(snap)
  assert os.path.exists(os.path.join(resolved, "config.json"))


def test_hub_id_loads_the_same_model_as_the_directory(hub, offline_cache):
  source, _, _ = hub
  from_hub = load_pretrained(REPO_ID)
  from_dir = load_pretrained(source)
  assert from_hub.config == from_dir.config == _CFG
  ids = np.array([[1, 5, 9, 33, 60], [1, 7, 8, 9, 10]], np.int32)
  np.testing.assert_array_equal(np.asarray(from_hub.forward(ids).logits), np.asarray(from_dir.forward(ids).logits))
  assert from_hub.tokenizer is not None
  assert from_hub.tokenizer("w5 w9")["input_ids"][-2:] == [5, 9]
  assert from_hub.generate(["w5 w9"], max_new_tokens=3, seed=1).token_ids(0) == (
    from_dir.generate(["w5 w9"], max_new_tokens=3, seed=1).token_ids(0)
  )


def test_unknown_hub_id_offline_names_the_id(offline_cache):
  with pytest.raises(ConfigError, match=r"org/not-cached: not a local path, and the hub could not provide it"):
    load_pretrained("org/not-cached")


def test_ref_to_a_missing_snapshot_names_the_id(hub, offline_cache):
  repo = os.path.join(offline_cache, "models--org--dangling")
  os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
  with open(os.path.join(repo, "refs", "main"), "w") as f:
    f.write("f" * 40)
  with pytest.raises(ConfigError, match="org/dangling: not a local path"):
    resolve_path("org/dangling")


def test_snapshot_without_weights_is_a_checkpoint_error(hub, offline_cache, tmp_path):
  source, _, _ = hub
  partial = tmp_path / "partial"
  partial.mkdir()
  for name in ("config.json", "generation_config.json"):
    (partial / name).write_bytes((open(os.path.join(source, name), "rb")).read())
  _populate_cache(offline_cache, str(partial), repo_id="org/no-weights", commit="a" * 40)
  with pytest.raises(CheckpointError, match=r"no \*\.safetensors files"):
    load_pretrained("org/no-weights")


_SUBPROCESS_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from reprobe_jax.errors import ConfigError
    from reprobe_jax.models import load_pretrained, resolve_path

    source, snap = sys.argv[1], sys.argv[2]
    import os
    assert os.path.realpath(resolve_path("org/tiny-llama")) == os.path.realpath(snap), resolve_path("org/tiny-llama")
    ids = np.array([[1, 5, 9, 33, 60]], np.int32)
    a = np.asarray(load_pretrained("org/tiny-llama", tokenizer=False).forward(ids).logits)
    b = np.asarray(load_pretrained(source, tokenizer=False).forward(ids).logits)
    np.testing.assert_array_equal(a, b)
    try:
      load_pretrained("org/not-cached")
    except ConfigError as e:
      assert "org/not-cached" in str(e), e
    else:
      raise AssertionError("no ConfigError for an uncached id")
    print("HUB OK")
""")


def test_env_vars_set_before_start_are_honoured(hub, tmp_path):
  """The way users run it: HF_HUB_OFFLINE=1 HF_HUB_CACHE=<dir> python ..."""
  source, cache, snap = hub
  script = tmp_path / "hub.py"
  script.write_text(_SUBPROCESS_SCRIPT)
  env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
  env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=cache, HF_HOME=str(tmp_path / "hf_home"), JAX_PLATFORMS="cpu")
  proc = subprocess.run(
    [sys.executable, str(script), source, snap], env=env, capture_output=True, text=True, timeout=180
  )
  assert proc.returncode == 0 and "HUB OK" in proc.stdout, (
    f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"
  )
