"""The model configuration: one frozen dataclass for every supported decoder family.

It is read from a Hugging Face `config.json` (old `rope_scaling` style and the v5 `rope_parameters` style) or from
GGUF metadata (see `gguf_io.py`), and written back as a `config.json` that PyTorch `transformers` loads.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from typing import Any, Mapping

from reprobe_jax.errors import ConfigError, ReprobeError, UnsupportedModelError
from reprobe_jax.io.readers import read_json

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

# transformers' `Gemma3TextConfig` defaults: a config.json may leave any of these out and mean them.
_GEMMA3_DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "tie_word_embeddings": True,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
}
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


def is_int(x) -> bool:
  """An integer (numpy's included) that is not a bool: JSON `true` must not pass for 1."""
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_number(x) -> bool:
  return isinstance(x, numbers.Real) and not isinstance(x, bool)


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
    for name in ("theta", "factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
                 "attention_factor", "mscale", "mscale_all_dim"):
      v = getattr(self, name)
      if v is not None and not (_is_number(v) and math.isfinite(v) and v > 0):
        raise ConfigError(f"rope {name} must be a finite number > 0, got {v!r}")
    orig = self.original_max_position_embeddings
    if orig is not None and not (is_int(orig) and orig >= 1):
      raise ConfigError(f"rope original_max_position_embeddings must be an integer >= 1, got {orig!r}")
    for name in _ROPE_NEEDS.get(self.rope_type, ()):
      if getattr(self, name) is None:
        raise ConfigError(f"rope type {self.rope_type!r} needs {name}")
    if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
      raise ConfigError(f"rope type 'llama3' needs high_freq_factor > low_freq_factor, got {self.high_freq_factor} "
                        f"and {self.low_freq_factor}")
    for name in ("short_factor", "long_factor"):
      v = getattr(self, name)
      if v is not None and not all(_is_number(x) and math.isfinite(x) and x > 0 for x in v):
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
          f"model family {self.family!r} is not supported; supported: {sorted(set(FAMILIES.values()))}")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "max_position_embeddings"):
      v = getattr(self, name)
      if not (is_int(v) and v >= 1):
        raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
    if not (_is_number(self.rms_norm_eps) and math.isfinite(self.rms_norm_eps) and self.rms_norm_eps > 0):
      raise ConfigError(f"rms_norm_eps must be a finite number > 0, got {self.rms_norm_eps!r}")
    if not (_is_number(self.partial_rotary_factor) and 0 < self.partial_rotary_factor <= 1):
      raise ConfigError(f"partial_rotary_factor must be in (0, 1], got {self.partial_rotary_factor!r}")
    if self.rotary_dim < 2 or self.rotary_dim % 2:
      raise ConfigError(f"head_dim={self.head_dim} x partial_rotary_factor={self.partial_rotary_factor} gives "
                        f"{self.rotary_dim} rotary dimensions; RoPE needs an even number >= 2")
    for rope in (self.rope, self.local_rope):
      if rope is None:
        continue
      if rope.rope_type == "dynamic" and self.rotary_dim < 4:
        raise ConfigError(f"rope type 'dynamic' needs at least 4 rotary dimensions, got {self.rotary_dim}")
      for name in ("short_factor", "long_factor"):
        v = getattr(rope, name)
        if rope.rope_type == "longrope" and (v is None or len(v) != self.rotary_dim // 2):
          raise ConfigError(f"rope type 'longrope' needs {name} with rotary_dim / 2 = {self.rotary_dim // 2} "
                            f"entries, got {None if v is None else len(v)}")
    for name in ("tie_word_embeddings", "attention_bias", "qk_norm"):
      if not isinstance(getattr(self, name), bool):
        raise ConfigError(f"{name} must be a boolean, got {getattr(self, name)!r}")
    for name, ids in (("bos_token_id", (self.bos_token_id,)), ("pad_token_id", (self.pad_token_id,)),
                      ("eos_token_ids", self.eos_token_ids)):
      for i in ids:
        if i is not None and not (is_int(i) and 0 <= i < self.vocab_size):
          raise ConfigError(f"{name}: {i!r} is not a token id in [0, vocab_size={self.vocab_size})")
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    if self.hidden_act not in ACTIVATIONS:
      raise UnsupportedModelError(f"hidden_act {self.hidden_act!r} is not supported; supported: {ACTIVATIONS}")
    for name in ("query_pre_attn_scalar", "final_logit_softcapping"):
      v = getattr(self, name)
      if v is not None and not (_is_number(v) and math.isfinite(v) and v > 0):
        raise ConfigError(f"{name} must be a finite number > 0, got {v!r}")
    if self.family != "gemma3":  # the HF configs of the other families have no field for these
      for name in ("local_rope", "query_pre_attn_scalar", "final_logit_softcapping"):
        if getattr(self, name) is not None:
          raise ConfigError(f"{name} is a Gemma 3 option; family {self.family!r} has no such field")
    else:
      if self.partial_rotary_factor != 1.0:
        raise ConfigError(f"family 'gemma3' rotates the whole head (partial_rotary_factor 1), got "
                          f"{self.partial_rotary_factor}")
      if not self.qk_norm or self.attention_bias:  # what Gemma3ForCausalLM has, and what its config.json can say
        raise ConfigError(f"family 'gemma3' has q/k norms and no attention biases (qk_norm=True, "
                          f"attention_bias=False), got qk_norm={self.qk_norm}, attention_bias={self.attention_bias}")
      # Spelled out, so that a config built in code equals the same config read back from its config.json.
      if self.local_rope is None:
        object.__setattr__(self, "local_rope", self.rope)
      if self.query_pre_attn_scalar is None:
        object.__setattr__(self, "query_pre_attn_scalar", float(self.head_dim))
    if not self.sliding_windows:
      object.__setattr__(self, "sliding_windows", (None,) * self.num_layers)
    if len(self.sliding_windows) != self.num_layers:
      raise ConfigError(f"sliding_windows has {len(self.sliding_windows)} entries for {self.num_layers} layers")
    if not all(w is None or (is_int(w) and w >= 1) for w in self.sliding_windows):
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
          f"{source}: model_type {model_type!r} is not supported; supported: {sorted(FAMILIES)}")
    family = FAMILIES[model_type]
    prefix = ""
    if model_type == "gemma3":
      d, prefix = _gemma3_text_config(d, source), "text_config."
    if family == "gemma3":
      d = {**_GEMMA3_DEFAULTS, **d}
    f = _Fields(d, source, prefix)
    num_heads = f.integer("num_attention_heads")
    hidden = f.integer("hidden_size")
    head_dim = f.integer("head_dim", None)
    if head_dim is None:
      if hidden < num_heads:
        raise ConfigError(f"{source}: hidden_size={hidden} < num_attention_heads={num_heads} gives head_dim 0")
      head_dim = hidden // num_heads
    num_layers = f.integer("num_hidden_layers")

    local_rope = None
    if family == "gemma3":
      rope, partial, local_rope = _gemma3_ropes(f)
    else:
      rope_params = dict(f.mapping("rope_parameters"))
      legacy = f.mapping("rope_scaling")
      if legacy and not rope_params.get("rope_type"):
        rope_params.update(legacy)
      rope, partial = _read_rope(f, rope_params, "rope_parameters.", "rope_theta", 10000.0)

    # Sliding windows, per layer, the way each family's HF code decides them.
    window = f.integer("sliding_window", None)
    if family in ("qwen2", "qwen3"):
      layer_types = f.items("layer_types", str)
      if f.flag("use_sliding_window", False) and window:
        if layer_types is None:
          mwl = f.integer("max_window_layers", num_layers, low=0)
          layer_types = ["sliding_attention" if i >= mwl else "full_attention" for i in range(num_layers)]
        windows = _layer_windows(f, layer_types, num_layers, window)
      else:
        windows = (None,) * num_layers
    elif family == "gemma3":
      layer_types = f.items("layer_types", str)
      if layer_types is None:  # transformers' rule: every `sliding_window_pattern`-th layer is global
        pattern = f.integer("sliding_window_pattern")
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
      if window is None and "sliding_attention" in layer_types:
        raise ConfigError(f"{source}: layer_types has 'sliding_attention' layers but sliding_window is null")
      windows = _layer_windows(f, layer_types, num_layers, window)
    elif family in ("mistral", "phi3"):
      windows = (window,) * num_layers
    else:
      windows = (None,) * num_layers

    if f.flag("mlp_bias", False):
      raise UnsupportedModelError(f"{source}: mlp_bias=True is not supported")
    if isinstance(d.get("eos_token_id"), list):
      eos_ids = tuple(f.items("eos_token_id", int))
    else:
      eos = f.integer("eos_token_id", None, low=0)
      eos_ids = () if eos is None else (eos,)
    gemma = family == "gemma3"
    if gemma:
      _check_gemma3_options(f)
    return _built(source, lambda: cls(
        family=family,
        vocab_size=f.integer("vocab_size"),
        hidden_size=hidden,
        intermediate_size=f.integer("intermediate_size"),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=f.integer("num_key_value_heads", num_heads),
        head_dim=head_dim,
        rms_norm_eps=f.number("rms_norm_eps", 1e-6),
        rope=rope,
        partial_rotary_factor=partial,
        max_position_embeddings=f.integer("max_position_embeddings", 4096),
        tie_word_embeddings=f.flag("tie_word_embeddings", False),
        attention_bias=f.flag("attention_bias", family == "qwen2") and family != "phi3",
        qk_norm=family in ("qwen3", "gemma3"),
        sliding_windows=windows,
        hidden_act=f.text("hidden_activation") if gemma else f.text("hidden_act", "silu"),
        local_rope=local_rope,
        query_pre_attn_scalar=f.number("query_pre_attn_scalar") if gemma else None,
        final_logit_softcapping=f.number("final_logit_softcapping", None) if gemma else None,
        bos_token_id=f.integer("bos_token_id", None, low=0),
        eos_token_ids=eos_ids,
        pad_token_id=f.integer("pad_token_id", None, low=0),
    ))

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
    if self.family == "gemma3":
      d.pop("hidden_act")
      scalar = self.query_pre_attn_scalar
      d.update({
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
      })
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


