"""The model configuration: one frozen dataclass for every supported decoder family.

It is read from a Hugging Face `config.json` (old `rope_scaling` style and the v5 `rope_parameters` style) or from
GGUF metadata (see `gguf_io.py`), and written back as a `config.json` that PyTorch `transformers` loads.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from reprobe_jax.errors import ConfigError, UnsupportedModelError

# Hugging Face `model_type` -> our family name. Mistral and SmolLM2 are Llama-shaped.
FAMILIES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
}
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
  """Rotary embedding parameters (Hugging Face `rope_parameters`), hashable."""

  rope_type: str = "default"
  theta: float = 10000.0
  factor: float | None = None
  original_max_position_embeddings: int | None = None
  low_freq_factor: float | None = None  # llama3
  high_freq_factor: float | None = None  # llama3
  beta_fast: float | None = None  # yarn
  beta_slow: float | None = None  # yarn
  attention_factor: float | None = None  # yarn, longrope
  mscale: float | None = None  # yarn
  mscale_all_dim: float | None = None  # yarn
  truncate: bool = True  # yarn
  short_factor: tuple[float, ...] | None = None  # longrope
  long_factor: tuple[float, ...] | None = None  # longrope

  def to_hf(self, partial_rotary_factor: float) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_type": self.rope_type, "rope_theta": self.theta}
    for f in dataclasses.fields(self):
      if f.name in ("rope_type", "theta", "truncate"):
        continue
      v = getattr(self, f.name)
      if v is not None:
        out[f.name] = list(v) if isinstance(v, tuple) else v
    if self.rope_type == "yarn" and not self.truncate:
      out["truncate"] = False
    if partial_rotary_factor != 1.0:
      out["partial_rotary_factor"] = partial_rotary_factor
    return out


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
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  pad_token_id: int | None = None

  def __post_init__(self):
    if self.family not in FAMILIES.values():
      raise UnsupportedModelError(
          f"model family {self.family!r} is not supported; supported: {sorted(set(FAMILIES.values()))}")
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    if self.rope.rope_type not in ROPE_TYPES:
      raise UnsupportedModelError(f"rope type {self.rope.rope_type!r} is not supported; supported: {ROPE_TYPES}")
    if self.hidden_act != "silu":
      raise UnsupportedModelError(f"hidden_act {self.hidden_act!r} is not supported (only 'silu')")
    if not self.sliding_windows:
      object.__setattr__(self, "sliding_windows", (None,) * self.num_layers)
    if len(self.sliding_windows) != self.num_layers:
      raise ConfigError(f"sliding_windows has {len(self.sliding_windows)} entries for {self.num_layers} layers")

  @property
  def rotary_dim(self) -> int:
    return int(self.head_dim * self.partial_rotary_factor)

  @property
  def num_params(self) -> int:
    d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
    q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    per_layer = d * (q + 2 * kv) + q * d + 3 * d * f + 2 * d
    per_layer += (q + 2 * kv) if self.attention_bias else 0
    per_layer += 2 * self.head_dim if self.qk_norm else 0
    return v * d * (1 if self.tie_word_embeddings else 2) + self.num_layers * per_layer + d

  def replace(self, **kw) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  # ---------------------------------------------------------------- Hugging Face config.json

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any], *, source: str = "config.json") -> "ModelConfig":
    """Builds a config from a Hugging Face `config.json` dict; names the field that is missing or unsupported."""
    model_type = d.get("model_type")
    if model_type not in FAMILIES:
      raise UnsupportedModelError(
          f"{source}: model_type {model_type!r} is not supported; supported: {sorted(FAMILIES)}")
    family = FAMILIES[model_type]

    def need(key):
      if key not in d or d[key] is None:
        raise ConfigError(f"{source}: required field {key!r} is missing")
      return d[key]

    num_heads = int(need("num_attention_heads"))
    hidden = int(need("hidden_size"))
    head_dim = d.get("head_dim") or hidden // num_heads
    num_layers = int(need("num_hidden_layers"))
    rope_params = dict(d.get("rope_parameters") or {})
    legacy = d.get("rope_scaling") or {}
    if legacy and not rope_params.get("rope_type"):
      rope_params.update(legacy)
    if "type" in rope_params and "rope_type" not in rope_params:
      rope_params["rope_type"] = rope_params.pop("type")
    theta = rope_params.get("rope_theta", d.get("rope_theta", 10000.0))
    partial = float(rope_params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) or 1.0)
    rope_type = rope_params.get("rope_type", "default") or "default"
    if rope_type == "su":  # old Phi-3 name
      rope_type = "longrope"
    if rope_type not in ROPE_TYPES:
      raise UnsupportedModelError(f"{source}: rope type {rope_type!r} is not supported; supported: {ROPE_TYPES}")

    def opt_tuple(key):
      v = rope_params.get(key)
      return tuple(float(x) for x in v) if v is not None else None

    orig_max = rope_params.get("original_max_position_embeddings", d.get("original_max_position_embeddings"))
    rope = RopeConfig(
        rope_type=rope_type,
        theta=float(theta),
        factor=rope_params.get("factor"),
        original_max_position_embeddings=orig_max,
        low_freq_factor=rope_params.get("low_freq_factor"),
        high_freq_factor=rope_params.get("high_freq_factor"),
        beta_fast=rope_params.get("beta_fast"),
        beta_slow=rope_params.get("beta_slow"),
        attention_factor=rope_params.get("attention_factor"),
        mscale=rope_params.get("mscale"),
        mscale_all_dim=rope_params.get("mscale_all_dim"),
        truncate=bool(rope_params.get("truncate", True)),
        short_factor=opt_tuple("short_factor"),
        long_factor=opt_tuple("long_factor"),
    )
    if rope_type in ("yarn", "longrope", "llama3") and orig_max is None:
      raise ConfigError(f"{source}: rope type {rope_type!r} needs original_max_position_embeddings")

    # Sliding windows, per layer, the way each family's HF code decides them.
    window = d.get("sliding_window")
    if family in ("qwen2", "qwen3"):
      layer_types = d.get("layer_types")
      if d.get("use_sliding_window") and window:
        if layer_types is None:
          mwl = d.get("max_window_layers", num_layers)
          layer_types = ["sliding_attention" if i >= mwl else "full_attention" for i in range(num_layers)]
        windows = tuple(window if t == "sliding_attention" else None for t in layer_types)
      else:
        windows = (None,) * num_layers
    elif family in ("mistral", "phi3"):
      windows = (int(window) if window else None,) * num_layers
    else:
      windows = (None,) * num_layers

    if d.get("mlp_bias"):
      raise UnsupportedModelError(f"{source}: mlp_bias=True is not supported")
    eos = d.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    return cls(
        family=family,
        vocab_size=int(need("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope=rope,
        partial_rotary_factor=partial,
        max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        attention_bias=bool(d.get("attention_bias", family == "qwen2")) and family != "phi3",
        qk_norm=family == "qwen3",
        sliding_windows=windows,
        hidden_act=d.get("hidden_act", "silu"),
        bos_token_id=d.get("bos_token_id"),
        eos_token_ids=eos_ids,
        pad_token_id=d.get("pad_token_id"),
    )

  @classmethod
  def from_json_file(cls, path: str | os.PathLike) -> "ModelConfig":
    try:
      with open(path) as f:
        d = json.load(f)
    except json.JSONDecodeError as e:
      raise ConfigError(f"{path}: not valid JSON ({e})") from e
    return cls.from_hf_dict(d, source=str(path))

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
        "eos_token_id": (list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else
                         (self.eos_token_ids[0] if self.eos_token_ids else None)),
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
