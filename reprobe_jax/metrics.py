"""Step-level detection metrics (METHOD A6): PR-AUC as average precision and ROC-AUC, positive = incorrect step.

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
