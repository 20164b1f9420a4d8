"""The model configuration: one frozen dataclass for every supported decoder family.

It is read from a Hugging Face `config.json` (old `rope_scaling` style and the v5 `rope_parameters` style; the
reading rules are in `hf_config.py`) or from GGUF metadata (see `gguf_io.py`), and written back as a `config.json`
that PyTorch `transformers` loads. The RoPE parameters are a `RopeConfig` (`rope_config.py`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Mapping

from reprobe_jax.errors import ConfigError, UnsupportedModelError
from reprobe_jax.fields import Int, Real
from reprobe_jax.io.readers import read_json
from reprobe_jax.models.hf_config import (
  GEMMA3_DEFAULTS,
  ConfigFields,
  built,
  check_gemma3_options,
  gemma3_text_config,
  read_ropes,
  sliding_windows,
)
from reprobe_jax.models.rope_config import POSITIVE, RopeConfig

# Hugging Face `model_type` -> our family name. Mistral and SmolLM2 are Llama-shaped. "gemma3" is the multimodal
# Gemma 3 config, read for its `text_config` (the language model); we export the text model as "gemma3_text".
FAMILIES = {
  "llama": "llama",
  "mistral": "mistral",
  "qwen2": "qwen2",
  "qwen3": "qwen3",
  "phi3": "phi3",
  "gemma3_text": "gemma3",
  "gemma3": "gemma3",
}
_ARCHITECTURES = {
  "llama": "LlamaForCausalLM",
  "mistral": "MistralForCausalLM",
  "qwen2": "Qwen2ForCausalLM",
  "qwen3": "Qwen3ForCausalLM",
  "phi3": "Phi3ForCausalLM",
  "gemma3": "Gemma3ForCausalLM",
}
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Static description of a decoder-only LM. Hashable, so it can be a static jit argument."""

  family: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope: RopeConfig = RopeConfig()
  partial_rotary_factor: float = 1.0
  max_position_embeddings: int = 4096
  tie_word_embeddings: bool = False
  attention_bias: bool = False  # q/k/v biases (Qwen2 always, Llama optional)
  qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
  # One entry per layer: None for full attention, else the sliding-window length.
  sliding_windows: tuple[int | None, ...] = ()
  hidden_act: str = "silu"
  # Gemma 3: sliding-window layers rotate with their own RoPE (rope_local_base_freq); None: every layer uses `rope`.
  local_rope: RopeConfig | None = None
  query_pre_attn_scalar: float | None = None  # Gemma 3: scores scaled by this ** -0.5 (None: head_dim ** -0.5)
  final_logit_softcapping: float | None = None  # Gemma: logits -> cap * tanh(logits / cap)
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  pad_token_id: int | None = None

  def __post_init__(self):
    if self.family not in FAMILIES.values():
      raise UnsupportedModelError(
        f"model family {self.family!r} is not supported; supported: {sorted(set(FAMILIES.values()))}"
      )
    for name in (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_layers",
      "num_heads",
      "num_kv_heads",
      "head_dim",
      "max_position_embeddings",
    ):
      v = getattr(self, name)
      if not Int(1).ok(v):
        raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
    if not POSITIVE.ok(self.rms_norm_eps):
      raise ConfigError(f"rms_norm_eps must be a finite number > 0, got {self.rms_norm_eps!r}")
    if not Real(0.0, 1.0, low_open=True).ok(self.partial_rotary_factor):
      raise ConfigError(f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor!r}")
    if self.rotary_dim < 2 or self.rotary_dim % 2:
      raise ConfigError(
        f"head_dim={self.head_dim} x partial_rotary_factor={self.partial_rotary_factor} gives "
        f"{self.rotary_dim} rotary dimensions; RoPE needs an even number >= 2"
      )
    for rope in (self.rope, self.local_rope):
      if rope is None:
        continue
      if rope.rope_type == "dynamic" and self.rotary_dim < 4:
        raise ConfigError(f"rope type 'dynamic' needs at least 4 rotary dimensions, got {self.rotary_dim}")
      for name in ("short_factor", "long_factor"):
        v = getattr(rope, name)
        if rope.rope_type == "longrope" and (v is None or len(v) != self.rotary_dim // 2):
          raise ConfigError(
            f"rope type 'longrope' needs {name} with rotary_dim / 2 = {self.rotary_dim // 2} "
            f"entries, got {None if v is None else len(v)}"
          )
    for name in ("tie_word_embeddings", "attention_bias", "qk_norm"):
      if not isinstance(getattr(self, name), bool):
        raise ConfigError(f"{name} must be a boolean, got {getattr(self, name)!r}")
    for name, ids in (
      ("bos_token_id", (self.bos_token_id,)),
      ("pad_token_id", (self.pad_token_id,)),
      ("eos_token_ids", self.eos_token_ids),
    ):
      for i in ids:
        if i is not None and not Int(0, self.vocab_size - 1).ok(i):
          raise ConfigError(f"{name}: {i!r} is not a token id in [0, vocab_size={self.vocab_size})")
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    if self.hidden_act not in ACTIVATIONS:
      raise UnsupportedModelError(f"hidden_act {self.hidden_act!r} is not supported; supported: {ACTIVATIONS}")
    for name in ("query_pre_attn_scalar", "final_logit_softcapping"):
      v = getattr(self, name)
      if v is not None and not POSITIVE.ok(v):
        raise ConfigError(f"{name} must be a finite number > 0, got {v!r}")
    if self.family != "gemma3":  # the HF configs of the other families have no field for these
      for name in ("local_rope", "query_pre_attn_scalar", "final_logit_softcapping"):
        if getattr(self, name) is not None:
          raise ConfigError(f"{name} is a Gemma 3 option; family {self.family!r} has no such field")
    else:
      if self.partial_rotary_factor != 1.0:
        raise ConfigError(
          f"family 'gemma3' rotates the whole head (partial_rotary_factor 1), got {self.partial_rotary_factor}"
        )
      if not self.qk_norm or self.attention_bias:  # what Gemma3ForCausalLM has, and what its config.json can say
        raise ConfigError(
          f"family 'gemma3' has q/k norms and no attention biases (qk_norm=True, "
          f"attention_bias=False), got qk_norm={self.qk_norm}, attention_bias={self.attention_bias}"
        )
      # Spelled out, so that a config built in code equals the same config read back from its config.json.
      if self.local_rope is None:
        object.__setattr__(self, "local_rope", self.rope)
      if self.query_pre_attn_scalar is None:
        object.__setattr__(self, "query_pre_attn_scalar", float(self.head_dim))
    if not self.sliding_windows:
      object.__setattr__(self, "sliding_windows", (None,) * self.num_layers)
    if len(self.sliding_windows) != self.num_layers:
      raise ConfigError(f"sliding_windows has {len(self.sliding_windows)} entries for {self.num_layers} layers")
    if not all(w is None or Int(1).ok(w) for w in self.sliding_windows):
      raise ConfigError(f"sliding_windows entries must be None or integers >= 1, got {self.sliding_windows}")

  @property
  def rotary_dim(self) -> int:
    return int(self.head_dim * self.partial_rotary_factor)

  @property
  def embed_scale(self) -> float | None:
    """Gemma multiplies the token embedding by sqrt(hidden_size) (in the model dtype); None: no scaling."""
    return math.sqrt(self.hidden_size) if self.family == "gemma3" else None

  @property
  def sandwich_norms(self) -> bool:
    """Gemma 3 normalises each sublayer's output too (post_attention / pre- and post-feedforward norms), with
    RMSNorm weights stored zero-centred (y = x_hat * (1 + w))."""
    return self.family == "gemma3"

  def layer_rope(self, layer: int) -> RopeConfig:
    """The RoPE of this layer: `local_rope` for sliding-window layers where it is set, else `rope`."""
    if self.local_rope is not None and self.sliding_windows[layer] is not None:
      return self.local_rope
    return self.rope

  @property
  def num_params(self) -> int:
    d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
    q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    per_layer = d * (q + 2 * kv) + q * d + 3 * d * f + 2 * d
    per_layer += (q + 2 * kv) if self.attention_bias else 0
    per_layer += 2 * self.head_dim if self.qk_norm else 0
    per_layer += 2 * d if self.sandwich_norms else 0
    return v * d * (1 if self.tie_word_embeddings else 2) + self.num_layers * per_layer + d

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  # ---------------------------------------------------------------- Hugging Face config.json

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any], *, source: str = "config.json") -> "ModelConfig":
    """Builds a config from a Hugging Face `config.json` dict. Every field read is type- and range-checked (ints
    are JSON integers, booleans JSON booleans, floats finite); errors name the source and the field."""
    if not isinstance(d, Mapping):
      raise ConfigError(f"{source}: must hold a JSON object, got {type(d).__name__}")
    model_type = d.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
      raise UnsupportedModelError(
        f"{source}: model_type {model_type!r} is not supported; supported: {sorted(FAMILIES)}"
      )
    family = FAMILIES[model_type]
    prefix = ""
    if model_type == "gemma3":
      d, prefix = gemma3_text_config(d, source), "text_config."
    if family == "gemma3":
      d = {**GEMMA3_DEFAULTS, **d}
    f = ConfigFields(d, source, prefix)
    num_heads = f.integer("num_attention_heads")
    hidden = f.integer("hidden_size")
    head_dim = f.integer("head_dim", None)
    if head_dim is None:
      if hidden < num_heads:
        raise ConfigError(f"{source}: hidden_size={hidden} < num_attention_heads={num_heads} gives head_dim 0")
      head_dim = hidden // num_heads
    num_layers = f.integer("num_hidden_layers")
    ropes = read_ropes(f, family)
    windows = sliding_windows(f, family, num_layers)

    if f.flag("mlp_bias", False):
      raise UnsupportedModelError(f"{source}: mlp_bias=True is not supported")
    if isinstance(d.get("eos_token_id"), list):
      eos_ids = tuple(f.items("eos_token_id", int))
    else:
      eos = f.integer("eos_token_id", None, low=0)
      eos_ids = () if eos is None else (eos,)
    gemma = family == "gemma3"
    if gemma:
      check_gemma3_options(f)
    return built(
      source,
      lambda: cls(
        family=family,
        vocab_size=f.integer("vocab_size"),
        hidden_size=hidden,
        intermediate_size=f.integer("intermediate_size"),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=f.integer("num_key_value_heads", num_heads),
        head_dim=head_dim,
        rms_norm_eps=f.number("rms_norm_eps", 1e-6),
        rope=ropes.rope,
        partial_rotary_factor=ropes.partial_rotary_factor,
        max_position_embeddings=f.integer("max_position_embeddings", 4096),
        tie_word_embeddings=f.flag("tie_word_embeddings", False),
        attention_bias=f.flag("attention_bias", family == "qwen2") and family != "phi3",
        qk_norm=family in ("qwen3", "gemma3"),
        sliding_windows=windows,
        hidden_act=f.text("hidden_activation") if gemma else f.text("hidden_act", "silu"),
        local_rope=ropes.local,
        query_pre_attn_scalar=f.number("query_pre_attn_scalar") if gemma else None,
        final_logit_softcapping=f.number("final_logit_softcapping", None) if gemma else None,
        bos_token_id=f.integer("bos_token_id", None, low=0),
        eos_token_ids=eos_ids,
        pad_token_id=f.integer("pad_token_id", None, low=0),
      ),
    )

  @classmethod
  def from_json_file(cls, path: str | os.PathLike) -> "ModelConfig":
    """Reads a `config.json` (DataFormatError naming the file if it is not readable JSON) and checks it."""
    return cls.from_hf_dict(read_json(path, "config.json"), source=str(path))

  def to_hf_dict(self) -> dict[str, Any]:
    """A `config.json` dict that PyTorch `transformers` reads back into the same model."""
    model_type = next(k for k, v in FAMILIES.items() if v == self.family)
    d: dict[str, Any] = {
      "architectures": [_ARCHITECTURES[self.family]],
      "model_type": model_type,
      "vocab_size": self.vocab_size,
      "hidden_size": self.hidden_size,
      "intermediate_size": self.intermediate_size,
      "num_hidden_layers": self.num_layers,
      "num_attention_heads": self.num_heads,
      "num_key_value_heads": self.num_kv_heads,
      "head_dim": self.head_dim,
      "rms_norm_eps": self.rms_norm_eps,
      "max_position_embeddings": self.max_position_embeddings,
      "tie_word_embeddings": self.tie_word_embeddings,
      "hidden_act": self.hidden_act,
      "rope_parameters": self.rope.to_hf(self.partial_rotary_factor),
      "rope_theta": self.rope.theta,
      "bos_token_id": self.bos_token_id,
      "eos_token_id": (
        list(self.eos_token_ids)
        if len(self.eos_token_ids) > 1
        else (self.eos_token_ids[0] if self.eos_token_ids else None)
      ),
      "pad_token_id": self.pad_token_id,
      "torch_dtype": "float32",
    }
    if self.rope.original_max_position_embeddings is not None:
      d["original_max_position_embeddings"] = self.rope.original_max_position_embeddings
    if self.partial_rotary_factor != 1.0:
      d["partial_rotary_factor"] = self.partial_rotary_factor
    if self.family in ("llama", "qwen3", "mistral"):
      d["attention_bias"] = self.attention_bias
    windows = {w for w in self.sliding_windows if w is not None}
    if self.family == "gemma3":
      d.pop("hidden_act")
      scalar = self.query_pre_attn_scalar
      d.update(
        {
          "hidden_activation": self.hidden_act,
          "rope_parameters": {"full_attention": self.rope.to_hf(1.0), "sliding_attention": self.local_rope.to_hf(1.0)},
          "rope_local_base_freq": self.local_rope.theta,
          "query_pre_attn_scalar": int(scalar) if float(scalar).is_integer() else scalar,  # an int field in HF
          "final_logit_softcapping": self.final_logit_softcapping,
          "attn_logit_softcapping": None,
          "attention_bias": False,
          "use_bidirectional_attention": False,
          "sliding_window": next(iter(windows)) if windows else None,
          "layer_types": ["sliding_attention" if w else "full_attention" for w in self.sliding_windows],
        }
      )
    if self.family in ("qwen2", "qwen3"):
      d["use_sliding_window"] = bool(windows)
      d["sliding_window"] = next(iter(windows)) if windows else None
      d["layer_types"] = ["sliding_attention" if w else "full_attention" for w in self.sliding_windows]
      d["max_window_layers"] = next((i for i, w in enumerate(self.sliding_windows) if w), self.num_layers)
    elif self.family in ("mistral", "phi3"):
      d["sliding_window"] = next(iter(windows)) if windows else None
    if len(windows) > 1:
      raise UnsupportedModelError(f"cannot export several sliding-window sizes {sorted(windows)} to config.json")
    return d
