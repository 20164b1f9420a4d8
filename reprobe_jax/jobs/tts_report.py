"""Tables and the budget plot of the test-time-scaling job (`jobs.tts.evaluate`'s metrics)."""

from __future__ import annotations

import math
from typing import Sequence

from matplotlib.figure import Figure

from reprobe_jax.eval.bands import Band, summarise
from reprobe_jax.io.atomic import atomic_open
from reprobe_jax.eval.tts_rows import at as _at
from reprobe_jax.eval.tts_rows import rows as _rows
from reprobe_jax.jobs.tts_config import MIN_SEARCH_BUDGET


def _fmt(x, digits: int = 3) -> str:
  """A number, or a Band over seeds as 'mean +- sd'."""
  if isinstance(x, Band):
    return f"{x.mean:.{digits}f} +- {x.sd:.{digits}f}"
  return f"{x:.{digits}f}"


def over_seeds(per_seed: Sequence[dict]) -> dict:
  """The metrics of several seeds as one metrics dict whose numbers are Bands (mean, sd, min, max over seeds); the
  grid (domains, cells, budgets) is the first seed's."""
  first = per_seed[0]
  results = {}
  for domain, per in first["results"].items():
    for cell, budgets in per.items():
      for b, summary in budgets.items():
        results.setdefault(domain, {}).setdefault(cell, {})[b] = {
          k: summarise([m["results"][domain][cell][b][k] for m in per_seed]) for k in summary
        }
  out = {**first, "results": results, "seeds": len(per_seed)}
  if "cascade" in first:
    out["cascade"] = {
      d: {
        **c,
        **{
          kind: {
            k: [summarise([m["cascade"][d][kind][k][i] for m in per_seed]) for i in range(len(c[kind][k]))]
            for k in c[kind]
          }
          for kind in CASCADE_KINDS
        },
      }
      for d, c in first["cascade"].items()
    }
  return out


CASCADE_KINDS = {"prm": "its score", "fusion": "fused with the probe"}


def _mean(x):
  return x.mean if isinstance(x, Band) else x


def cascade_markdown(metrics: dict) -> str:
  """The cascade rows: Best-of-N accuracy at the largest budget as the PRM is asked about a growing share of the
  candidate steps (those where the probe is least certain); empty without a cascade."""
  cascades = metrics.get("cascade")
  if not cascades:
    return ""
  any_c = next(iter(cascades.values()))
  head = ["domain", "PRM asked"] + [f"{f:.0%}" for f in any_c["fractions"]]
  lines = [
    f"Cascade, Best-of-N at N = {any_c['budget']} from {any_c['probe']}: accuracy as the PRM is asked about "
    "the share of candidate steps where the probe is least certain (0% = the probe alone, 100% = the PRM "
    "alone or the fusion):",
    "",
    "| " + " | ".join(head) + " |",
    "|---" * len(head) + "|",
  ]
  for d, c in cascades.items():
    for kind, title in CASCADE_KINDS.items():
      lines.append(f"| {d} | {title} | " + " | ".join(_fmt(a) for a in c[kind]["accuracy"]) + " |")
  return "\n".join(lines) + "\n"


def plot_cascade(metrics: dict, path: str) -> None:
  """cascade.png: Best-of-N accuracy against PRM calls per candidate step, one panel per domain."""
  cascades = metrics["cascade"]
  fig = Figure(figsize=(5 * len(cascades), 4))
  axes = fig.subplots(1, len(cascades), squeeze=False)
  for ax, (d, c) in zip(axes[0], cascades.items()):
    for kind, title in CASCADE_KINDS.items():
      xs = [_mean(x) for x in c[kind]["prm_calls"]]
      ys = c[kind]["accuracy"]
      (line,) = ax.plot(xs, [_mean(y) for y in ys], marker="o", ms=3, label=f"PRM {title}")
      if ys and isinstance(ys[0], Band):
        ax.fill_between(
          xs, [y.mean - y.sd for y in ys], [y.mean + y.sd for y in ys], color=line.get_color(), alpha=0.12
        )
    ax.set(xlabel="PRM calls per candidate step", ylabel=f"accuracy (Best-of-N, N = {c['budget']})", title=d)
    ax.legend(fontsize=7)
  fig.tight_layout()
  with atomic_open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=120)


