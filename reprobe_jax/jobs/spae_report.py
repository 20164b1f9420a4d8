"""The SPAE job's numbers over seeds: mean +- sd of each group's plain and truncated decoding."""

from __future__ import annotations

import math
from typing import Sequence

from reprobe_jax.errors import ConfigError
from reprobe_jax.eval.bands import summarise

COLUMNS = (
  ("acc_at_k", "Acc@k", 100.0, ".1f"),
  ("len_at_k", "Len@k", 1.0, ".1f"),
  ("solving_tokens", "solving", 1.0, ".1f"),
  ("checking_tokens", "checking", 1.0, ".1f"),
  ("r2w", "R2W (%)", 100.0, ".1f"),
  ("saturated_share", "saturated (%)", 100.0, ".1f"),
  ("reflect_steps", "reflect steps", 1.0, ".2f"),
  ("oracle_agreement", "oracle agreement (%)", 100.0, ".1f"),
)


def _value(x) -> float:
  return math.nan if x is None else float(x)


def seeds_markdown(per_seed: Sequence[dict]) -> str:
  """Rows (group, mode), cells mean +- sd over the seeds' metrics.json dicts (`jobs.spae.evaluate`'s result)."""
  if not per_seed:
    raise ConfigError("seeds_markdown: no seed's metrics to summarise")
  first = per_seed[0]
  missing = [
    (i, g, m)
    for i, r in enumerate(per_seed)
    for g, ms in first["groups"].items()
    for m in ms
    if m in ("plain", "truncated") and m not in r.get("groups", {}).get(g, {})
  ]
  if missing:
    i, g, m = missing[0]
    raise ConfigError(f"seeds_markdown: seed {i}'s metrics have no {g} {m} decoding, seed 0's do")
  head = ["group", "decoding"] + [name for _, name, _, _ in COLUMNS]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for group, modes in first["groups"].items():
    for mode in ("plain", "truncated"):
      if mode not in modes:
        continue
      cells = [group.replace("_", " "), mode]
      for key, _, scale, fmt in COLUMNS:
        band = summarise([scale * _value(r["groups"][group][mode][key]) for r in per_seed])
        cells.append("n/a" if math.isnan(band.mean) else f"{band.mean:{fmt}} +- {band.sd:{fmt}}")
      lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + f"\n\n(mean +- sd over {len(per_seed)} seeds)\n"
