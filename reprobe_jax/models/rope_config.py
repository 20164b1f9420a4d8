"""Rotary embedding parameters: one frozen dataclass for every RoPE type Hugging Face `transformers` defines.

`ModelConfig.rope` (and Gemma 3's `local_rope` for its sliding-window layers) holds one; `hf_config.read_rope` reads
it from a config.json's rope dict and `RopeConfig.to_hf` writes it back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from reprobe_jax.errors import ConfigError, UnsupportedModelError
from reprobe_jax.fields import Int, Real

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")

# Fields each rope type cannot do without (HF's `rope_config_validation`); llama3/yarn/longrope also need
# original_max_position_embeddings.
_ROPE_NEEDS = {
  "linear": ("factor",),
  "dynamic": ("factor",),
  "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
  "yarn": ("original_max_position_embeddings",),
  "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}
POSITIVE = Real(0.0, low_open=True)  # a finite number > 0 (not a bool)


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

  def __post_init__(self):
    if self.rope_type not in ROPE_TYPES:
      raise UnsupportedModelError(f"rope type {self.rope_type!r} is not supported; supported: {ROPE_TYPES}")
    for name in (
      "theta",
      "factor",
      "low_freq_factor",
      "high_freq_factor",
      "beta_fast",
      "beta_slow",
      "attention_factor",
      "mscale",
      "mscale_all_dim",
    ):
      v = getattr(self, name)
      if v is not None and not POSITIVE.ok(v):
        raise ConfigError(f"rope {name} must be a finite number > 0, got {v!r}")
    orig = self.original_max_position_embeddings
    if orig is not None and not Int(1).ok(orig):
      raise ConfigError(f"rope original_max_position_embeddings must be an integer >= 1, got {orig!r}")
    for name in _ROPE_NEEDS.get(self.rope_type, ()):
      if getattr(self, name) is None:
        raise ConfigError(f"rope type {self.rope_type!r} needs {name}")
    if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
      raise ConfigError(
        f"rope type 'llama3' needs high_freq_factor > low_freq_factor, got {self.high_freq_factor} "
        f"and {self.low_freq_factor}"
      )
    for name in ("short_factor", "long_factor"):
      v = getattr(self, name)
      if v is not None and not all(POSITIVE.ok(x) for x in v):
        raise ConfigError(f"rope {name} must hold finite numbers > 0")

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
