"""The typed structures that pass between the RL loop's stages: rollout -> advantages -> update.

Token-level arrays are in response coordinates: column t of a [B, T] array is the t-th generated token of the row.
Rows are group-major: rows g * G .. g * G + G - 1 are the G samples of prompt g (G = `group_size`).
"""

from __future__ import annotations

import chex
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from reprobe_jax.errors import shape_errors


@struct.dataclass
class AdvantageInputs:
  """What an advantage estimator reads (all on device; shapes fixed by buckets, so nothing recompiles).

  rewards: [B] float32 outcome reward R_i in {0, 1}. row_mask: [B] bool, False on batch-padding rows (a short batch
  after dynamic sampling ran out of refills); padding rows come as whole groups. response_mask: [B, T] bool, the
  response tokens that are trained (the final EOS included). token_step: [B, T] int32, the step k(j) that holds
  token j (docs/method.md §B2: the step whose boundary closes at or after j; tokens after the last boundary take the
  last step); -1 where the row has no boundary. phi: [B, K] float32, the step potential Phi_k at boundary k (any value
  where not step_valid). step_valid: [B, K] bool, boundary k exists and was probed.
  """

  rewards: Float[Array, " b"]
  row_mask: Bool[Array, " b"]
  response_mask: Bool[Array, "b t"]
  token_step: Int[Array, "b t"]
  phi: Float[Array, "b k"]
  step_valid: Bool[Array, "b k"]
  group_size: int = struct.field(pytree_node=False)


@struct.dataclass
class PolicyBatch:
  """One batch for the policy update: P prompt columns, then T response columns."""

  tokens: Int[Array, "b p_plus_t"]  # the prompt left-padded to P columns, then the response right-padded
  attention_mask: Int[Array, "b p_plus_t"]  # 1 on real tokens
  response_mask: Float[Array, "b t"]  # 1 on the trained response tokens
  old_logprobs: Float[Array, "b t"]  # log p of each response token under the rollout's parameters (0 off the mask)
  advantages: Float[Array, "b t"]
  ref_logprobs: Float[Array, "b t"]  # under a frozen reference (zeros when there is no KL)

  @property
  def prompt_len(self) -> int:
    return self.tokens.shape[1] - self.response_mask.shape[1]

  def check(self) -> None:
    """ConfigError unless the shapes fit together: tokens and attention_mask [B, P + T] of integer ids, the four
    per-response-token arrays [B, T] with T <= P + T. Shapes are static: it costs nothing under jit."""
    with shape_errors(
      "PolicyBatch: tokens, attention_mask [B, P + T]; response_mask, old_logprobs, advantages, ref_logprobs [B, T]"
    ):
      chex.assert_rank([self.tokens, self.response_mask], 2)
      chex.assert_equal_shape([self.tokens, self.attention_mask])
      chex.assert_equal_shape([self.response_mask, self.old_logprobs, self.advantages, self.ref_logprobs])
      chex.assert_equal_shape_prefix([self.tokens, self.response_mask], 1)
      chex.assert_type(self.tokens, int)
      if self.prompt_len < 0:
        raise AssertionError(
          f"{self.response_mask.shape[1]} response columns exceed the {self.tokens.shape[1]} token columns"
        )
