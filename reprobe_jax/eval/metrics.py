"""Step-level detection metrics (docs/method.md §A6): PR-AUC as average precision and ROC-AUC, positive = incorrect
step.

Both match scikit-learn (`average_precision_score`, `roc_auc_score`) exactly, ties included; NaN labels (unknown
steps) are skipped. Pure numpy, so they run anywhere without scikit-learn.
"""

from __future__ import annotations

import numpy as np

from reprobe_jax.errors import ConfigError


def _clean(labels, scores):
  y = np.asarray(labels, np.float64).ravel()
  s = np.asarray(scores, np.float64).ravel()
  if y.shape != s.shape:
    raise ConfigError(f"labels ({y.size}) and scores ({s.size}) differ in length")
  keep = ~np.isnan(y)
  y, s = y[keep], s[keep]
  if np.isnan(s).any():
    raise ConfigError(f"{int(np.isnan(s).sum())} scores are NaN where the label is known")
  if not np.isin(y, (0.0, 1.0)).all():
    raise ConfigError("labels must be 0 (correct), 1 (incorrect) or NaN (unknown)")
  return y, s


def _curve(y, s):
  """Cumulative true/false positives at each distinct score threshold, highest score first."""
  order = np.argsort(-s, kind="mergesort")
  y, s = y[order], s[order]
  last_of_tie = np.r_[np.nonzero(np.diff(s))[0], y.size - 1]
  tps = np.cumsum(y)[last_of_tie]
  fps = (last_of_tie + 1) - tps
  return tps, fps


def pr_auc(labels, scores) -> float:
  """Average precision: sum over thresholds of (R_n - R_{n-1}) * P_n. NaN if there is no positive."""
  y, s = _clean(labels, scores)
  if y.sum() == 0:
    return float("nan")
  tps, fps = _curve(y, s)
  precision = tps / (tps + fps)
  recall = tps / tps[-1]
  return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def roc_auc(labels, scores) -> float:
  """Area under the ROC curve (trapezoids over distinct thresholds). NaN unless both classes are present."""
  y, s = _clean(labels, scores)
  pos = y.sum()
  neg = y.size - pos
  if pos == 0 or neg == 0:
    return float("nan")
  tps, fps = _curve(y, s)
  tpr = np.r_[0.0, tps / pos]
  fpr = np.r_[0.0, fps / neg]
  return float(np.trapezoid(tpr, fpr))


def pr_curve(labels, scores) -> tuple[np.ndarray, np.ndarray]:
  """(recall, precision) points for plotting, from recall 0 up."""
  y, s = _clean(labels, scores)
  if y.size == 0:
    return np.zeros(1), np.ones(1)
  tps, fps = _curve(y, s)
  precision = tps / (tps + fps)
  recall = tps / max(tps[-1], 1)
  return np.r_[0.0, recall], np.r_[1.0, precision]


def _weighted_ap(y: np.ndarray, s: np.ndarray, w: np.ndarray) -> np.ndarray:
  """Average precision of every row of weights `w` [B, n] over the same (y, s): integer weights give exactly the
  PR-AUC of the sample that repeats step i w[b, i] times (ties stay ties), so a bootstrap needs one sort."""
  order = np.argsort(-s, kind="mergesort")
  y, s, w = y[order], s[order], w[:, order]
  last_of_tie = np.r_[np.nonzero(np.diff(s))[0], y.size - 1]
  tps = np.cumsum(w * y, axis=1)[:, last_of_tie]
  all_ = np.cumsum(w, axis=1)[:, last_of_tie]
  with np.errstate(invalid="ignore", divide="ignore"):
    precision = np.where(all_ > 0, tps / np.where(all_ > 0, all_, 1), 0.0)
    recall = tps / tps[:, -1:]
  return np.sum(np.diff(np.c_[np.zeros(len(w)), recall], axis=1) * precision, axis=1)


def bootstrap_pr_auc(
  labels, scores, groups, *, samples: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
  """Percentile bootstrap interval of PR-AUC, resampling `groups` (e.g. the problem of each step) with
  replacement, so the steps of one problem, which are not independent, move together. (lo, hi); NaN when there
  is no labelled step. Resamples with no incorrect step are left out of the percentiles."""
  y = np.asarray(labels, np.float64).ravel()
  g = np.asarray(groups).ravel()
  if g.shape != y.shape:
    raise ConfigError(f"groups ({g.size}) and labels ({y.size}) differ in length")
  if not 0.0 < level < 1.0 or int(samples) != samples or samples < 1:
    raise ConfigError(f"bootstrap needs samples >= 1 and 0 < level < 1, found {samples}, {level}")
  keep = ~np.isnan(y)
  y, s = _clean(labels, scores)
  g = g[keep]
  if y.size == 0:
    return float("nan"), float("nan")
  ids, index = np.unique(g, return_inverse=True)
  rng = np.random.default_rng(seed)
  draws = rng.integers(0, len(ids), size=(int(samples), len(ids)))
  counts = np.zeros((int(samples), len(ids)))
  np.add.at(counts, (np.arange(int(samples))[:, None], draws), 1.0)
  w = counts[:, index]  # [B, n]: how often each step's group was drawn
  ap = _weighted_ap(y, s, w)
  ap = ap[np.isfinite(ap)]
  if ap.size == 0:
    return float("nan"), float("nan")
  lo, hi = np.quantile(ap, [(1 - level) / 2, 1 - (1 - level) / 2])
  return float(lo), float(hi)
