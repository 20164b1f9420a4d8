"""Target models: one NNX decoder for Llama, Mistral, Qwen2, Qwen3, Phi-3 and Gemma 3; loading (Hugging Face
safetensors, GGUF) and export; capture of per-token features; the KV cache; the decode state and the open sampler;
sharding rules. The model layer runs a compiled stop table as data (`StopRule`, or a `reprobe_jax.steps` boundary
compiled for the tokenizer) and knows nothing of steps, tasks or jobs."""

from reprobe_jax.models.capture import CaptureSpec, ForwardOutput
from reprobe_jax.models.config import ModelConfig
from reprobe_jax.models.kv_cache import KVCache
from reprobe_jax.models.language_model import Generation, LanguageModel
from reprobe_jax.models.loading import load_pretrained, load_tokenizer, resolve_path, smollm2_gguf_path
from reprobe_jax.models.rope_config import RopeConfig
from reprobe_jax.models.sampling import SamplingParams
from reprobe_jax.models.sharding import (
  DEFAULT_RULES,
  DistributedConfig,
  ShardingCtx,
  make_mesh,
  maybe_initialize_distributed,
)

__all__ = [
  "CaptureSpec",
  "ForwardOutput",
  "ModelConfig",
  "RopeConfig",
  "KVCache",
  "Generation",
  "LanguageModel",
  "load_pretrained",
  "load_tokenizer",
  "resolve_path",
  "smollm2_gguf_path",
  "SamplingParams",
  "DEFAULT_RULES",
  "ShardingCtx",
  "make_mesh",
  "maybe_initialize_distributed",
  "DistributedConfig",
]
