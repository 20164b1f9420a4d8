"""Results over seeds and the README's bands: the mean and spread of every number of a job over build seeds, stored
as a band file, and a user's own single-seed numbers printed beside those bands.

A band is `mean +- 2 sd` over the seeds, widened to their min..max: with 3 seeds the standard deviation is itself
uncertain, so the band never excludes a value a seed actually gave. Numbers are flattened to dotted keys
(`methods.maxprob.arithmetic.pr_auc`, `groups.qa/line.step_error_rate`), so one file format serves the target
report and the ReProbe metrics.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from reprobe_jax.errors import DataFormatError
from reprobe_jax.readers import read_json
from reprobe_jax.runs import write_json


@dataclasses.dataclass(frozen=True)
class Band:
  """One number over seeds."""
  mean: float
  sd: float    # sample standard deviation (ddof=1); 0 for one seed
  min: float
  max: float
  n: int

  @property
  def lo(self) -> float:
    return min(self.mean - 2 * self.sd, self.min)

  @property
  def hi(self) -> float:
    return max(self.mean + 2 * self.sd, self.max)

  def holds(self, value: float) -> bool:
    return self.lo <= value <= self.hi

  def __str__(self) -> str:
    return f"{self.mean:.3f} +- {self.sd:.3f}"


def summarise(values: Sequence[float]) -> Band:
  """The band of one number's values over seeds (NaN values are left out)."""
  v = np.asarray([x for x in values if x is not None and not math.isnan(x)], float)
  if v.size == 0:
    return Band(math.nan, math.nan, math.nan, math.nan, 0)
  return Band(float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0, float(v.min()), float(v.max()),
              int(v.size))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
  """Every number of a nested dict under its dotted key (booleans and strings left out)."""
  out = {}
  for k, v in tree.items():
    key = f"{prefix}.{k}" if prefix else str(k)
    if isinstance(v, Mapping):
      out.update(flatten(v, key))
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
      out[key] = float(v)
  return out


def over_seeds(results: Sequence[Mapping[str, Any]], keys: Sequence[str] | None = None) -> dict[str, Band]:
  """{dotted key: Band} over the results of several seeds (the keys of the first result, or `keys`)."""
  flat = [flatten(r) for r in results]
  names = list(keys) if keys is not None else list(flat[0]) if flat else []
  return {k: summarise([f.get(k, math.nan) for f in flat]) for k in names}


@dataclasses.dataclass(frozen=True)
class BandFile:
  """What a README table was made from: the job, its seeds, the machine, and the band of every number."""
  job: str
  seeds: tuple[int, ...]
  machine: str
  bands: Mapping[str, Band]

  def save(self, path: str) -> None:
    write_json(path, {"job": self.job, "seeds": list(self.seeds), "machine": self.machine,
                      "bands": {k: dataclasses.asdict(b) for k, b in self.bands.items()}}, indent=1)

  @classmethod
  def load(cls, path: str) -> BandFile:
    d = read_json(path, "band file")
    try:
      bands = {k: Band(**{f: (float(b[f]) if f != "n" else int(b[f])) for f in ("mean", "sd", "min", "max", "n")})
               for k, b in d["bands"].items()}
      return cls(job=str(d["job"]), seeds=tuple(int(s) for s in d["seeds"]), machine=str(d["machine"]),
                 bands=bands)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
      raise DataFormatError(f"{path}: not a band file ({type(e).__name__}: {e})") from None


def comparison_markdown(values: Mapping[str, float], bands: BandFile, keys: Sequence[str],
                        label: str = "value") -> str:
  """A table of the user's `values` beside the stored bands for `keys` (dotted), marking each outside one."""
  lines = [f"| number | {label} | band (mean +- sd over seeds {', '.join(map(str, bands.seeds))}) | range | |",
           "|---|---|---|---|---|"]
  for k in keys:
    b = bands.bands.get(k)
    v = values.get(k, math.nan)
    if b is None:
      lines.append(f"| {k} | {v:.3f} | (no band) | | |")
      continue
    mark = "" if math.isnan(v) else ("inside" if b.holds(v) else "**outside**")
    lines.append(f"| {k} | {v:.3f} | {b} | {b.lo:.3f}..{b.hi:.3f} | {mark} |")
  return "\n".join(lines) + f"\n\nBands measured on {bands.machine}.\n"
