"""The typed structures that pass between the RL loop's stages (issue 17): rollout -> advantages -> update.

Token-level arrays are in response coordinates: column t of a [B, T] array is the t-th generated token of the row.
Rows are group-major: rows g * G .. g * G + G - 1 are the G samples of prompt g (G = `group_size`).
"""

from __future__ import annotations

import jax
from flax import struct


@struct.dataclass
class AdvantageInputs:
  """What an advantage estimator reads (all on device; shapes fixed by buckets, so nothing recompiles).

  rewards: [B] float32 outcome reward R_i in {0, 1}. row_mask: [B] bool, False on batch-padding rows (a short batch
  after dynamic sampling ran out of refills); padding rows come as whole groups. response_mask: [B, T] bool, the
  response tokens that are trained (the final EOS included). token_step: [B, T] int32, the step k(j) that holds
  token j (METHOD B2: the step whose boundary closes at or after j; tokens after the last boundary take the last
  step); -1 where the row has no boundary. phi: [B, K] float32, the step potential Phi_k at boundary k (any value
  where not step_valid). step_valid: [B, K] bool, boundary k exists and was probed.
  """

  rewards: jax.Array
  row_mask: jax.Array
  response_mask: jax.Array
  token_step: jax.Array
  phi: jax.Array
  step_valid: jax.Array
  group_size: int = struct.field(pytree_node=False)


@struct.dataclass
class PolicyBatch:
  """One batch for the policy update.

  tokens / attention_mask: [B, P + T] int32, the prompt left-padded to P columns, then the response right-padded to
  T columns (mask 1 on real tokens). response_mask: [B, T] float32 (1 on the trained response tokens).
  old_logprobs: [B, T] float32, log p of each response token under the rollout's parameters (0 off the mask).
  advantages: [B, T] float32. ref_logprobs: [B, T] float32 under a frozen reference (zeros when there is no KL).
  """

  tokens: jax.Array
  attention_mask: jax.Array
  response_mask: jax.Array
  old_logprobs: jax.Array
  advantages: jax.Array
  ref_logprobs: jax.Array

  @property
  def prompt_len(self) -> int:
    return self.tokens.shape[1] - self.response_mask.shape[1]
