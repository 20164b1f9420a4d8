"""Reading a Hugging Face `config.json`: typed field reads, and the rules by which each family's fields are read.

`ConfigFields` reads one field at a time, type- and range-checked (ints are JSON integers, booleans JSON booleans,
floats finite), and names the source file and the field in every error. The rest are the family rules that
`ModelConfig.from_hf_dict` composes: the RoPE (the v5 `rope_parameters` dict, the older top-level fields and
`rope_scaling`), Gemma 3's defaults, its multimodal `text_config` and its two RoPEs, and the per-layer sliding
windows as each family's `transformers` code decides them.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, TypeVar

from reprobe_jax.errors import ConfigError, ReprobeError, UnsupportedModelError
from reprobe_jax.fields import Int, Real
from reprobe_jax.models.rope_config import ROPE_TYPES, RopeConfig

T = TypeVar("T")

# transformers' `Gemma3TextConfig` defaults: a config.json may leave any of these out and mean them.
GEMMA3_DEFAULTS = {
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

_MISSING = object()
_FINITE = Real()


def built(source: str, make: Callable[[], T]) -> T:
  """Runs a config constructor, prefixing its error with the file it was read from."""
  try:
    return make()
  except ReprobeError as e:
    raise type(e)(f"{source}: {e}") from None


class ConfigFields:
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
    if not Int(low).ok(v):
      raise self._bad(key, f"an integer >= {low}", v)
    return v

  def number(self, key, default=_MISSING):
    v = self._get(key, default)
    if v is None:
      return default
    if not _FINITE.ok(v):
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
    ok = Int(0).ok if kind is int else (lambda x: isinstance(x, kind))
    if not isinstance(v, list) or not all(ok(x) for x in v):
      raise self._bad(key, f"a list of {'non-negative integers' if kind is int else kind.__name__ + 's'}", v)
    return v

  def numbers(self, key):
    v = self.d.get(key)
    if v is None:
      return None
    if not isinstance(v, list) or not all(_FINITE.ok(x) for x in v):
      raise self._bad(key, "a list of finite numbers", v)
    return tuple(float(x) for x in v)


# ------------------------------------------------------------------------------------------------ RoPE


class Ropes(NamedTuple):
  """The RoPE of a config: `rope` for every layer, or, for Gemma 3, the global layers and `local` the
  sliding-window ones (None elsewhere)."""

  rope: RopeConfig
  partial_rotary_factor: float
  local: RopeConfig | None = None


def _either(first, second):
  return second if first is None else first


def read_rope(
  f: ConfigFields, params: Mapping[str, Any], where: str, theta_key: str, theta_default: float
) -> tuple[RopeConfig, float]:
  """(RoPE, partial_rotary_factor) from one HF rope dict `params` (found at `where` in the config), with the
  top-level fields of older configs (`theta_key`, partial_rotary_factor, original_max_position_embeddings) as
  fallbacks; the rope dict wins."""
  params = dict(params)
  if "type" in params and "rope_type" not in params:
    params["rope_type"] = params.pop("type")
  source = f.source
  r = ConfigFields(params, source, f.prefix + where)
  rope_type = r.text("rope_type", "default")
  if rope_type == "su":  # old Phi-3 name
    rope_type = "longrope"
  if rope_type not in ROPE_TYPES:
    raise UnsupportedModelError(f"{source}: rope type {rope_type!r} is not supported; supported: {ROPE_TYPES}")
  theta = _either(r.number("rope_theta", None), f.number(theta_key, theta_default))
  partial = _either(r.number("partial_rotary_factor", None), f.number("partial_rotary_factor", 1.0))
  orig_max = _either(
    r.integer("original_max_position_embeddings", None), f.integer("original_max_position_embeddings", None)
  )
  rope = built(
    source,
    lambda: RopeConfig(
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
    ),
  )
  return rope, partial


def read_ropes(f: ConfigFields, family: str) -> Ropes:
  """The config's RoPE(s): Gemma 3's two (`_gemma3_ropes`), else `rope_parameters`, where an older config's
  `rope_scaling` fills in when rope_parameters names no rope type."""
  if family == "gemma3":
    return _gemma3_ropes(f)
  rope_params = dict(f.mapping("rope_parameters"))
  legacy = f.mapping("rope_scaling")
  if legacy and not rope_params.get("rope_type"):
    rope_params.update(legacy)
  return Ropes(*read_rope(f, rope_params, "rope_parameters.", "rope_theta", 10000.0))


def _gemma3_ropes(f: ConfigFields) -> Ropes:
  """Gemma 3's two RoPEs, as `Gemma3TextConfig.convert_rope_params_to_dict` builds them: rope_parameters maps
  'full_attention' and 'sliding_attention' to rope dicts; older configs give rope_theta (global layers),
  rope_local_base_freq (sliding layers) and rope_scaling, which applies to the global layers only."""
  params = f.mapping("rope_parameters")
  stray = sorted(set(params) - {"full_attention", "sliding_attention"})
  if stray:
    raise ConfigError(
      f"{f.source}: field {f.prefix + 'rope_parameters'!r} of a Gemma 3 config must map "
      f"'full_attention' / 'sliding_attention' to rope dicts, got keys {stray}"
    )
  nested = ConfigFields(params, f.source, f.prefix + "rope_parameters.")
  full = dict(nested.mapping("full_attention"))
  full.update(f.mapping("rope_scaling"))
  rope, partial = read_rope(f, full, "rope_parameters.full_attention.", "rope_theta", 1_000_000.0)
  local, local_partial = read_rope(
    f, nested.mapping("sliding_attention"), "rope_parameters.sliding_attention.", "rope_local_base_freq", 10_000.0
  )
  return Ropes(rope, min(partial, local_partial), local)  # ModelConfig refuses a partial rotary factor for Gemma 3


# ------------------------------------------------------------------------------------------------ Gemma 3


def gemma3_text_config(d: Mapping[str, Any], source: str) -> dict[str, Any]:
  """The language model's config of a multimodal Gemma 3 config.json (`text_config`, a gemma3_text config); the
  LM head's tying is the outer config's (transformers ties `Gemma3ForConditionalGeneration` by it)."""
  text = ConfigFields(d, source).mapping("text_config")
  inner = text.get("model_type", "gemma3_text")
  if inner != "gemma3_text":
    raise UnsupportedModelError(
      f"{source}: text_config.model_type {inner!r} is not supported; a 'gemma3' config "
      f"is read for its 'gemma3_text' language model"
    )
  text = dict(text)
  text["model_type"] = "gemma3_text"
  tie = d.get("tie_word_embeddings")
  text["tie_word_embeddings"] = True if tie is None else tie  # Gemma3Config's default
  return text


def check_gemma3_options(f: ConfigFields) -> None:
  """Gemma 3 options that transformers offers but that no released checkpoint uses, refused by name."""
  softcap = f.number("attn_logit_softcapping", None)
  if softcap is not None:
    raise UnsupportedModelError(
      f"{f.source}: {f.prefix}attn_logit_softcapping={softcap}: transformers' Gemma 3 reads this field but never "
      f"applies it, so a checkpoint that sets it has no reference behaviour; set it to null"
    )
  if f.flag("use_bidirectional_attention", False):
    raise UnsupportedModelError(
      f"{f.source}: {f.prefix}use_bidirectional_attention=true (an encoder) is not supported; this is a causal decoder"
    )
  if f.flag("attention_bias", False):
    raise UnsupportedModelError(
      f"{f.source}: {f.prefix}attention_bias=true is not supported for Gemma 3 (it would bias o_proj too)"
    )


# ------------------------------------------------------------------------------------------------ sliding windows


def sliding_windows(f: ConfigFields, family: str, num_layers: int) -> tuple[int | None, ...]:
  """Per-layer sliding windows (None: full attention), the way each family's HF code decides them."""
  window = f.integer("sliding_window", None)
  if family in ("qwen2", "qwen3"):
    layer_types = f.items("layer_types", str)
    if f.flag("use_sliding_window", False) and window:
      if layer_types is None:
        mwl = f.integer("max_window_layers", num_layers, low=0)
        layer_types = ["sliding_attention" if i >= mwl else "full_attention" for i in range(num_layers)]
      return _layer_windows(f, layer_types, num_layers, window)
    return (None,) * num_layers
  if family == "gemma3":
    layer_types = f.items("layer_types", str)
    if layer_types is None:  # transformers' rule: every `sliding_window_pattern`-th layer is global
      pattern = f.integer("sliding_window_pattern")
      layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    if window is None and "sliding_attention" in layer_types:
      raise ConfigError(f"{f.source}: layer_types has 'sliding_attention' layers but sliding_window is null")
    return _layer_windows(f, layer_types, num_layers, window)
  if family in ("mistral", "phi3"):
    return (window,) * num_layers
  return (None,) * num_layers


def _layer_windows(f: ConfigFields, layer_types, num_layers: int, window) -> tuple[int | None, ...]:
  """Per-layer windows from HF `layer_types` ('full_attention' / 'sliding_attention' for every layer)."""
  bad = sorted({t for t in layer_types if t not in ("sliding_attention", "full_attention")})
  if bad or len(layer_types) != num_layers:
    raise ConfigError(
      f"{f.source}: {f.prefix}layer_types must list 'full_attention' / 'sliding_attention' for "
      f"each of the {num_layers} layers, got {len(layer_types)} entries{f' with {bad}' if bad else ''}"
    )
  return tuple(window if t == "sliding_attention" else None for t in layer_types)
