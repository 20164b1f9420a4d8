"""Probe and PRM together (docs/method.md §A7): fusion, a logistic regression on the two step scores fitted on the
validation split, and cascade, the probe first and the PRM only on the steps where the probe is least certain.

Scorer-agnostic and pure numpy on the host: every function takes per-step score arrays [N] with "higher = more
likely incorrect" in [0, 1] (the probe's P(incorrect), the PRM's 1 - reward). `cascade_scores` is the step-level
selection on its own, so test-time scaling can apply it to the candidate steps of a search and aggregate after.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from reprobe_jax.io.atomic import atomic_open
from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.eval.metrics import pr_auc
from reprobe_jax.probe.linear import Logistic, fit_logistic
from reprobe_jax.io.readers import shown

EPS = 1e-6  # scores are clipped to [EPS, 1 - EPS] before the logit
FRACTIONS = tuple(i / 10 for i in range(11))  # 0, 0.1, ..., 1


def _scores(named: Mapping[str, Any]) -> list[np.ndarray]:
  """The named score arrays as float64 [N], checked: one dimension, one length, values in [0, 1] (no NaN)."""
  out = [np.asarray(v, np.float64) for v in named.values()]
  for name, s in zip(named, out):
    if s.ndim != 1:
      raise ConfigError(f"{name} must be a 1-D array of step scores, found shape {s.shape}")
    bad = np.flatnonzero(~((s >= 0) & (s <= 1)))  # NaN included
    if bad.size:
      raise ConfigError(f"{name} must hold scores in [0, 1], found {float(s[bad[0]])} at step {bad[0]}")
  lengths = {name: len(s) for name, s in zip(named, out)}
  if len(set(lengths.values())) > 1:
    raise ConfigError("step arrays differ in length: " + ", ".join(f"{k} {v}" for k, v in lengths.items()))
  return out


def _unit(value: Any, name: str) -> float:
  """`value` as a float in [0, 1]; ConfigError naming `name` and the value otherwise (NaN, bool, a string...)."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
    raise ConfigError(f"{name} must be a number in [0, 1], found {shown(value)}")
  return float(value)


def _logit(s: np.ndarray, eps: float) -> np.ndarray:
  s = np.clip(s, eps, 1 - eps)
  return np.log(s) - np.log1p(-s)


@dataclasses.dataclass(frozen=True)
class Fusion:
  """The fitted fusion: P(incorrect) = sigmoid(w . standardise(logit(clip(probe), logit(clip(prm)))) + b).

  Inputs are logits, not raw scores: with weights (1, 1) the model is the sum of the two log-odds (independent
  evidence adds in log-odds), which raw probabilities cannot express, and a score near 0 or 1 keeps its weight
  instead of being squashed against the edge. The clip at `eps` (1e-6; a PRM softmax in float32 reaches exactly 0
  or 1) bounds each logit to +-13.8, so a saturated score cannot dominate without limit.
  """

  model: Logistic  # over the two features (probe logit, PRM logit)
  eps: float = EPS

  def __call__(self, probe, prm) -> np.ndarray:
    """[N] fused P(incorrect) of the probe's and the PRM's step scores [N]."""
    probe, prm = _scores({"probe": probe, "prm": prm})
    return self.model(np.c_[_logit(probe, self.eps), _logit(prm, self.eps)])  # [N, 2] -> [N]

  def to_json(self) -> dict:
    """The JSON record of this fusion (a bias of +-inf, from one-class labels, is written as JSON's Infinity)."""
    m = self.model
    return {
      "inputs": "logit",
      "eps": self.eps,
      "mean": list(m.mean),
      "scale": list(m.scale),
      "weights": list(m.weights),
      "bias": m.bias,
    }

  @classmethod
  def from_json(cls, record: Any, where: str = "<fusion>") -> Fusion:
    """The Fusion of a `to_json` record; DataFormatError starting with `where` and naming the field on any defect."""
    if not isinstance(record, dict):
      raise DataFormatError(f"{where}: expected a JSON object, found {type(record).__name__}")
    if record.get("inputs") != "logit":
      raise DataFormatError(f"{where}: field 'inputs' must be 'logit', found {shown(record.get('inputs'))}")

    def number(value, field, ok=lambda v: True, what="a number"):
      if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not ok(value):
        raise DataFormatError(f"{where}: field {field!r} must be {what}, found {shown(value)}")
      return float(value)

    def pair(field, ok=math.isfinite, what="finite"):
      value = record.get(field)
      if not isinstance(value, list) or len(value) != 2:
        raise DataFormatError(f"{where}: field {field!r} must be a list of 2 numbers, found {shown(value)}")
      return tuple(number(v, field, ok, f"a list of 2 {what} numbers") for v in value)

    eps = number(record.get("eps"), "eps", lambda v: 0 < v < 0.5, "a number in (0, 0.5)")
    model = Logistic(
      pair("mean"),
      pair("scale", lambda v: math.isfinite(v) and v > 0, "positive finite"),
      pair("weights"),
      number(record.get("bias"), "bias"),
    )
    return cls(model, eps)


