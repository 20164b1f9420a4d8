"""PRM-style step scorer (METHOD A7 baseline): a second full forward of a same-size decoder over question + steps,
then Linear(H, H), ReLU, Linear(H, 2) at each step's separator; step reward = softmax(head)[1].

Only its cost matters here, so the backbone reuses the target's weights and the head is random; both frameworks
get the same head weights, which lets the harness check that they agree.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from reprobe_jax.models import CaptureSpec
from reprobe_jax.models.forward import positions_from_mask, run_decoder


def head_weights(hidden: int, seed: int = 0) -> dict[str, np.ndarray]:
  """Random head: w1 [H, H], b1 [H], w2 [H, 2], b2 [2] (kernels stored [in, out])."""
  rng = np.random.default_rng(seed)
  scale = hidden**-0.5
  return {"w1": (rng.standard_normal((hidden, hidden)) * scale).astype(np.float32),
          "b1": np.zeros(hidden, np.float32),
          "w2": (rng.standard_normal((hidden, 2)) * scale).astype(np.float32),
          "b2": np.zeros(2, np.float32)}


@functools.partial(jax.jit, static_argnames=("graphdef",))
def jax_step_rewards(graphdef, params, head, input_ids, mask, step_ends):
  """[B, T] tokens -> step rewards [B, S] read at step_ends [B, S].

  Only the last hidden state is used, so XLA drops the unused LM-head matmul: the PRM pays for the backbone and
  its own head, not for vocabulary logits.
  """
  key_valid = mask.astype(bool)
  _, _, captured = run_decoder(graphdef, params, input_ids, positions_from_mask(mask), key_valid,
                               capture=CaptureSpec(hidden_layers=(-1,)), shard=None)
  h = next(iter(captured["hidden_states"].values()))  # [B, T, D], after the final norm
  h = jnp.take_along_axis(h, step_ends[..., None], axis=1)  # [B, S, D]
  z = jax.nn.relu(h @ head["w1"] + head["b1"]) @ head["w2"] + head["b2"]  # [B, S, 2]
  return jax.nn.softmax(z, axis=-1)[..., 1]


def torch_step_rewards(hf_model, head, input_ids, mask, step_ends):
  """Same as `jax_step_rewards` with PyTorch: the decoder body (`model.model`, no LM head) plus the head."""
  import torch
  h = hf_model.model(input_ids=input_ids, attention_mask=mask).last_hidden_state  # [B, T, D]
  h = torch.gather(h, 1, step_ends[..., None].expand(-1, -1, h.shape[-1]))  # [B, S, D]
  z = torch.relu(h @ head["w1"] + head["b1"]) @ head["w2"] + head["b2"]
  return torch.softmax(z, dim=-1)[..., 1]
