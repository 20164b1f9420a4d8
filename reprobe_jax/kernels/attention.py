"""The two products of decode attention on CPU (`decode.cc`): scores = q . k and out = p . v per (row, KV head).

XLA:CPU runs them as B * KV tiny batched GEMMs: a 30-layer stack of SmolLM2-shaped caches read at about 10 GB/s
at batch 8-32 (docs/kernels.md), so at batch 32 with a 512-slot cache the attention products cost more than all
the weights. Here each (row, KV head) pair's keys and values are read as one stream, pairs spread over the cores.
The mask and softmax stay in XLA. `reference_qk` / `reference_pv` are the same products in XLA.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from reprobe_jax.kernels.build import Built, build

MAX_QUERIES = 64  # queries per (row, KV head) up to which the decode path uses these kernels (G * T; decode: G)

_SOURCE = "decode.cc"
_QK = ("ReprobeDecodeQk", "reprobe_decode_qk")
_PV = ("ReprobeDecodePv", "reprobe_decode_pv")


def status() -> Built:
  """The build of the two products: the first one unavailable, else the scores' (see `packed_matmul.status`)."""
  qk, pv = build(_SOURCE, *_QK), build(_SOURCE, *_PV)
  return pv if qk.target is not None and pv.target is None else qk


def available() -> bool:
  return status().target is not None


def _target(which) -> str:
  built = build(_SOURCE, *which)
  if built.target is None:
    raise RuntimeError(f"decode attention kernel unavailable: {built.reason}")
  return built.target


def _check(a, b, what: str):
  if a.ndim < 3 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2]:
    raise ValueError(
      f"{what}: [..., Q, .] and [..., S, D] with the same leading dimensions expected, got {a.shape} and {b.shape}"
    )
  if a.dtype != jnp.float32 or b.dtype != jnp.float32:
    raise ValueError(f"{what}: float32 only, got {a.dtype} and {b.dtype}")


def reference_qk(q, k):
  return jnp.einsum("...qd,...sd->...qs", q, k, preferred_element_type=jnp.float32)


def reference_pv(p, v):
  return jnp.einsum("...qs,...sd->...qd", p, v)


def _call(which, a, b, last: int):
  out = jax.ShapeDtypeStruct(a.shape[:-1] + (last,), jnp.float32)
  return jax.ffi.ffi_call(_target(which), out, vmap_method="sequential")(a, b)


def decode_qk(q: jax.Array, k: jax.Array) -> jax.Array:
  """q [..., Q, D], k [..., S, D] float32 -> scores [..., Q, S] (each score one dot product in a fixed order); the
  leading dimensions (e.g. [B, KV]) are pairs, each read as one stream."""
  _check(q, k, "decode_qk")
  if q.shape[-1] != k.shape[-1]:
    raise ValueError(f"decode_qk: head sizes differ, {q.shape} and {k.shape}")
  return _call(_QK, q, k, k.shape[-2])


def decode_pv(p: jax.Array, v: jax.Array) -> jax.Array:
  """p [..., Q, S], v [..., S, D] float32 -> out [..., Q, D]."""
  _check(p, v, "decode_pv")
  if p.shape[-1] != v.shape[-2]:
    raise ValueError(f"decode_pv: {p.shape[-1]} probabilities per query against {v.shape[-2]} value rows")
  return _call(_PV, p, v, v.shape[-1])