def table_markdown(metrics: dict) -> str:
  """Accuracy per method (rows) and domain (columns) at the largest budget, then the in-domain accuracy at every
  budget with what each method sampled. Over seeds (`over_seeds`): every number is mean +- sd."""
  results = metrics["results"]
  domains = list(results)
  budgets = metrics["config"]["budgets"]
  top = max(budgets)
  ids = set(metrics.get("train_domains", ()))
  head = [f"{d} ({'ID' if d in ids else 'OOD'})" for d in domains]
  lines = [
    f"Accuracy at N = {top} sampled trajectories per problem (beam search and DVTS: B x N = {top}):",
    "",
    "| method | " + " | ".join(head) + " |",
    "|---" * (len(domains) + 1) + "|",
  ]
  first = results[domains[0]]
  for title, cell, sel in _rows(first):
    vals = []
    for d in domains:
      s = _at(results[d].get(cell, {}), top)
      vals.append("" if s is None else _fmt(s[sel]))
    lines.append(f"| {title} | " + " | ".join(vals) + " |")
  ref = domains[0]
  lines += [
    "",
    f"{ref}: accuracy by budget (sampled steps per problem at the largest budget, seconds per problem):",
    "",
    "| method | " + " | ".join(f"N={b}" for b in budgets) + " | steps | tokens | s/problem | selection AUROC |",
    "|---" * (len(budgets) + 5) + "|",
  ]
  for title, cell, sel in _rows(results[ref]):
    c = results[ref].get(cell, {})
    vals = ["" if _at(c, b) is None else _fmt(_at(c, b)[sel]) for b in budgets]
    last = _at(c, top) or {}
    cost = (
      [_fmt(last["sampled_steps"], 1), _fmt(last["generated_tokens"], 0), _fmt(last["seconds_per_problem"], 2)]
      if last
      else ["", "", ""]
    )
    auroc = last.get("selection_auroc") if sel in ("best", "weighted") else None
    value = auroc.mean if isinstance(auroc, Band) else auroc
    cost.append("" if value is None or math.isnan(value) else _fmt(auroc))
    lines.append(f"| {title} | " + " | ".join(vals + cost) + " |")
  seeds = f" Mean +- sd over {metrics['seeds']} seeds." if metrics.get("seeds") else ""
  cascade = cascade_markdown(metrics)
  if cascade:
    lines += ["", cascade.rstrip("\n")]
  if min(budgets) < MIN_SEARCH_BUDGET and any(
    k.startswith(("beam[", "dvts[")) for per in results.values() for k in per
  ):
    lines += [
      "",
      "Beam search and DVTS have no N = 1 entry: at B x N = 1 a search has nothing to choose between (it is "
      "one sampled trajectory, Best-of-N at N = 1).",
    ]
  lines += [
    "",
    "selection AUROC: how well the scorer's trajectory scores rank each problem's own candidates (wrong "
    "answers above right ones), averaged over problems with both; 0.5 is chance.",
    "",
    f"Machine: {metrics.get('machine', '?')}.{seeds}",
    "",
  ]
  return "\n".join(lines)


def plot_budgets(metrics: dict, path: str) -> None:
  """accuracy.png: accuracy against the sample budget, one panel per domain, one line per strategy x scorer."""
  results = metrics["results"]
  budgets = metrics["config"]["budgets"]
  fig = Figure(figsize=(5 * len(results), 4))
  axes = fig.subplots(1, len(results), squeeze=False)
  for ax, (domain, per) in zip(axes[0], results.items()):
    for title, cell, sel in _rows(per):
      c = per.get(cell, {})
      xs = [b for b in budgets if _at(c, b) is not None]
      if not xs or cell == "greedy":
        continue
      style = "--" if sel in ("majority", "pass@n") else "-"
      ys = [_at(c, b)[sel] for b in xs]
      mean = [y.mean if isinstance(y, Band) else y for y in ys]
      (line,) = ax.plot(xs, mean, style, marker="o", ms=3, label=title)
      if ys and isinstance(ys[0], Band):  # over seeds: the spread as a shaded band
        ax.fill_between(
          xs, [y.mean - y.sd for y in ys], [y.mean + y.sd for y in ys], color=line.get_color(), alpha=0.12
        )
    g = _at(per.get("greedy", {}), 1)
    if g is not None:
      ax.axhline(
        g["first"].mean if isinstance(g["first"], Band) else g["first"], color="k", lw=0.8, ls=":", label="Greedy"
      )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sampled trajectories per problem (B x N)")
    ax.set_ylabel("accuracy")
    ax.set_title(domain)
  axes[0][-1].legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
  fig.tight_layout()
  with atomic_open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=120)
