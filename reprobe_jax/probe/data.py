"""Probe batches: labelled trajectories + stored features -> padded arrays of fixed bucket shapes.

A batch holds B trajectories: features [B, T, F], token_mask [B, T], spans [B, S, 2], labels [B, S] (NaN for
unknown and for padding steps). T and S are rounded up to powers of two so that a training run compiles a few
shapes, not one per batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from reprobe_jax.errors import DataFormatError
from reprobe_jax.features import FeatureStore
from reprobe_jax.models.sampling import bucket
from reprobe_jax.trajectories import Trajectory

_EXAMPLE_FIELDS = ("id", "domain", "response_ids", "steps")  # what a record needs to become an Example


@dataclasses.dataclass
class Example:
  id: str
  domain: str
  features: np.ndarray  # [n_tokens, F]
  spans: np.ndarray  # [S, 2]
  labels: np.ndarray  # [S], NaN = unknown


def examples(records: Sequence[Trajectory | Mapping[str, Any]], store: FeatureStore) -> list[Example]:
  """Joins labelled trajectories (or their JSON records) with their features; errors name the record that does not
  fit."""
  out = []
  for r in records:
    if not isinstance(r, Trajectory):
      r = Trajectory.from_json(r, required=_EXAMPLE_FIELDS)
    if r.id not in store:
      raise DataFormatError(f"trajectory {r.id!r} has no stored features in {store.directory}")
    feats = store[r.id]
    if r.labels is None:
      raise DataFormatError(f"trajectory {r.id!r} has no labels (annotate it first)")
    if len(feats) != len(r.response_ids):
      raise DataFormatError(f"trajectory {r.id!r}: features for {len(feats)} tokens, response has "
                            f"{len(r.response_ids)}")
    for k, s in enumerate(r.steps):
      if not s.text.strip():
        raise DataFormatError(f"trajectory {r.id!r}: step {k} is empty (no text); a step must say something")
      if not 0 <= s.start <= s.end <= len(feats):
        raise DataFormatError(f"trajectory {r.id!r}: step {k} spans tokens [{s.start}, {s.end}), outside "
                              f"the response's {len(feats)} tokens")
    spans = np.asarray(r.spans, np.int32).reshape(-1, 2)
    lab = r.label_array()
    if len(lab) != len(spans):
      raise DataFormatError(f"trajectory {r.id!r}: {len(lab)} labels for {len(spans)} steps")
    lab[spans[:, 1] <= spans[:, 0]] = np.nan  # a step with no tokens has no label
    out.append(Example(r.id, r.domain, feats, spans, lab))
  return out


def collate(batch: Sequence[Example], batch_size: int, feature_dim: int) -> dict[str, np.ndarray]:
  """Pads to [batch_size, bucket(T), ...] and [batch_size, bucket(S)]; missing rows are all padding."""
  t = bucket(max([len(e.features) for e in batch] + [1]), minimum=16)
  s = bucket(max([len(e.spans) for e in batch] + [1]), minimum=4)
  feats = np.zeros((batch_size, t, feature_dim), np.float32)
  mask = np.zeros((batch_size, t), bool)
  spans = np.zeros((batch_size, s, 2), np.int32)
  labels = np.full((batch_size, s), np.nan, np.float32)
  if len(batch) > batch_size:
    raise ValueError(f"collate: {len(batch)} examples for a batch of {batch_size}")  # a caller's bug, not bad data
  for i, e in enumerate(batch):
    if e.features.ndim != 2 or e.features.shape[1] != feature_dim:
      raise DataFormatError(f"trajectory {e.id!r}: features of shape {list(e.features.shape)}, the probe reads "
                            f"[n_tokens, {feature_dim}]")
    n = len(e.features)
    feats[i, :n], mask[i, :n] = e.features, True
    spans[i, :len(e.spans)], labels[i, :len(e.labels)] = e.spans, e.labels
  return {"features": feats, "token_mask": mask, "spans": spans, "labels": labels}