def _either(first, second):
  return second if first is None else first


def _read_rope(f: "_Fields", params: Mapping[str, Any], where: str, theta_key: str,
               theta_default: float) -> tuple[RopeConfig, float]:
  """(RoPE, partial_rotary_factor) from one HF rope dict `params` (found at `where` in the config), with the
  top-level fields of older configs (`theta_key`, partial_rotary_factor, original_max_position_embeddings) as
  fallbacks; the rope dict wins."""
  params = dict(params)
  if "type" in params and "rope_type" not in params:
    params["rope_type"] = params.pop("type")
  source = f.source
  r = _Fields(params, source, f.prefix + where)
  rope_type = r.text("rope_type", "default")
  if rope_type == "su":  # old Phi-3 name
    rope_type = "longrope"
  if rope_type not in ROPE_TYPES:
    raise UnsupportedModelError(f"{source}: rope type {rope_type!r} is not supported; supported: {ROPE_TYPES}")
  theta = _either(r.number("rope_theta", None), f.number(theta_key, theta_default))
  partial = _either(r.number("partial_rotary_factor", None), f.number("partial_rotary_factor", 1.0))
  orig_max = _either(r.integer("original_max_position_embeddings", None),
                     f.integer("original_max_position_embeddings", None))
  rope = _built(source, lambda: RopeConfig(
      rope_type=rope_type,
      theta=theta,
      factor=r.number("factor", None),
      original_max_position_embeddings=orig_max,
      low_freq_factor=r.number("low_freq_factor", None),
      high_freq_factor=r.number("high_freq_factor", None),
      beta_fast=r.number("beta_fast", None),
      beta_slow=r.number("beta_slow", None),
      attention_factor=r.number("attention_factor", None),
      mscale=r.number("mscale", None),
      mscale_all_dim=r.number("mscale_all_dim", None),
      truncate=r.flag("truncate", True),
      short_factor=r.numbers("short_factor"),
      long_factor=r.numbers("long_factor"),
  ))
  return rope, partial


