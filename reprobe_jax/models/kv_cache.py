"""A fixed-size KV cache whose rows can be gathered, or can share one read-only prefix, so many continuations
branch from one context.

Layout: per layer k, v [B, KV, S, Dh] (the layout attention reads); `valid` [B, S] marks filled, non-padding slots;
`index` [B] is each row's next slot to write (a prefill writes every row's left-padded prompt in lockstep; after
that each row appends at its own slot, so a row that waits while others decode leaves no hole and fills its cache
only with its own tokens); `positions` [B] is each row's next RoPE position (its count of real tokens so far).

Two ways to branch a prefilled context into many rows:
- `take(rows)` copies the rows' buffers (the whole prefix per row);
- `share(n, size, cut)` keeps the context as a read-only `prefix` of P rows and gives each of its n continuations
  (rows p * n .. p * n + n - 1) only a suffix cache of `size` slots. Attention reads each prefix row's keys once for
  all n of its rows (Hydragen / cascade attention). `prefix_cut` [B] lets a row see only the prefix slots before
  its cut, which is exact for causal attention: SPAE's probes at every step boundary of one trajectory read that
  trajectory's full cache, each cut at its boundary, with no copy.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from reprobe_jax.models.config import ModelConfig


@struct.dataclass
class KVCache:
  k: tuple[Float[Array, "batch kv slots head_dim"], ...]  # per layer
  v: tuple[Float[Array, "batch kv slots head_dim"], ...]  # per layer
  valid: Bool[Array, "batch slots"]
  positions: Int[Array, " batch"]
  index: Int[Array, " batch"]
  prefix: "KVCache | None" = None  # read-only shared context of P rows (rows b // (B // P) read row b's prefix)
  prefix_cut: Int[Array, " batch"] | None = None  # row b sees prefix slots [0, cut)

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
      index=jnp.zeros((batch,), jnp.int32),
    )

  def take(self, rows) -> "KVCache":
    """Gathers rows [B'] of every own buffer: repeat a context for N samples, or keep beam survivors. With a shared
    prefix, rows must stay with their prefix (row b' = rows[b'] reads prefix row b' // (B' // P)), which the caller
    guarantees (a traced gather cannot check it)."""
    g = lambda x: jnp.take(x, rows, axis=0)
    return self.replace(
      k=tuple(map(g, self.k)),
      v=tuple(map(g, self.v)),
      valid=g(self.valid),
      positions=g(self.positions),
      index=g(self.index),
      prefix_cut=None if self.prefix_cut is None else g(self.prefix_cut),
    )

  def share(self, n: int, size: int, cut=None) -> "KVCache":
    """A cache of P * n rows whose read-only prefix is this cache (P rows) and whose own buffers are `size` empty
    slots. cut [P * n] int32 (default: every slot) limits the prefix slots row b sees; its positions continue
    from the prefix's real tokens before the cut."""
    if self.prefix is not None:
      raise ValueError("a shared prefix cannot itself have a prefix; `take` the rows first")
    p = self.batch
    b = p * n
    cut = jnp.full((b,), self.size, jnp.int32) if cut is None else jnp.asarray(cut, jnp.int32)
    seen = jnp.repeat(self.valid, n, axis=0) & (jnp.arange(self.size)[None, :] < cut[:, None])  # [B, Sp]
    kv, hd = self.k[0].shape[1], self.k[0].shape[3]
    dtype = self.k[0].dtype
    return KVCache(
      k=tuple(jnp.zeros((b, kv, size, hd), dtype) for _ in self.k),
      v=tuple(jnp.zeros((b, kv, size, hd), dtype) for _ in self.v),
      valid=jnp.zeros((b, size), bool),
      positions=jnp.sum(seen, axis=1, dtype=jnp.int32),
      index=jnp.zeros((b,), jnp.int32),
      prefix=self,
      prefix_cut=cut,
    )

  def prefix_view(self):
    """(per-layer (k, v) [P, KV, Sp, Dh], valid [B, Sp]) for the decoder, or None without a shared prefix."""
    if self.prefix is None:
      return None
    p = self.prefix
    seen = jnp.repeat(p.valid, self.batch // p.batch, axis=0)
    seen = seen & (jnp.arange(p.size)[None, :] < self.prefix_cut[:, None])
    return p.layers(), seen

  def layers(self):
    return tuple(zip(self.k, self.v))