def fit_fusion(probe_scores, prm_scores, labels, l2: float = 1.0) -> Fusion:
  """Fits the fusion on one split's step scores [N] and labels [N] (1 = incorrect, NaN = unknown, skipped): L2 =
  `l2` logistic regression on the standardised logits (probe/linear.fit_logistic). Fit it on validation only."""
  probe, prm = _scores({"probe_scores": probe_scores, "prm_scores": prm_scores})
  y = np.asarray(labels, np.float64)
  if y.shape != probe.shape:
    raise ConfigError(f"labels ({y.size}) and step scores ({probe.size}) differ in length")
  if isinstance(l2, bool) or not (isinstance(l2, numbers.Real) and 0 <= l2 < math.inf):
    raise ConfigError(f"l2 must be a finite number >= 0, found {shown(l2)}")
  return Fusion(fit_logistic(np.c_[_logit(probe, EPS), _logit(prm, EPS)], y, l2=float(l2)))


def cascade_scores(
  probe,
  prm,
  fraction: float,
  *,
  threshold: float = 0.5,
  combine: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """(scores [N], asked [N] bool) of the cascade: the PRM is asked about the k = round(fraction * N) steps (halves
  round up) whose probe score is closest to `threshold`, ties by index; they take the PRM's score (or
  `combine(probe, prm)` on them, e.g. a Fusion), every other step keeps the probe's. fraction 0 is the probe,
  fraction 1 the PRM (or the fusion)."""
  probe, prm = _scores({"probe": probe, "prm": prm})
  fraction, threshold = _unit(fraction, "cascade fraction"), _unit(threshold, "cascade threshold")
  k = min(len(probe), math.floor(fraction * len(probe) + 0.5))
  asked = np.zeros(len(probe), bool)
  asked[np.argsort(np.abs(probe - threshold), kind="stable")[:k]] = True  # least certain first, ties by index
  scores = probe.copy()
  chosen = prm[asked] if combine is None else np.asarray(combine(probe[asked], prm[asked]), np.float64)
  if chosen.shape != (k,):
    raise ConfigError(f"combine must return one score per asked step ({k}), found shape {chosen.shape}")
  scores[asked] = chosen
  return scores, asked


@dataclasses.dataclass(frozen=True)
class CascadeCurve:
  """The cascade as its fraction goes from 0 to 1: per fraction, PRM calls per step (the share of steps asked),
  step-level PR-AUC and step accuracy (a step is called incorrect when its score > threshold); NaN labels skipped."""

  fractions: tuple[float, ...]
  prm_calls: tuple[float, ...]
  pr_auc: tuple[float, ...]
  accuracy: tuple[float, ...]
  threshold: float

  def to_json(self) -> dict:
    """The JSON record of this curve (NaN, e.g. PR-AUC with no incorrect step, is written as JSON's NaN)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def cascade_curve(
  probe,
  prm,
  labels,
  fractions: Sequence[float] = FRACTIONS,
  *,
  threshold: float = 0.5,
  combine: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
) -> CascadeCurve:
  """The CascadeCurve of step scores probe [N], prm [N] against labels [N] (1 = incorrect, NaN = unknown)."""
  y = np.asarray(labels, np.float64)
  if y.shape != np.shape(probe):
    raise ConfigError(f"labels ({y.size}) and step scores ({np.size(probe)}) differ in length")
  known = ~np.isnan(y)
  calls, aucs, accs = [], [], []
  for f in fractions:
    scores, asked = cascade_scores(probe, prm, f, threshold=threshold, combine=combine)
    calls.append(float(asked.mean()) if asked.size else 0.0)
    aucs.append(pr_auc(y, scores))
    accs.append(float(np.mean((scores[known] > threshold) == y[known])) if known.any() else float("nan"))
  return CascadeCurve(tuple(float(f) for f in fractions), tuple(calls), tuple(aucs), tuple(accs), float(threshold))


def plot_cascade(curves: Mapping[str, CascadeCurve], path: str) -> None:
  """A PNG at `path`: PR-AUC (left) and step accuracy (right) against PRM calls per step, one line per curve."""
  fig = Figure(figsize=(10, 4))
  axes = fig.subplots(1, 2)
  for name, c in curves.items():
    axes[0].plot(c.prm_calls, c.pr_auc, marker="o", ms=3, label=name)
    axes[1].plot(c.prm_calls, c.accuracy, marker="o", ms=3, label=name)
  for ax, what in zip(axes, ("step PR-AUC", "step accuracy")):
    ax.set(xlabel="PRM calls per step", ylabel=what, xlim=(-0.02, 1.02), title=f"cascade: {what}")
    if curves:
      ax.legend(fontsize=7)
  fig.tight_layout()
  with atomic_open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=110)
