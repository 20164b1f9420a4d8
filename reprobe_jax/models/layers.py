"""The decoder's building blocks: linear layers (through the CPU decode kernel where a packed copy of the weight
exists) and the RMSNorms of the model families."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from reprobe_jax import kernels
from reprobe_jax.models.config import ModelConfig

_INIT = jax.nn.initializers.normal(0.02)


def param(rngs, shape, axes, dtype, init=_INIT):
  """A parameter of `shape` drawn by `init`, with its logical axis names (for sharding)."""
  return nnx.Param(init(rngs.params(), shape, dtype), logical_axes=axes)


class PackedWeight(nnx.Variable):
  """A copy of a weight packed for the CPU decode kernel (`reprobe_jax.kernels.pack`): not a parameter. Only the
  decode view made by `with_packed_weights` holds one; training, export and sharding never see it."""


def _rows(x) -> int:
  return int(np.prod(x.shape[:-1]))


def fused_matmul(x, linears, packed) -> list:
  """[x @ l.kernel (+ l.bias) for l in linears]: one packed-kernel call over the linears' weights side by side where
  `packed` (their concatenation, packed: `with_packed_weights`) exists and x has at most `kernels.MAX_ROWS` rows,
  else each Linear on its own. The kernel computes every output column from its own weight column alone, so the
  parts equal the separate products bit for bit; one call instead of three (q, k, v) or two (gate, up) saves the
  kernel's per-call start (thread hand-off, a fresh stream to prefetch), about 8% of a batch-1 SmolLM2 chain."""
  if packed is None or _rows(x) > kernels.MAX_ROWS:
    return [lin(x) for lin in linears]
  widths = [lin.kernel.shape[1] for lin in linears]
  y = kernels.packed_matmul(x, packed[...], sum(widths))
  out, at = [], 0
  for lin, n in zip(linears, widths):
    part = y[..., at : at + n]
    out.append(part + lin.bias[...] if lin.bias is not None else part)
    at += n
  return out


def matmul(x, w, packed, preferred_element_type=None):
  """x [..., K] @ w [K, N]: through the packed-weight kernel where a packed copy of w exists and x has at most
  `kernels.MAX_ROWS` rows (a decode step), else XLA's dot."""
  if packed is not None and _rows(x) <= kernels.MAX_ROWS:
    return kernels.packed_matmul(x, packed[...], w.shape[1])
  return jnp.einsum("...i,io->...o", x, w, preferred_element_type=preferred_element_type)


class Linear(nnx.Module):
  """y = x @ kernel (+ bias); kernel [in, out]."""

  def __init__(self, din: int, dout: int, axes: tuple[str, str], *, bias: bool, dtype, rngs: nnx.Rngs):
    self.kernel = param(rngs, (din, dout), axes, dtype)
    self.bias = param(rngs, (dout,), (axes[1],), dtype, jax.nn.initializers.zeros) if bias else None
    self.packed = None  # a PackedWeight in the decode view on CPU (with_packed_weights)

  def __call__(self, x):
    y = matmul(x, self.kernel[...], self.packed)
    return y + self.bias[...] if self.bias is not None else y


def _normalised(x, eps: float):
  """x / rms(x) over the last axis, in float32."""
  xf = x.astype(jnp.float32)
  return xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)


class RMSNorm(nnx.Module):
  """HF RMSNorm: normalise in float32, cast back, then scale."""

  _init_scale = staticmethod(jnp.ones)

  def __init__(self, dim: int, eps: float, *, dtype, rngs: nnx.Rngs):
    del rngs
    self.scale = nnx.Param(self._init_scale((dim,), dtype), logical_axes=("norm",))
    self.eps = eps

  def __call__(self, x):
    return self.scale[...] * _normalised(x, self.eps).astype(x.dtype)


class GemmaRMSNorm(RMSNorm):
  """Gemma's RMSNorm: y = x_hat * (1 + scale), all in float32, then cast. `scale` is zero-centred, as HF stores it."""

  _init_scale = staticmethod(jnp.zeros)

  def __call__(self, x):
    return (_normalised(x, self.eps) * (1.0 + self.scale[...].astype(jnp.float32))).astype(x.dtype)


def norm_for(cfg: ModelConfig):
  """The RMSNorm class of a model family: Gemma's zero-centred one, else HF's."""
  return GemmaRMSNorm if cfg.sandwich_norms else RMSNorm
