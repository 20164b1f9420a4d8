"""Step-scoring cost: the PRM of `reprobe_jax.prm` (the target's backbone, a random head: only its cost matters
here) against the probe, each on its fastest path, and the PRM in PyTorch for the framework ratio.

- PRM, whole text: prompt + steps joined by separators, one forward per trajectory, the reward read at each
  separator (what Best-of-N pays); in PyTorch the same joined ids through `model.model` plus the same head.
- PRM, incremental: its own KV cache of the prompt, each step appended when it is the newest (what a search pays;
  search-and-learn re-reads the whole text instead).
- Probe (docs/method.md §A4 at the paper's shape) over the captured features of the response, packed windows [0, step
end)
  (`probe.data.pack_spans`); the features come from the generation pass and are not timed.

`flops` gives each side's multiply-adds per scored step from the shapes, so the measured ratio can be read against
the ratio the arithmetic allows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from reprobe_jax.prm.model import append_step, join_steps, prefill, step_rewards


def split_rows(ids, mask, spans):
  """bench.pair.step_trajectories' rows (question then steps, right-padded) as PRM inputs: prompts [B, Tp]
  left-padded with their mask, response tokens [B, T] (from the first step on), response-relative spans [B, S, 2]
  and each row's prompt length [B]."""
  first = np.maximum(spans[:, 0, 0], 1)  # random-id rows start with a step: their first token is the prompt
  spans = np.where(spans[..., 1:2] > spans[..., 0:1], np.maximum(spans, first[:, None, None]), spans)
  lens = mask.sum(1)
  tp, t = int(first.max()), int((lens - first).max())
  prompt = np.zeros((len(ids), tp), np.int32)
  pmask = np.zeros((len(ids), tp), bool)
  tokens = np.zeros((len(ids), t), np.int32)
  rel = np.where(spans[..., 1:2] > spans[..., 0:1], spans - first[:, None, None], 0).astype(np.int32)
  for i in range(len(ids)):
    prompt[i, tp - first[i] :], pmask[i, tp - first[i] :] = ids[i, : first[i]], True
    tokens[i, : lens[i] - first[i]] = ids[i, first[i] : lens[i]]
  return prompt, pmask, tokens, rel, first


rewards_whole = jax.jit(step_rewards)


@functools.partial(jax.jit, static_argnames=("room",))
def rewards_incremental(prm, prompt, pmask, tokens, spans, *, room: int):
  """[B, S] rewards with each step appended to the PRM's cache in turn (a scan over the step axis)."""
  cache = prefill(prm, prompt, pmask, room)

  def body(cache, span):
    r, cache = append_step(prm, cache, tokens, span)
    return cache, r

  _, r = jax.lax.scan(body, cache, jnp.swapaxes(spans, 0, 1))
  return jnp.swapaxes(r, 0, 1)


def joined_inputs(prm, prompt, pmask, tokens, spans):
  """(ids [B, L], mask [B, L], positions [B, L], separator positions [B, S]) on the host: the PRM's own input
  layout (`join_steps`), for the PyTorch side."""
  ids, mask, sep = join_steps(
    jnp.asarray(prompt), jnp.asarray(pmask), jnp.asarray(tokens), jnp.asarray(spans), prm.separator_id
  )
  mask = np.asarray(mask)
  pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
  return np.array(ids), mask.astype(np.int64), pos, np.array(sep)


def torch_step_rewards(hf_model, head, ids, mask, positions, seps):
  """The same rewards in PyTorch: the decoder body (`model.model`, no LM head) plus the head, at the separators."""
  import torch

  h = hf_model.model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state  # [B, L, D]
  h = torch.gather(h, 1, seps[..., None].expand(-1, -1, h.shape[-1]))  # [B, S, D]
  z = torch.relu(h @ head["w1"] + head["b1"]) @ head["w2"] + head["b2"]
  return torch.softmax(z, dim=-1)[..., 1]


def flops(cfg, probe_cfg, spans) -> dict:
  """Multiply-adds per scored step from the shapes: the PRM's per new token (its non-embedding weights plus
  attention over the prefix) times the step's tokens and separator, the probe's per window token (projection,
  encoder layer, its attention over the window) times the window [0, end)."""
  valid = spans[..., 1] > spans[..., 0]
  steps = int(valid.sum())
  width = np.where(valid, spans[..., 1] - spans[..., 0] + 1, 0)
  end = np.where(valid, spans[..., 1], 0)
  h, f, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
  q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
  per_token = layers * (h * (q + 2 * kv) + q * h + 3 * h * f)
  # attention: each new token reads every earlier one (prompt excluded: a lower bound for the PRM)
  prm_attn = layers * 2 * q * float(np.sum(width * (end + np.arange(spans.shape[1])[None, :])))
  prm = per_token * float(width.sum()) + prm_attn
  d, ff, fd = probe_cfg.d_model, probe_cfg.ff_dim, probe_cfg.feature_dim
  probe_per_token = fd * 2 * d + 2 * d * d + probe_cfg.n_layers * (4 * d * d + 2 * d * ff)
  probe = probe_per_token * float(end.sum()) + probe_cfg.n_layers * 2 * d * float(np.sum(end**2))
  return {"prm_macs_per_step": prm / steps, "probe_macs_per_step": probe / steps, "ratio": prm / probe}
