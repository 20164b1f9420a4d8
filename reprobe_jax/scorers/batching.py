"""Host-side batching for step scorers: ragged rows -> padded ScoreInputs of bucketed shapes -> per-row scores.

Rows are padded to [B, bucket(T)] and their spans to [B, bucket(S), 2] (the probe's collate buckets), so scoring
a data set compiles a few shapes, not one per trajectory.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.fields import Int
from reprobe_jax.models.sampling import bucket
from reprobe_jax.scorers.base import ScoreInputs, StepScorer, score

FIELDS = ("features", "logprobs", "entropy", "self_certainty")
MAX_BATCH = 2**16  # rows per jitted call: the padded [B, T] arrays are allocated whole


def record_rows(records: Sequence[dict]) -> tuple[list[dict[str, np.ndarray]], list[np.ndarray]]:
  """Trajectory records (reprobe_jax.trajectories: per-token logprobs, entropy, self_certainty; steps with token
  spans) -> (rows, spans [S, 2]) for `score_rows`."""
  rows = [{k: np.asarray(r[k], np.float32) for k in ("logprobs", "entropy", "self_certainty")} for r in records]
  spans = [np.asarray([[s["start"], s["end"]] for s in r["steps"]], np.int32).reshape(-1, 2) for r in records]
  return rows, spans


def pad_rows(
  rows: Sequence[Mapping[str, np.ndarray]], spans: Sequence[np.ndarray], batch_size: int | None = None
) -> tuple[ScoreInputs, np.ndarray]:
  """Rows {field: [n] or [n, F]} (fields of FIELDS, the same in every row) and spans [S_i, 2] -> ScoreInputs with
  [B, bucket(T)] arrays and spans [B, bucket(S), 2]; B = batch_size (rows past the data are padding) or len(rows).
  Errors name the row and field that do not fit."""
  if not rows or len(rows) != len(spans):
    raise DataFormatError(f"pad_rows: need one spans array per row, got {len(rows)} rows and {len(spans)} spans")
  fields = [k for k in FIELDS if k in rows[0]]
  if not fields or set(rows[0]) - set(FIELDS):
    raise DataFormatError(f"row 0 has fields {sorted(rows[0])}; expected some of {FIELDS}")
  lengths = []
  for i, (row, sp) in enumerate(zip(rows, spans)):
    if sorted(row) != sorted(fields):
      raise DataFormatError(f"row {i} has fields {sorted(row)}, row 0 has {sorted(fields)}")
    n = len(row[fields[0]])
    for k in fields:
      if len(row[k]) != n:
        raise DataFormatError(f"row {i}: {k} has {len(row[k])} tokens, {fields[0]} has {n}")
    sp = np.asarray(sp).reshape(-1, 2)
    if len(sp) and (sp.min() < 0 or sp.max() > n):
      raise DataFormatError(f"row {i}: a step span leaves the row's {n} tokens: {sp.tolist()}")
    lengths.append(n)
  b = len(rows) if batch_size is None else batch_size
  if b < len(rows):
    raise DataFormatError(f"pad_rows: {len(rows)} rows do not fit batch_size {b}")
  t = bucket(max(lengths + [1]), minimum=16)
  s = bucket(max([len(np.asarray(sp).reshape(-1, 2)) for sp in spans] + [1]), minimum=4)
  mask = np.zeros((b, t), bool)
  padded_spans = np.zeros((b, s, 2), np.int32)
  arrays = {}
  for k in fields:
    tail = np.shape(rows[0][k])[1:]
    arrays[k] = np.zeros((b, t) + tail, np.float32)
  for i, (row, sp, n) in enumerate(zip(rows, spans, lengths)):
    mask[i, :n] = True
    sp = np.asarray(sp, np.int32).reshape(-1, 2)
    padded_spans[i, : len(sp)] = sp
    for k in fields:
      arrays[k][i, :n] = row[k]
  return ScoreInputs(token_mask=mask, **arrays), padded_spans


def score_rows(
  scorer: StepScorer, rows: Sequence[Mapping[str, np.ndarray]], spans: Sequence[np.ndarray], *, batch_size: int = 32
) -> list[np.ndarray]:
  """Scores [S_i] of every row's steps with the jitted `score`, in batches of rows of similar length; batch_size an
  int in [1, MAX_BATCH] (ConfigError naming it otherwise)."""
  if not Int(1, MAX_BATCH).ok(batch_size):
    raise ConfigError(f"score_rows: batch_size: expected {Int(1, MAX_BATCH)}, got {batch_size!r}")
  order = sorted(range(len(rows)), key=lambda i: len(next(iter(rows[i].values()))))
  out: list[np.ndarray | None] = [None] * len(rows)
  for c in range(0, len(order), batch_size):
    idx = order[c : c + batch_size]
    inputs, padded = pad_rows([rows[i] for i in idx], [spans[i] for i in idx], batch_size)
    res = np.asarray(score(scorer, inputs, jnp.asarray(padded)))
    for r, i in enumerate(idx):
      out[i] = res[r, : len(np.asarray(spans[i]).reshape(-1, 2))]
  return out  # type: ignore[return-value]
