"""Per-token features of a frozen LM (METHOD A3), extracted into resumable shards."""

from reprobe_jax.features.extraction import (FeatureMismatchError, FeatureSpec, FeatureStore, extract,
                                          forward_values, model_fingerprint, token_features, tokenizer_hash,
                                          union_capture, with_logprobs)

__all__ = ["FeatureMismatchError", "FeatureSpec", "FeatureStore", "extract", "forward_values", "model_fingerprint",
           "token_features", "tokenizer_hash", "union_capture", "with_logprobs"]
