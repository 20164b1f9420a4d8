"""What a forward pass captures (static), what it returns, and what the sampler records per token."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Mapping

import jax
from flax import struct
from jaxtyping import Array, Float, Int

from reprobe_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class CaptureSpec:
  """Static choice of what the forward pass sows and returns (docs/method.md §A3); hashable, so it keys the jit cache.

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

  logits: Float[Array, "b t v"]
  hidden_states: Mapping[int, Float[Array, "b t d"]] = dataclasses.field(default_factory=dict)
  attn_window: Float[Array, "b t layers heads window"] | None = None
  top_probs: Float[Array, "b t k"] | None = None
  token_logprobs: Float[Array, "b t"] | None = None
  token_entropy: Float[Array, "b t"] | None = None
  token_self_certainty: Float[Array, "b t"] | None = None


# The per-token values besides the hidden states, in the order `TokenFeatures.names` lists them.
_VALUE_FIELDS = ("attn_window", "top_probs", "top_ids", "token_entropy", "token_self_certainty")


@struct.dataclass
class TokenFeatures(Mapping):
  """What the sampler captured for each response token (docs/method.md §A3: entry j is the state that predicted
  token j): one field per captured value, None where the CaptureSpec does not ask for it. Leading axes [B, N] in a
  decode state's buffers ([B] for the positions behind its pending logits; [N] in one row read back).

  As a read-only mapping it shows its values under the names the feature files and `FeatureSpec.assemble` use
  ('hidden_<i>', 'attn_window', 'top_probs', 'top_ids', 'token_entropy', 'token_self_certainty'): this class is the
  one place those names are made."""

  hidden: dict[int, Float[Array, "*rows d"]] = dataclasses.field(default_factory=dict)  # HF layer index -> state
  attn_window: Float[Array, "*rows layers heads window"] | None = None
  top_probs: Float[Array, "*rows k"] | None = None  # sorted descending, temperature 1
  top_ids: Int[Array, "*rows k"] | None = None
  token_entropy: Float[Array, "*rows"] | None = None
  token_self_certainty: Float[Array, "*rows"] | None = None  # KL(U || p)

  @classmethod
  def from_captured(cls, captured: Mapping[str, Any]) -> "TokenFeatures":
    """From a decoder's captured dict ({'hidden_states': {i: x}, 'attn_window': x}, `forward.run_decoder`)."""
    return cls(hidden=dict(captured["hidden_states"]), attn_window=captured.get("attn_window"))

  def with_stats(self, stats: Mapping[str, jax.Array]) -> "TokenFeatures":
    """These values plus `forward.logit_stats`'s (the token's own log-prob excepted: the sampler records it apart)."""
    return self.replace(**{k: v for k, v in stats.items() if k in _VALUE_FIELDS})

  def named(self) -> dict[str, jax.Array]:
    """{'hidden_<i>': ..., 'attn_window': ..., ...}: the captured values by their feature names."""
    out = {f"hidden_{i}": h for i, h in sorted(self.hidden.items())}
    out.update({k: getattr(self, k) for k in _VALUE_FIELDS if getattr(self, k) is not None})
    return out

  def __getitem__(self, name: str) -> jax.Array:
    return self.named()[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self.named())

  def __len__(self) -> int:
    return len(self.named())
