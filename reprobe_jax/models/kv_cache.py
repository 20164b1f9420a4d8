"""A fixed-size KV cache whose rows can be gathered, so many continuations branch from one shared prefix.

Layout: per layer k, v [B, KV, S, Dh] (the layout attention reads); `valid` [B, S] marks filled, non-padding slots; `index` is the next slot
to write (shared by all rows: prompts are left-padded to one bucket, so every row writes in lockstep);
`positions` [B] is each row's next RoPE position (its count of real tokens so far).

Branching: prefill a prompt once, then `cache.take(rows)` repeats or reorders rows (Best-of-N samples, beam
search survivors, SPAE's N probe continuations at a step boundary) without recomputing the prefix.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from reprobe_jax.models.config import ModelConfig


@struct.dataclass
class KVCache:
  k: tuple  # per layer [B, KV, S, Dh]
  v: tuple  # per layer [B, KV, S, Dh]
  valid: jax.Array  # [B, S] bool
  positions: jax.Array  # [B] int32
  index: jax.Array  # [] int32

  @property
  def size(self) -> int:
    return self.valid.shape[1]

  @property
  def batch(self) -> int:
    return self.valid.shape[0]

  @classmethod
  def zeros(cls, cfg: ModelConfig, batch: int, size: int, dtype=jnp.float32) -> "KVCache":
    shape = (batch, cfg.num_kv_heads, size, cfg.head_dim)
    return cls(
        k=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)),
        v=tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)),
        valid=jnp.zeros((batch, size), bool),
        positions=jnp.zeros((batch,), jnp.int32),
        index=jnp.zeros((), jnp.int32),
    )

  def take(self, rows) -> "KVCache":
    """Gathers rows [B'] of every buffer: repeat a prefix for N samples, or keep beam survivors."""
    g = lambda x: jnp.take(x, rows, axis=0)
    return self.replace(k=tuple(map(g, self.k)), v=tuple(map(g, self.v)), valid=g(self.valid),
                        positions=g(self.positions))

  def layers(self):
    return tuple(zip(self.k, self.v))
