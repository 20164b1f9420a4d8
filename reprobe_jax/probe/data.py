"""Probe batches: labelled trajectories + stored features -> padded arrays of fixed bucket shapes.

A batch holds B trajectories: features [B, T, F], token_mask [B, T], spans [B, S, 2], labels [B, S] (NaN for
unknown and for padding steps). T and S are rounded up to powers of two so that a training run compiles a few
shapes, not one per batch.

The packed layout (`pack_steps`) is what training and evaluation use: each step's window [0, step end) is copied
into rows of L slots, side by side, so the probe's encoder runs over real windows only (on the built-in default 5x
fewer token rows than B x S x T); `Probe.packed` reads it and gives the same values as the padded layout.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from flax import struct

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
      raise DataFormatError(
        f"trajectory {r.id!r}: features for {len(feats)} tokens, response has {len(r.response_ids)}"
      )
    for k, s in enumerate(r.steps):
      if not s.text.strip():
        raise DataFormatError(f"trajectory {r.id!r}: step {k} is empty (no text); a step must say something")
      if not 0 <= s.start <= s.end <= len(feats):
        raise DataFormatError(
          f"trajectory {r.id!r}: step {k} spans tokens [{s.start}, {s.end}), outside the response's {len(feats)} tokens"
        )
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
      raise DataFormatError(
        f"trajectory {e.id!r}: features of shape {list(e.features.shape)}, the probe reads [n_tokens, {feature_dim}]"
      )
    n = len(e.features)
    feats[i, :n], mask[i, :n] = e.features, True
    spans[i, : len(e.spans)], labels[i, : len(e.labels)] = e.spans, e.labels
  return {"features": feats, "token_mask": mask, "spans": spans, "labels": labels}


@struct.dataclass
class PackedSteps:
  """Where each step's window [0, step end) sits in packed rows of L slots (docs/method.md §A4 computed without padding
  steps and without the tokens past a step's end). For slot (r, j): row / token = the trajectory (index into the
  batch) and response token it copies; segment = the packed step whose window holds it (-1 = empty slot); in_step
  = the token belongs to that step itself. num_steps (static) = P, the packed steps' count with padding."""

  row: jax.Array  # [R, L] int32
  token: jax.Array  # [R, L] int32
  segment: jax.Array  # [R, L] int32
  in_step: jax.Array  # [R, L] bool
  num_steps: int = struct.field(pytree_node=False)


@dataclasses.dataclass(frozen=True)
class PackShape:
  """Static shapes of packed batches: B trajectories of T tokens, R rows of L slots, P steps."""

  batch: int
  tokens: int
  rows: int
  slots: int
  steps: int


def _packed_steps(batch: Sequence[Example], labelled_only: bool) -> list[tuple[int, int]]:
  """(example, step) pairs that get a window: steps with tokens (and, labelled_only, a known label)."""
  return [
    (i, k)
    for i, e in enumerate(batch)
    for k, (a, b) in enumerate(e.spans)
    if b > a and not (labelled_only and np.isnan(e.labels[k]))
  ]


def _first_fit(lengths: Sequence[int], slots: int) -> list[tuple[int, int]]:
  """(row, offset) of each window: longest first, each into the first row with room (deterministic)."""
  free: list[int] = []
  place = [(0, 0)] * len(lengths)
  for j in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
    n = lengths[j]
    r = next((r for r, f in enumerate(free) if f >= n), None)
    if r is None:
      free.append(slots)
      r = len(free) - 1
    place[j] = (r, slots - free[r])
    free[r] -= n
  return place


def pack_shape(batches: Sequence[Sequence[Example]], batch_size: int, *, labelled_only: bool) -> PackShape:
  """One PackShape that fits every batch (so a whole training run compiles once): T = bucket of the longest
  response, L = T, R and P = buckets of the most rows and steps any batch needs."""
  t = bucket(max([len(e.features) for b in batches for e in b] + [1]), minimum=16)
  rows, steps = 1, 1
  for b in batches:
    chosen = _packed_steps(b, labelled_only)
    place = _first_fit([int(b[i].spans[k, 1]) for i, k in chosen], t)
    rows = max(rows, 1 + max((r for r, _ in place), default=0))
    steps = max(steps, len(chosen))
  return PackShape(batch_size, t, bucket(rows, minimum=1), t, bucket(steps, minimum=4))


def pack_spans(spans: Sequence[np.ndarray], chosen: Sequence[tuple[int, int]], shape: PackShape) -> PackedSteps:
  """The PackedSteps of the chosen (row, step) pairs of a batch whose rows have these step spans [S_i, 2]; each
  step's window [0, end) is placed by first fit (`pack_shape` sizes `shape`)."""
  ends = [int(spans[i][k][1]) for i, k in chosen]
  place = _first_fit(ends, shape.slots)
  if len(chosen) > shape.steps or any(r >= shape.rows for r, _ in place) or max(ends, default=0) > shape.slots:
    raise ValueError(f"pack_spans: the batch does not fit {shape}")  # a caller's bug: the shape sizes it
  row = np.zeros((shape.rows, shape.slots), np.int32)
  token = np.zeros((shape.rows, shape.slots), np.int32)
  segment = np.full((shape.rows, shape.slots), -1, np.int32)
  in_step = np.zeros((shape.rows, shape.slots), bool)
  for p, ((i, k), e, (r, off)) in enumerate(zip(chosen, ends, place)):
    start = int(spans[i][k][0])
    row[r, off : off + e], token[r, off : off + e], segment[r, off : off + e] = i, np.arange(e), p
    in_step[r, off + start : off + e] = True
  return PackedSteps(row=row, token=token, segment=segment, in_step=in_step, num_steps=shape.steps)


def spans_shape(spans: Sequence[np.ndarray], batch: int, tokens: int) -> PackShape:
  """The PackShape of one batch of `batch` rows of `tokens` positions whose steps (all with tokens) are `spans`."""
  chosen = [(i, k) for i, sp in enumerate(spans) for k in range(len(sp))]
  place = _first_fit([int(spans[i][k][1]) for i, k in chosen], tokens)
  rows = 1 + max((r for r, _ in place), default=0)
  return PackShape(batch, tokens, bucket(rows, minimum=1), tokens, bucket(len(chosen), minimum=4))


def pack_steps(batch: Sequence[Example], shape: PackShape, feature_dim: int, *, labelled_only: bool):
  """A batch of examples packed for `Probe.packed`: (features [B, T, F], PackedSteps, labels [P] (NaN for padding
  steps), the (example, step) pair of each packed step). labelled_only: leave out steps with unknown labels (for
  the loss; they carry no signal)."""
  if len(batch) > shape.batch:
    raise ValueError(f"pack_steps: {len(batch)} examples for a batch of {shape.batch}")  # a caller's bug
  feats = np.zeros((shape.batch, shape.tokens, feature_dim), np.float32)
  for i, e in enumerate(batch):
    if e.features.ndim != 2 or e.features.shape[1] != feature_dim:
      raise DataFormatError(
        f"trajectory {e.id!r}: features of shape {list(e.features.shape)}, the probe reads [n_tokens, {feature_dim}]"
      )
    feats[i, : len(e.features)] = e.features
  chosen = _packed_steps(batch, labelled_only)
  pack = pack_spans([e.spans for e in batch], chosen, shape)
  labels = np.full(shape.steps, np.nan, np.float32)
  for p, (i, k) in enumerate(chosen):
    labels[p] = batch[i].labels[k]
  return feats, pack, labels, chosen
