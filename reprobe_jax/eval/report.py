"""Reports of step scorers against step labels (docs/method.md §A6): PR-AUC and ROC-AUC per domain with the in-domain,
out-of-domain and overall means (metrics.json), the Markdown table (table.md) and the PR curves (pr_curves.png).

`scores` maps scorer name -> domain -> [num_steps] scores (higher = more likely incorrect); `labels` maps domain ->
[num_steps] labels (1.0 incorrect, 0.0 correct, NaN unknown: skipped by every metric).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from reprobe_jax.io.atomic import atomic_open
from reprobe_jax.eval.metrics import bootstrap_pr_auc, pr_auc, pr_curve, roc_auc

Scores = Mapping[str, Mapping[str, np.ndarray]]


def scorer_metrics(
  scores: Scores,
  labels: Mapping[str, np.ndarray],
  id_domains: Sequence[str],
  ood_domains: Sequence[str],
  groups: Mapping[str, np.ndarray] | None = None,
  *,
  bootstrap: int = 1000,
  seed: int = 0,
) -> dict:
  """{'datasets': {domain: {steps, incorrect_share}}, 'methods': {scorer: {domain: {pr_auc, roc_auc[, pr_auc_ci]},
  id_mean_pr_auc, ood_mean_pr_auc, overall_pr_auc, (the same for roc_auc)}}}; JSON-ready (a domain whose steps all
  went unlabelled has a null incorrect share; no OOD domain gives NaN OOD means).

  `labels` may hold more datasets than the domains (e.g. a domain without its answer lines): they get their own
  numbers but stay out of the means. `groups` (dataset -> [num_steps] the problem of each step) adds `pr_auc_ci`,
  the 95% bootstrap interval over problems (`metrics.bootstrap_pr_auc`, `bootstrap` resamples)."""
  id_d, ood_d = list(id_domains), list(ood_domains)

  def dataset(y):
    y = np.asarray(y, dtype=float)
    n = int(np.sum(~np.isnan(y)))
    return {"steps": n, "incorrect_share": float(np.nanmean(y)) if n else None}

  out = {"datasets": {d: dataset(labels[d]) for d in labels}, "methods": {}}
  for method, per in scores.items():
    m = {}
    for d in labels:
      m[d] = {"pr_auc": pr_auc(labels[d], per[d]), "roc_auc": roc_auc(labels[d], per[d])}
      if groups is not None and d in groups:
        m[d]["pr_auc_ci"] = list(bootstrap_pr_auc(labels[d], per[d], groups[d], samples=bootstrap, seed=seed))
    for key in ("pr_auc", "roc_auc"):
      m[f"id_mean_{key}"] = float(np.mean([m[d][key] for d in id_d]))
      m[f"ood_mean_{key}"] = float(np.mean([m[d][key] for d in ood_d])) if ood_d else float("nan")
      m[f"overall_{key}"] = float(np.mean([m[d][key] for d in id_d + ood_d]))
    out["methods"][method] = m
  return out


def table_markdown(metrics: dict) -> str:
  """The PR-AUC table of `scorer_metrics`' output: one row per scorer, one column per domain and the means."""
  datasets = list(metrics["datasets"])
  head = ["method"] + [f"{d} PR-AUC" for d in datasets] + ["ID mean", "OOD mean", "overall"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

  def cell(v):
    ci = v.get("pr_auc_ci")
    return f"{v['pr_auc']:.3f}" + ("" if ci is None else f" ({ci[0]:.2f}-{ci[1]:.2f})")

  for method, m in metrics["methods"].items():
    cells = [cell(m[d]) for d in datasets]
    cells += [f"{m['id_mean_pr_auc']:.3f}", f"{m['ood_mean_pr_auc']:.3f}", f"{m['overall_pr_auc']:.3f}"]
    lines.append(f"| {method} | " + " | ".join(cells) + " |")
  share = ", ".join(
    f"{d}: {v['steps']} steps, "
    + ("none labelled" if v["incorrect_share"] is None else f"{100 * v['incorrect_share']:.0f}% incorrect")
    for d, v in metrics["datasets"].items()
  )
  ci = any("pr_auc_ci" in v for m in metrics["methods"].values() for v in m.values() if isinstance(v, dict))
  note = " In brackets: the 95% bootstrap interval over test problems." if ci else ""
  return "\n".join(lines) + f"\n\nTest steps ({share}).{note}\n"


def plot_pr_curves(scores: Scores, labels: Mapping[str, np.ndarray], path: str) -> None:
  """One precision-recall panel per domain, every scorer but 'random' (the base rate is the dotted line)."""
  fig = Figure(figsize=(5 * len(labels), 4))
  axes = fig.subplots(1, len(labels), squeeze=False)
  for ax, d in zip(axes[0], labels):
    for method, per in scores.items():
      if method == "random":
        continue
      r, p = pr_curve(labels[d], per[d])
      ax.plot(r, p, label=f"{method} ({pr_auc(labels[d], per[d]):.2f})", lw=2 if method.startswith("probe") else 1)
    if np.any(~np.isnan(labels[d])):  # the base rate: a random scorer's precision
      ax.axhline(np.nanmean(labels[d]), color="gray", ls=":", lw=1)
    ax.set(title=d, xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02))
    ax.legend(fontsize=7)
  fig.tight_layout()
  with atomic_open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=110)