def _gemma3_ropes(f: "_Fields") -> tuple[RopeConfig, float, RopeConfig]:
  """Gemma 3's two RoPEs, as `Gemma3TextConfig.convert_rope_params_to_dict` builds them: rope_parameters maps
  'full_attention' and 'sliding_attention' to rope dicts; older configs give rope_theta (global layers),
  rope_local_base_freq (sliding layers) and rope_scaling, which applies to the global layers only."""
  params = f.mapping("rope_parameters")
  stray = sorted(set(params) - {"full_attention", "sliding_attention"})
  if stray:
    raise ConfigError(f"{f.source}: field {f.prefix + 'rope_parameters'!r} of a Gemma 3 config must map "
                      f"'full_attention' / 'sliding_attention' to rope dicts, got keys {stray}")
  nested = _Fields(params, f.source, f.prefix + "rope_parameters.")
  full = dict(nested.mapping("full_attention"))
  full.update(f.mapping("rope_scaling"))
  rope, partial = _read_rope(f, full, "rope_parameters.full_attention.", "rope_theta", 1_000_000.0)
  local, local_partial = _read_rope(f, nested.mapping("sliding_attention"), "rope_parameters.sliding_attention.",
                                    "rope_local_base_freq", 10_000.0)
  return rope, min(partial, local_partial), local  # ModelConfig refuses a partial rotary factor for Gemma 3


