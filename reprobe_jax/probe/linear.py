"""The linear-probe baseline (docs/method.md §A6): L2-regularised logistic regression on each step's mean-pooled
features."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from reprobe_jax.probe.data import Example


def mean_pooled(exs: Sequence[Example]) -> tuple[np.ndarray, np.ndarray]:
  """(x [N, F], y [N]): the mean of each step's token features and its label, over the steps that have tokens."""
  xs, ys = [], []
  for e in exs:
    for (a, b), y in zip(e.spans, e.labels):
      if b > a:
        xs.append(e.features[a:b].mean(0))
        ys.append(y)
  dim = exs[0].features.shape[1] if exs else 0
  return np.asarray(xs, np.float64).reshape(-1, dim), np.asarray(ys, np.float64)


@dataclasses.dataclass(frozen=True)
class Logistic:
  """A fitted logistic regression, callable on x [M, F] -> [M]: sigmoid(((x - mean) / scale) @ weights + bias).
  A fit with nothing to separate has zero weights and bias logit(base rate), which is +-inf for a rate of 1 or 0."""

  mean: tuple[float, ...]
  scale: tuple[float, ...]
  weights: tuple[float, ...]
  bias: float

  def __call__(self, x: np.ndarray) -> np.ndarray:
    z = (np.asarray(x, np.float64) - self.mean) / self.scale  # [M, F]
    return 1 / (1 + np.exp(-(z @ np.asarray(self.weights) + self.bias)))


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1.0, iters: int = 25) -> Logistic:
  """P(incorrect) of x [N, F] from L2-regularised logistic regression fitted by Newton steps on standardised inputs
  (NaN labels are skipped; the intercept is not penalised). Returns the predictor [M, F] -> [M] with its weights."""
  known = ~np.isnan(y)
  x, y = x[known], y[known]
  dim = x.shape[1]
  if len(y) == 0 or y.min() == y.max():  # nothing to separate: predict the base rate
    rate = float(y.mean()) if len(y) else 0.5
    with np.errstate(divide="ignore"):
      bias = float(np.log(rate) - np.log1p(-rate))
    return Logistic((0.0,) * dim, (1.0,) * dim, (0.0,) * dim, bias)
  mu, sd = x.mean(0), x.std(0) + 1e-6
  z = np.c_[(x - mu) / sd, np.ones(len(x))]
  w = np.zeros(z.shape[1])
  reg = l2 * np.r_[np.ones(z.shape[1] - 1), 0.0]
  for _ in range(iters):
    p = 1 / (1 + np.exp(-z @ w))
    grad = z.T @ (p - y) + reg * w
    hess = (z * (p * (1 - p))[:, None]).T @ z + np.diag(reg) + 1e-8 * np.eye(len(w))
    w -= np.linalg.solve(hess, grad)
  return Logistic(tuple(map(float, mu)), tuple(map(float, sd)), tuple(map(float, w[:-1])), float(w[-1]))


def step_scores(predict: Callable[[np.ndarray], np.ndarray], exs: Sequence[Example]) -> np.ndarray:
  """[total steps of exs] the predictor's score of every step in order; a step with no tokens (which has no
  pooled feature, and a NaN label that every metric skips) scores 0.5."""
  n = sum(len(e.spans) for e in exs)
  out = np.full(n, 0.5)
  if n:
    nonempty = np.concatenate([e.spans[:, 1] > e.spans[:, 0] for e in exs])
    x, _ = mean_pooled(exs)
    if len(x):
      out[nonempty] = predict(x)
  return out
