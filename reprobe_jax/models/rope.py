"""Rotary position embeddings in Hugging Face's half-split layout, with the scaling types the families ship.

Inverse frequencies are computed once, in float32 numpy, exactly as `transformers.modeling_rope_utils` does.
`longrope` and `dynamic` depend on the sequence length; HF decides them per forward call from max(position_ids)+1,
and so do we, with a traced select (no recompile).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from reprobe_jax.models.config import ModelConfig
from reprobe_jax.models.rope_config import RopeConfig


def _base_exponents(dim: int) -> np.ndarray:
  return np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)  # [dim/2]


def _default_inv_freq(theta: float, dim: int) -> np.ndarray:
  return (1.0 / (np.float32(theta) ** _base_exponents(dim))).astype(np.float32)


def _yarn(cfg: ModelConfig, r: RopeConfig, dim: int) -> tuple[np.ndarray, float]:
  base = r.theta
  factor = r.factor if r.factor is not None else cfg.max_position_embeddings / r.original_max_position_embeddings

  def get_mscale(scale, m=1.0):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

  attention_factor = r.attention_factor
  if attention_factor is None:
    if r.mscale and r.mscale_all_dim:
      attention_factor = float(get_mscale(factor, r.mscale) / get_mscale(factor, r.mscale_all_dim))
    else:
      attention_factor = get_mscale(factor)
  beta_fast = r.beta_fast or 32
  beta_slow = r.beta_slow or 1

  def correction_dim(num_rot):
    return (dim * math.log(r.original_max_position_embeddings / (num_rot * 2 * math.pi))) / (2 * math.log(base))

  low, high = correction_dim(beta_fast), correction_dim(beta_slow)
  if r.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001
  ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
  pos_freqs = np.float32(base) ** _base_exponents(dim)
  extrapolation = 1.0 / pos_freqs
  interpolation = 1.0 / (np.float32(factor) * pos_freqs)
  extra_factor = 1 - ramp
  inv = interpolation * (1 - extra_factor) + extrapolation * extra_factor
  return inv.astype(np.float32), float(attention_factor)


def _llama3(r: RopeConfig, dim: int) -> np.ndarray:
  inv = _default_inv_freq(r.theta, dim)
  factor, low_ff, high_ff = r.factor, r.low_freq_factor, r.high_freq_factor
  old_ctx = r.original_max_position_embeddings
  low_wavelen, high_wavelen = old_ctx / low_ff, old_ctx / high_ff
  wavelen = 2 * math.pi / inv
  inv_llama = np.where(wavelen > low_wavelen, inv / factor, inv)
  smooth = (old_ctx / wavelen - low_ff) / (high_ff - low_ff)
  smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
  medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
  return np.where(medium, smoothed, inv_llama).astype(np.float32)


def rope_inv_freq(cfg: ModelConfig, max_position=None, rope: RopeConfig | None = None):
  """Inverse frequencies [rotary_dim/2] and the cos/sin scale of `rope` (default: the config's `rope`).

  `max_position` (traced int, max position id in the call) is used only by `dynamic` and `longrope`.
  """
  r, dim = (cfg.rope if rope is None else rope), cfg.rotary_dim
  if r.rope_type == "default":
    return jnp.asarray(_default_inv_freq(r.theta, dim)), 1.0
  if r.rope_type == "linear":
    return jnp.asarray(_default_inv_freq(r.theta, dim) / np.float32(r.factor)), 1.0
  if r.rope_type == "llama3":
    return jnp.asarray(_llama3(r, dim)), 1.0
  if r.rope_type == "yarn":
    inv, scale = _yarn(cfg, r, dim)
    return jnp.asarray(inv), scale
  if r.rope_type == "dynamic":
    max_pos = cfg.max_position_embeddings
    seq_len = jnp.maximum(max_position + 1, max_pos).astype(jnp.float32)
    base = r.theta * ((r.factor * seq_len / max_pos) - (r.factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** jnp.asarray(_base_exponents(dim))), 1.0
  if r.rope_type == "longrope":
    orig = r.original_max_position_embeddings
    factor = r.factor if r.factor is not None else cfg.max_position_embeddings / orig
    scale = r.attention_factor
    if scale is None:
      scale = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    shape = np.float32(r.theta) ** _base_exponents(dim)
    short = 1.0 / (np.asarray(r.short_factor, np.float32) * shape)
    long = 1.0 / (np.asarray(r.long_factor, np.float32) * shape)
    return jnp.where(max_position + 1 > orig, jnp.asarray(long), jnp.asarray(short)), scale
  raise AssertionError(r.rope_type)


def rope_cos_sin(cfg: ModelConfig, positions, rope: RopeConfig | None = None):
  """cos, sin [B, T, rotary_dim] in float32 for integer positions [B, T], of `rope` (default: the config's)."""
  inv_freq, scale = rope_inv_freq(cfg, jnp.max(positions), rope)
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, rotary_dim/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)  # [B, T, rotary_dim]
  return jnp.cos(emb) * scale, jnp.sin(emb) * scale


def apply_rope(x, cos, sin):
  """Rotates the first rotary_dim features of x [B, T, H, Dh]; the rest pass through (partial rotary)."""
  rd = cos.shape[-1]
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [B, T, 1, rd]
  x_rot, x_pass = x[..., :rd], x[..., rd:]
  half = rd // 2
  rotated = jnp.concatenate([-x_rot[..., half:], x_rot[..., :half]], axis=-1)
  out = x_rot.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin
  return jnp.concatenate([out.astype(x.dtype), x_pass], axis=-1)