def _gemma3_text_config(d: Mapping[str, Any], source: str) -> dict[str, Any]:
  """The language model's config of a multimodal Gemma 3 config.json (`text_config`, a gemma3_text config); the
  LM head's tying is the outer config's (transformers ties `Gemma3ForConditionalGeneration` by it)."""
  text = _Fields(d, source).mapping("text_config")
  inner = text.get("model_type", "gemma3_text")
  if inner != "gemma3_text":
    raise UnsupportedModelError(f"{source}: text_config.model_type {inner!r} is not supported; a 'gemma3' config "
                                f"is read for its 'gemma3_text' language model")
  text = dict(text)
  text["model_type"] = "gemma3_text"
  tie = d.get("tie_word_embeddings")
  text["tie_word_embeddings"] = True if tie is None else tie  # Gemma3Config's default
  return text


def _check_gemma3_options(f: "_Fields") -> None:
  """Gemma 3 options that transformers offers but that no released checkpoint uses, refused by name."""
  softcap = f.number("attn_logit_softcapping", None)
  if softcap is not None:
    raise UnsupportedModelError(
        f"{f.source}: {f.prefix}attn_logit_softcapping={softcap}: transformers' Gemma 3 reads this field but never "
        f"applies it, so a checkpoint that sets it has no reference behaviour; set it to null")
  if f.flag("use_bidirectional_attention", False):
    raise UnsupportedModelError(f"{f.source}: {f.prefix}use_bidirectional_attention=true (an encoder) is not "
                                f"supported; this is a causal decoder")
  if f.flag("attention_bias", False):
    raise UnsupportedModelError(f"{f.source}: {f.prefix}attention_bias=true is not supported for Gemma 3 (it "
                                f"would bias o_proj too)")


def _layer_windows(f: "_Fields", layer_types, num_layers: int, window) -> tuple[int | None, ...]:
  """Per-layer windows from HF `layer_types` ('full_attention' / 'sliding_attention' for every layer)."""
  bad = sorted({t for t in layer_types if t not in ("sliding_attention", "full_attention")})
  if bad or len(layer_types) != num_layers:
    raise ConfigError(f"{f.source}: {f.prefix}layer_types must list 'full_attention' / 'sliding_attention' for "
                      f"each of the {num_layers} layers, got {len(layer_types)} entries{f' with {bad}' if bad else ''}")
  return tuple(window if t == "sliding_attention" else None for t in layer_types)


def _built(source: str, make):
  """Runs a config constructor, prefixing its error with the file it was read from."""
  try:
    return make()
  except ReprobeError as e:
    raise type(e)(f"{source}: {e}") from None


_MISSING = object()


class _Fields:
  """Typed reads of a config dict: each names `source` and the field (`prefix` + key) when a value is missing or
  of the wrong type or range. A JSON null reads as absent (the default)."""

  def __init__(self, d: Mapping[str, Any], source: str, prefix: str = ""):
    self.d, self.source, self.prefix = d, source, prefix

  def _get(self, key, default):
    v = self.d.get(key)
    if v is None:
      if default is _MISSING:
        raise ConfigError(f"{self.source}: required field {self.prefix + key!r} is missing")
    return v

  def _bad(self, key, want, v):
    return ConfigError(f"{self.source}: field {self.prefix + key!r} must be {want}, got {v!r}"[:300])

  def integer(self, key, default=_MISSING, *, low: int = 1):
    v = self._get(key, default)
    if v is None:
      return default
    if not (is_int(v) and v >= low):
      raise self._bad(key, f"an integer >= {low}", v)
    return v

  def number(self, key, default=_MISSING):
    v = self._get(key, default)
    if v is None:
      return default
    if not (_is_number(v) and math.isfinite(v)):
      raise self._bad(key, "a finite number", v)
    return float(v)

  def flag(self, key, default=_MISSING):
    v = self._get(key, default)
    if v is None:
      return default
    if not isinstance(v, bool):
      raise self._bad(key, "a JSON boolean (true / false)", v)
    return v

  def text(self, key, default=_MISSING):
    v = self._get(key, default)
    if v is None:
      return default
    if not isinstance(v, str):
      raise self._bad(key, "a string", v)
    return v

  def mapping(self, key):
    v = self.d.get(key)
    if v is None:
      return {}
    if not isinstance(v, Mapping):
      raise self._bad(key, "an object", v)
    return v

  def items(self, key, kind):
    v = self.d.get(key)
    if v is None:
      return None
    ok = (lambda x: is_int(x) and x >= 0) if kind is int else (lambda x: isinstance(x, kind))
    if not isinstance(v, list) or not all(ok(x) for x in v):
      raise self._bad(key, f"a list of {'non-negative integers' if kind is int else kind.__name__ + 's'}", v)
    return v

  def numbers(self, key):
    v = self.d.get(key)
    if v is None:
      return None
    if not isinstance(v, list) or not all(_is_number(x) and math.isfinite(x) for x in v):
      raise self._bad(key, "a list of finite numbers", v)
    return tuple(float(x) for x in v)
