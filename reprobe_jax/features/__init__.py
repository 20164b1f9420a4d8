"""Per-token features of a frozen LM (docs/method.md §A3), extracted into resumable shards.

`spec`: which features (`FeatureSpec`) and what the model captures for them; `store`: the store's manifest and
shards (`FeatureStore`); `extraction`: features of `Trajectory` records, into a store (`extract`).
"""

from reprobe_jax.features.spec import FeatureSpec, forward_values, union_capture, with_logprobs
from reprobe_jax.features.store import FeatureMismatchError, FeatureStore
from reprobe_jax.features.extraction import extract, model_fingerprint, token_features, tokenizer_hash

__all__ = [
  "FeatureMismatchError",
  "FeatureSpec",
  "FeatureStore",
  "extract",
  "forward_values",
  "model_fingerprint",
  "token_features",
  "tokenizer_hash",
  "union_capture",
  "with_logprobs",
]
