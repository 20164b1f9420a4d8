"""The RL comparison's report: a table shaped like the SPAE paper's main table (mean +- sd over seeds), training
curves (accuracy and response length against step), and the wall time of each stage per step."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from reprobe_jax.eval.bands import summarise
from reprobe_jax.io.atomic import atomic_open

STAGES = ("time_rollout", "time_probe", "time_update")
EVAL_COLUMNS = (
  ("acc_at_k", "Acc@{k}", 100.0, ".1f"),
  ("len_at_k", "Len@{k}", 1.0, ".1f"),
  ("checking_tokens", "checking", 1.0, ".1f"),
  ("r2w", "R2W (%)", 100.0, ".1f"),
)


def _value(x) -> float:
  return math.nan if x is None else float(x)


def _cell(values: Sequence[float], fmt: str) -> str:
  band = summarise(values)
  if math.isnan(band.mean):
    return "n/a"
  return f"{band.mean:{fmt}}" if band.n == 1 else f"{band.mean:{fmt}} +- {band.sd:{fmt}}"


def stage_seconds(metrics: Mapping[str, Sequence[float]]) -> dict[str, float]:
  """Median seconds per step of each stage (rollout, probing, update) over the run's steps: the median leaves out
  the few steps that compile a new shape (their share is in the mean, `mean_<stage>`)."""
  out = {s[5:]: float(np.median(metrics[s])) if metrics.get(s) else math.nan for s in STAGES}
  out.update({f"mean_{s[5:]}": float(np.mean(metrics[s])) if metrics.get(s) else math.nan for s in STAGES})
  return out


def compare_markdown(start: Mapping[str, dict], per: Mapping[str, Sequence[dict]], *, k: int) -> str:
  """Rows: the start policy, then each method; columns: each group's Acc@k, Len@k, checking tokens and R2W, then
  the stage times per step. Cells mean +- sd over the method's seeds (the start policy is one evaluation)."""
  groups = list(start)
  head = ["method"] + [f"{g.replace('_', ' ')} {name.format(k=k)}" for g in groups for _, name, _, _ in EVAL_COLUMNS]
  head += ["rollout s/step (median)", "probing s/step", "update s/step"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  cells = ["start policy"]
  for g in groups:
    cells += [_cell([scale * _value(start[g][key])], fmt) for key, _, scale, fmt in EVAL_COLUMNS]
  lines.append("| " + " | ".join(cells + ["", "", ""]) + " |")
  for method, runs in per.items():
    cells = [method]
    for g in groups:
      cells += [_cell([scale * _value(r["eval"][g][key]) for r in runs], fmt) for key, _, scale, fmt in EVAL_COLUMNS]
    cells += [_cell([r["stage_seconds"][s[5:]] for r in runs], ".2f") for s in STAGES]
    lines.append("| " + " | ".join(cells) + " |")
  seeds = sorted({r["seed"] for runs in per.values() for r in runs})
  return (
    "\n".join(lines) + f"\n\n(mean +- sd over seeds {seeds}; checking tokens over correct trajectories with a "
    "saturated boundary)\n"
  )


def plot_curves(per: Mapping[str, Sequence[dict]], path: str) -> None:
  """Training accuracy (the rollouts' mean reward) and mean response length against step, one line per method
  (mean over seeds, band min..max)."""
  fig = Figure(figsize=(10, 3.6))
  axes = fig.subplots(1, 2)
  for method, runs in per.items():
    for ax, key in zip(axes, ("reward", "response_length")):
      series = [np.asarray(r["train"][key], float) for r in runs if r["train"].get(key)]
      if not series:
        continue
      n = min(map(len, series))
      arr = np.stack([s[:n] for s in series])
      steps = np.arange(1, n + 1)
      ax.plot(steps, arr.mean(0), label=method)
      ax.fill_between(steps, arr.min(0), arr.max(0), alpha=0.2)
  axes[0].set_title("training accuracy (rollout reward)")
  axes[1].set_title("response length (tokens)")
  for ax in axes:
    ax.set_xlabel("RL step")
  axes[0].legend()
  fig.tight_layout()
  with atomic_open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=110)
