"""Fusion and cascade in the ReProbe report (docs/method.md §A7, Fusion and cascade), read from the stored step
scores of a run.

`jobs.reprobe.evaluate` with a PRM writes every val and test step's probe and PRM scores (`write_step_scores`,
`<prm folder>/step_scores.npz`). From them: a fusion per probe feature set fitted on the val split (its test scores
are the report's 'fusion[<set>]' rows), and for the probe with the best val PR-AUC (chosen on val, never on test)
the cascade curve of every test domain: the PRM asked about the fraction f of steps where the probe is least
certain, its score replacing the probe's ('prm') or fused with it ('fusion'), as f goes from 0 to 1.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from reprobe_jax.errors import DataFormatError
from reprobe_jax.io.seal import check_seal
from reprobe_jax.eval.metrics import pr_auc
from reprobe_jax.prm.combine import CascadeCurve, Fusion, cascade_curve, fit_fusion


@dataclasses.dataclass(frozen=True)
class SplitScores:
  """One split of a step_scores.npz: labels [N] (1 incorrect, 0 correct, NaN unknown), domain [N], scores
  {scorer: [N]}."""

  labels: np.ndarray
  domain: np.ndarray
  scores: Mapping[str, np.ndarray]


def read_step_scores(path: str) -> dict[str, SplitScores]:
  """{'val': ..., 'test': ...} from `jobs.reprobe_scores.write_step_scores`' file; DataFormatError naming it when
  a split or its arrays are missing or of different lengths, when a value is out of range (labels 0, 1 or NaN for
  unknown; every scorer's scores, the PRM's and the probes', probabilities in [0, 1] or NaN), or when the file does
  not match its seal (it is read back by the jobs that wrote it)."""
  check_seal(path, "step-scores file")
  try:
    with np.load(path) as z:
      arrays = {k: z[k] for k in z.files}
  except (OSError, ValueError) as e:
    raise DataFormatError(f"{path}: not a readable step-scores file ({e})") from None
  out = {}
  for split in ("val", "test"):
    for key in ("labels", "domain"):
      if f"{split}/{key}" not in arrays:
        raise DataFormatError(f"{path}: no {split}/{key}")
    prefix = f"{split}/score/"
    scores = {k[len(prefix) :]: np.asarray(v, np.float64) for k, v in arrays.items() if k.startswith(prefix)}
    n = len(arrays[f"{split}/labels"])
    bad = [k for k, v in scores.items() if len(v) != n] + ([] if len(arrays[f"{split}/domain"]) == n else ["domain"])
    if bad:
      raise DataFormatError(f"{path}: {split} arrays {bad} do not have one value per step ({n})")
    out[split] = SplitScores(np.asarray(arrays[f"{split}/labels"], np.float64), arrays[f"{split}/domain"], scores)
    _check_values(path, split, out[split])
  return out


def _check_values(path: str, split: str, s: SplitScores) -> None:
  arrays = {
    "labels": (s.labels, "0, 1 or NaN"),
    **{f"score/{k}": (v, "a probability in [0, 1] or NaN") for k, v in s.scores.items()},
  }
  for name, (v, expected) in arrays.items():
    ok = (v == 0) | (v == 1) if name == "labels" else (v >= 0) & (v <= 1)
    wrong = ~(np.isnan(v) | ok)
    if wrong.any():
      raise DataFormatError(f"{path}: {split}/{name}: expected {expected}, found {v[wrong][:3].tolist()}")


def _finite(*xs) -> np.ndarray:
  return np.all([np.isfinite(x) for x in xs], axis=0)


@dataclasses.dataclass(frozen=True)
class Combined:
  """What the report adds: fusion test scores {'fusion[<set>]': {domain: [steps]}} (0.5 where a step has none),
  the fitted fusions {set: Fusion}, the probe the cascade starts from, and the cascade curves {domain: {'prm' |
  'fusion': CascadeCurve}}."""

  fusion_scores: dict[str, dict[str, np.ndarray]]
  fusions: dict[str, Fusion]
  cascade_probe: str
  cascades: dict[str, dict[str, CascadeCurve]]

  def to_json(self) -> dict:
    return {
      "fusions": {k: f.to_json() for k, f in self.fusions.items()},
      "cascade_probe": self.cascade_probe,
      "cascades": {d: {k: c.to_json() for k, c in per.items()} for d, per in self.cascades.items()},
    }


def combine(steps: Mapping[str, SplitScores], domains: Sequence[str], prm: str = "prm") -> Combined:
  """Fusions fitted on val, applied to test; cascades on test from the probe with the best val PR-AUC."""
  val, test = steps["val"], steps["test"]
  probes = [k for k in val.scores if k.startswith("probe[") and k in test.scores]
  if prm not in val.scores or prm not in test.scores or not probes:
    raise DataFormatError(
      f"step scores need the {prm!r} scores and a probe's in both splits; found val "
      f"{sorted(val.scores)}, test {sorted(test.scores)}"
    )
  fusions, fused = {}, {}
  for name in probes:
    ok = _finite(val.scores[name], val.scores[prm])
    fusion = fit_fusion(val.scores[name][ok], val.scores[prm][ok], val.labels[ok])
    fusions[name[len("probe[") : -1]] = fusion
    okt = _finite(test.scores[name], test.scores[prm])
    s = np.full(len(test.labels), 0.5)  # a step without tokens (its label is NaN): as linear.step_scores
    s[okt] = fusion(test.scores[name][okt], test.scores[prm][okt])
    fused[f"fusion[{name[len('probe[') : -1]}]"] = {d: s[test.domain == d] for d in domains}
  best = max(probes, key=lambda k: pr_auc(val.labels, np.nan_to_num(val.scores[k], nan=0.5)))
  fusion = fusions[best[len("probe[") : -1]]
  cascades = {}
  for d in domains:
    m = (test.domain == d) & _finite(test.scores[best], test.scores[prm])
    p, q, y = test.scores[best][m], test.scores[prm][m], test.labels[m]
    cascades[d] = {"prm": cascade_curve(p, q, y), "fusion": cascade_curve(p, q, y, combine=fusion)}
  return Combined(fused, fusions, best, cascades)


def cascade_markdown(c: Combined) -> str:
  """The cascade table: per domain and combination, test PR-AUC and step accuracy at each share of PRM calls."""
  any_curve = next(iter(next(iter(c.cascades.values())).values()))
  head = ["domain", "PRM asked"] + [f"{f:.0%}" for f in any_curve.fractions]
  lines = [
    f"Cascade from {c.cascade_probe} (chosen by val PR-AUC): test PR-AUC / step accuracy as the PRM is asked "
    "about the steps where the probe is least certain.",
    "",
    "| " + " | ".join(head) + " |",
    "|" + "---|" * len(head),
  ]
  for d, per in c.cascades.items():
    for kind, curve in per.items():
      cells = [f"{a:.3f} / {b:.2f}" for a, b in zip(curve.pr_auc, curve.accuracy)]
      lines.append(f"| {d} | {'its score' if kind == 'prm' else 'fused with the probe'} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"
