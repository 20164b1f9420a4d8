"""What a forward pass captures (static) and what it returns."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from reprobe_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class CaptureSpec:
  """Static choice of what the forward pass sows and returns (METHOD A3); hashable, so it keys the jit cache.

  hidden_layers: HF indices of hidden states (0 = embeddings, L = after the final norm; negatives count from L+1).
  attn_window: W > 0 captures, for every layer and head, the attention probabilities from query t to keys
    t, t-1, ..., t-W+1 (zero where the key is before the start or masked); W = 0 captures none.
  top_k_probs: K > 0 returns the K largest next-token probabilities (temperature 1), sorted descending.
  top_k_ids: with top_k_probs, also returns the token ids of those K ('top_ids', int32): a top-K log-prob list
    as an OpenAI-style completion API returns it (SPAE's released code reads Conf and Acc from such lists).
  token_stats: returns the log-probability of the actual next token, the full-vocabulary entropy and the
    self-certainty of the next-token distribution.
  """

  hidden_layers: tuple[int, ...] = ()
  attn_window: int = 0
  top_k_probs: int = 0
  token_stats: bool = False
  top_k_ids: bool = False

  def __post_init__(self):
    object.__setattr__(self, "hidden_layers", tuple(int(i) for i in self.hidden_layers))
    if self.attn_window < 0 or self.top_k_probs < 0:
      raise ConfigError(f"CaptureSpec: attn_window and top_k_probs must be >= 0, got {self}")
    if self.top_k_ids and not self.top_k_probs:
      raise ConfigError("CaptureSpec: top_k_ids needs top_k_probs > 0")

  def resolve_layers(self, num_layers: int) -> tuple[int, ...]:
    """HF hidden-state indices in [0, num_layers], negatives resolved; errors name the bad index."""
    out = []
    for i in self.hidden_layers:
      j = i + num_layers + 1 if i < 0 else i
      if not 0 <= j <= num_layers:
        raise ConfigError(f"CaptureSpec.hidden_layers: index {i} is outside [-{num_layers + 1}, {num_layers}]")
      out.append(j)
    return tuple(dict.fromkeys(out))

  @property
  def empty(self) -> bool:
    return not (self.hidden_layers or self.attn_window or self.top_k_probs or self.token_stats)


@dataclasses.dataclass
class ForwardOutput:
  """Per position, unshifted (position t holds the state after reading token t, as in Hugging Face).

  logits [B, T, V]; hidden_states {HF layer index: [B, T, D]}; attn_window [B, T, L, H, W];
  top_probs [B, T, K]; token_logprobs [B, T] = log p(x_{t+1} | x_<=t) (0 at the last position);
  token_entropy [B, T] = entropy of the next-token distribution at t;
  token_self_certainty [B, T] = KL(uniform || p) = -log V - mean_v log p_v (Kang et al., 2025; higher = surer).
  """

  logits: Any
  hidden_states: Mapping[int, Any] = dataclasses.field(default_factory=dict)
  attn_window: Any = None
  top_probs: Any = None
  token_logprobs: Any = None
  token_entropy: Any = None
  token_self_certainty: Any = None
