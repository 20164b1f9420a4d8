"""Which features a probe reads (docs/method.md §A3), and how they are assembled from what the model captures.

For every response token j the feature vector comes from position j-1 of the full sequence (prompt + response):
the state that predicted token j. Feature sets concatenate, in this order: hidden states at the chosen layers
(`hidden`), the attention window of every layer and head (`attn`: W x heads x layers), the top-K next-token
probabilities followed by the token's own log-probability and the entropy of the distribution it was drawn from
(`logit`: K + 2, so a probe sees what MaxProb and the entropy baselines read; docs/method.md). Only response tokens
are stored (see docs/method.md).

`FeatureSpec.capture` says what a forward pass or the sampler must capture for one spec, `union_capture` what serves
several at once; `FeatureSpec.assemble` is the one assembly used by sampling, teacher-forced extraction and bench/;
`padded_forward` is the one teacher-forced pass (extraction and reader mode's `trajectories.teacher`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from reprobe_jax.errors import ConfigError
from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.forward import forward, positions_from_mask
from reprobe_jax.models.language_model import LanguageModel
from reprobe_jax.models.sampling import bucket

PARTS = ("hidden", "attn", "logit")


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  """Which features, docs/method.md §A3. `parts` in ('hidden', 'attn', 'logit'); e.g. 'hidden' or 'attn+logit'."""

  parts: tuple[str, ...] = ("hidden",)
  hidden_layers: tuple[int, ...] = (-1,)
  attn_window: int = 5
  top_k: int = 4

  def __post_init__(self):
    parts = self.parts
    if (
      isinstance(parts, str)
      or not isinstance(parts, (tuple, list))
      or not parts
      or not all(isinstance(p, str) for p in parts)
      or set(parts) - set(PARTS)
      or len(set(parts)) != len(parts)
    ):
      raise ConfigError(f"feature parts {parts!r} must be a non-empty subset of {', '.join(PARTS)} (each once)")
    object.__setattr__(self, "parts", tuple(parts))
    layers = self.hidden_layers
    if (
      isinstance(layers, (str, bytes))
      or not isinstance(layers, (tuple, list))
      or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in layers)
    ):
      raise ConfigError(
        f"feature part 'hidden': hidden_layers must be a sequence of layer indices (integers), found {layers!r}"
      )
    if "hidden" in parts and not layers:
      raise ConfigError("feature part 'hidden': hidden_layers is empty; name at least one layer")
    object.__setattr__(self, "hidden_layers", tuple(int(i) for i in layers))
    for part, name in (("attn", "attn_window"), ("logit", "top_k")):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ConfigError(f"feature part {part!r}: {name} must be an integer >= 1, found {v!r}")
      object.__setattr__(self, name, int(v))

  @classmethod
  def from_name(cls, name: str, **kw) -> "FeatureSpec":
    """'hidden', 'attn+logit', 'hidden+attn+logit', ..."""
    if not isinstance(name, str):
      raise ConfigError(f"feature set name must be a string like 'hidden+logit', found {name!r}")
    return cls(parts=tuple(name.split("+")), **kw)

  @property
  def name(self) -> str:
    return "+".join(self.parts)

  def capture(self) -> CaptureSpec:
    return CaptureSpec(
      hidden_layers=self.hidden_layers if "hidden" in self.parts else (),
      attn_window=self.attn_window if "attn" in self.parts else 0,
      top_k_probs=self.top_k if "logit" in self.parts else 0,
      token_stats="logit" in self.parts,
    )

  def assemble(self, values, num_layers: int):
    """The feature vectors [..., F] from captured per-token values, in the spec's part order (docs/method.md §A3).

    values: {'hidden_<i>': [..., D] (HF layer index i), 'attn_window': [..., L, H, W'] (W' >= W, most recent key
    first), 'top_probs': [..., K'] (K' >= K, sorted descending), 'token_logprobs' and 'token_entropy': [...] (the
    token's own log-probability at temperature 1 and the entropy of the distribution it was drawn from)}, as the
    sampler captures them (`with_logprobs` adds the sampler's recorded log-probs to its `features`) and as
    `forward_values` turns a forward pass into. The one assembly used by sampling, teacher-forced extraction and
    bench/; runs on device.
    """
    parts = []
    if "hidden" in self.parts:
      parts += [values[f"hidden_{i}"] for i in self.capture().resolve_layers(num_layers)]
    if "attn" in self.parts:
      aw = values["attn_window"][..., : self.attn_window]  # [..., L, H, W]
      parts.append(aw.reshape(aw.shape[:-3] + (-1,)))
    if "logit" in self.parts:
      parts += [
        values["top_probs"][..., : self.top_k],
        values["token_logprobs"][..., None],
        values["token_entropy"][..., None],
      ]
    return jnp.concatenate([jnp.asarray(p, jnp.float32) for p in parts], axis=-1)

  def dim(self, cfg) -> int:
    d = 0
    if "hidden" in self.parts:
      d += cfg.hidden_size * len(self.capture().resolve_layers(cfg.num_layers))
    if "attn" in self.parts:
      d += self.attn_window * cfg.num_heads * cfg.num_layers
    if "logit" in self.parts:
      d += self.top_k + 2
    return d


def union_capture(specs, *, token_stats: bool = True) -> CaptureSpec:
  """One capture that serves every spec (the widest window and top-K; the union of hidden layers), so a sampler
  records all feature sets in one pass; `FeatureSpec.assemble` slices what each needs."""
  specs = list(specs)
  layers = tuple(dict.fromkeys(i for s in specs for i in s.capture().hidden_layers))
  return CaptureSpec(
    hidden_layers=layers,
    attn_window=max([s.capture().attn_window for s in specs] + [0]),
    top_k_probs=max([s.capture().top_k_probs for s in specs] + [0]),
    token_stats=token_stats,
  )


def forward_values(out: dict) -> dict:
  """A forward pass's captured dict ({'hidden_states': {i: ...}, 'attn_window', 'top_probs'}) in the sampler's
  naming, for `FeatureSpec.assemble`."""
  values = {f"hidden_{i}": h for i, h in out["hidden_states"].items()}
  for k in ("attn_window", "top_probs", "token_logprobs", "token_entropy"):
    if out.get(k) is not None:
      values[k] = out[k]
  return values


def with_logprobs(features: Mapping[str, Any], logprobs) -> dict:
  """A sampler's captured `features` with its recorded per-token log-probs [..., N] added as 'token_logprobs' (the
  sampler keeps them apart from the captured statistics), ready for `FeatureSpec.assemble`."""
  return dict(features, token_logprobs=logprobs)


def padded_forward(lm: LanguageModel, seqs: Sequence[Sequence[int]], capture, rows: int) -> dict:
  """One teacher-forced forward of token sequences (prompt + response), right-padded to a bucket length and to
  `rows` rows (one compiled program per bucket; rows past the sequences are padding): the forward's dict of
  `ForwardOutput` fields, [rows, T, ...] on device."""
  t = bucket(max(map(len, seqs)))
  if t > lm.config.max_position_embeddings:
    t = max(map(len, seqs))
  lm._check_length(t)
  ids = np.full((rows, t), lm.pad_id(), np.int32)  # [rows, T]
  mask = np.zeros((rows, t), np.int32)
  for r, seq in enumerate(seqs):
    ids[r, : len(seq)], mask[r, : len(seq)] = seq, 1
  m = jnp.asarray(mask)
  return forward(
    lm.static_graph, lm.params, jnp.asarray(ids), m, positions_from_mask(m), capture=capture, shard=lm.shard
  )
