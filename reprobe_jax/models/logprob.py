"""Differentiable per-token log-probabilities of given tokens under the decoder: the learning core's one read of a
model's distribution. The LM training loss is the masked mean of their negatives; an RL policy loss compares them
under new and old parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.forward import positions_from_mask, run_decoder
from reprobe_jax.models.sharding import ShardingCtx


def sequence_logprobs(graphdef, params, tokens, attention_mask, positions=None, *, shard: ShardingCtx | None = None):
  """log p(tokens[t] | tokens[<t]) for t >= 1, [B, T] -> [B, T] float32; pure, jittable and differentiable.

  0 at t = 0, at padding, and at a row's first real token (left padding gives it no context to be predicted from).
  Positions default to cumsum(mask) - 1 as in `LanguageModel.forward`, so left and right padding give a row the
  same values. The decoder reads tokens[:, :-1] only: the last token predicts nothing asked for.
  """
  mask = attention_mask.astype(bool)  # [B, T]
  pos = positions_from_mask(attention_mask) if positions is None else positions
  logits, _, _ = run_decoder(
    graphdef, params, tokens[:, :-1], pos[:, :-1], mask[:, :-1], capture=CaptureSpec(), shard=shard
  )
  z = logits.astype(jnp.float32)  # [B, T-1, V]
  # logsumexp minus the target logit picked by a one-hot product: no [B, T, V] log-softmax is kept, and the gradient
  # is softmax - one-hot with no scatter (the backward of a gather), which XLA:CPU runs far slower than this fused
  # elementwise product.
  target = jnp.sum(z * jax.nn.one_hot(tokens[:, 1:], z.shape[-1], dtype=z.dtype), axis=-1)  # [B, T-1]
  # -(lse - target), not target - lse: the LM loss (-lp) then compiles to the very program of the NLL it replaced.
  lp = -(jax.nn.logsumexp(z, axis=-1) - target)
  lp = jnp.where(mask[:, 1:] & mask[:, :-1], lp, 0.0)
  return jnp.concatenate([jnp.zeros_like(lp[:, :1]), lp], axis=1)  # [B, T]


def masked_mean_nll(logprobs, weights):
  """sum(-logprobs * w) / max(sum(w), 1) over t >= 1: the LM loss. logprobs, weights [B, T] -> scalar."""
  w = weights[:, 1:]
  return jnp.sum(-logprobs[:, 1:] * w) / jnp.maximum(jnp.sum(w), 1.0)
