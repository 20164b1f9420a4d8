"""Results over seeds and the shipped bands (configs/bands/, docs/results.md): the mean and spread of every number of a job over build seeds, stored
as a band file, and a user's own single-seed numbers printed beside those bands.

A band is the 95% prediction interval of one more build, `mean +- t(0.975, n-1) * sd * sqrt(1 + 1/n)` (Student's t,
n seeds; for 3 seeds mean +- 4.97 sd), widened to the seeds' min..max. It answers the question a user's single run
asks: is this build one more draw of the spread the seeds showed? (`mean +- 2 sd` from 3 seeds is not that: a fourth
build of the same distribution falls outside it about one time in four, so a table of a hundred numbers always
showed some.) Numbers are flattened to dotted keys
(`methods.maxprob.arithmetic.pr_auc`, `groups.qa/line.step_error_rate`), so one file format serves the target
report, the ReProbe metrics and the test-time-scaling grid. Which config a band file belongs to, and a run's
numbers beside it, are the jobs' (`reprobe_jax.jobs.bands`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from reprobe_jax.errors import DataFormatError
from reprobe_jax.eval.tts_rows import budget_key
from reprobe_jax.eval.tts_rows import rows as tts_rows
from reprobe_jax.io.atomic import write_json
from reprobe_jax.io.readers import read_json


# Student's t 0.975 quantiles by degrees of freedom (the standard table); beyond 30 the normal's 1.96 is within 4%.
_T_975 = (
  12.7062,
  4.3027,
  3.1824,
  2.7764,
  2.5706,
  2.4469,
  2.3646,
  2.3060,
  2.2622,
  2.2281,
  2.2010,
  2.1788,
  2.1604,
  2.1448,
  2.1314,
  2.1199,
  2.1098,
  2.1009,
  2.0930,
  2.0860,
  2.0796,
  2.0739,
  2.0687,
  2.0639,
  2.0595,
  2.0555,
  2.0518,
  2.0484,
  2.0452,
  2.0423,
)


def t_975(df: int) -> float:
  """The 0.975 quantile of Student's t with `df` >= 1 degrees of freedom."""
  if df < 1:
    raise ValueError(f"degrees of freedom must be >= 1, found {df}")
  return _T_975[df - 1] if df <= len(_T_975) else 1.96


@dataclasses.dataclass(frozen=True)
class Band:
  """One number over seeds."""

  mean: float
  sd: float  # sample standard deviation (ddof=1); 0 for one seed
  min: float
  max: float
  n: int

  @property
  def half_width(self) -> float:
    """Half the 95% prediction interval of one more seed (0 for one seed)."""
    if self.n < 2:
      return 0.0
    return t_975(self.n - 1) * self.sd * math.sqrt(1.0 + 1.0 / self.n)

  @property
  def lo(self) -> float:
    return min(self.mean - self.half_width, self.min)

  @property
  def hi(self) -> float:
    return max(self.mean + self.half_width, self.max)

  def holds(self, value: float) -> bool:
    return self.lo <= value <= self.hi

  def __str__(self) -> str:
    return f"{self.mean:.3f} +- {self.sd:.3f}"


def summarise(values: Sequence[float]) -> Band:
  """The band of one number's values over seeds (NaN values are left out)."""
  v = np.asarray([x for x in values if x is not None and not math.isnan(x)], float)
  if v.size == 0:
    return Band(math.nan, math.nan, math.nan, math.nan, 0)
  return Band(float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0, float(v.min()), float(v.max()), int(v.size))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
  """Every number of a nested dict under its dotted key (booleans and strings left out)."""
  out = {}
  for k, v in tree.items():
    key = f"{prefix}.{k}" if prefix else str(k)
    if isinstance(v, Mapping):
      out.update(flatten(v, key))
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
      out[key] = float(v)
    elif isinstance(v, (list, tuple)) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
      out.update({f"{key}.{i}": float(x) for i, x in enumerate(v)})  # e.g. an interval: key.0, key.1
  return out


def over_seeds(results: Sequence[Mapping[str, Any]], keys: Sequence[str] | None = None) -> dict[str, Band]:
  """{dotted key: Band} over the results of several seeds (the keys of the first result, or `keys`)."""
  flat = [flatten(r) for r in results]
  names = list(keys) if keys is not None else list(flat[0]) if flat else []
  return {k: summarise([f.get(k, math.nan) for f in flat]) for k in names}


@dataclasses.dataclass(frozen=True)
class BandFile:
  """What a results table was made from: the job, its seeds, the machine, and the band of every number."""

  job: str
  seeds: tuple[int, ...]
  machine: str
  config_key: str  # hash of the job's config without its seed and workdir: a band applies only to that config
  bands: Mapping[str, Band]

  def save(self, path: str) -> None:
    write_json(
      path,
      {
        "job": self.job,
        "seeds": list(self.seeds),
        "machine": self.machine,
        "config_key": self.config_key,
        "bands": {k: dataclasses.asdict(b) for k, b in self.bands.items()},
      },
      indent=1,
    )

  @classmethod
  def load(cls, path: str) -> BandFile:
    d = read_json(path, "band file")
    try:
      bands = {
        k: Band(**{f: (float(b[f]) if f != "n" else int(b[f])) for f in ("mean", "sd", "min", "max", "n")})
        for k, b in d["bands"].items()
      }
      return cls(
        job=str(d["job"]),
        seeds=tuple(int(s) for s in d["seeds"]),
        machine=str(d["machine"]),
        config_key=str(d["config_key"]),
        bands=bands,
      )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
      raise DataFormatError(f"{path}: not a band file ({type(e).__name__}: {e})") from None


def _has_band(b: Band | None) -> bool:
  return b is not None and b.n > 0


def _cell_state(b: Band | None, v: float | None) -> bool | None:
  """Whether a run's value holds its band; None where there is no band or no value to compare."""
  if not _has_band(b) or v is None or math.isnan(v):
    return None
  return b.holds(v)


def grid_markdown(
  rows: Sequence[str],
  cols: Sequence[str],
  key: Callable[[str, str], str],
  bands: Mapping[str, Band],
  values: Mapping[str, float] | None = None,
  corner: str = "",
) -> str:
  """A Markdown grid whose cell (row, col) shows the band of `key(row, col)` as `mean +- sd`, or, given `values`
  (a single run's flattened numbers), that value beside its band, `value (mean +- sd)`, with `!` after a value
  outside the band. Cells without a band or a value are empty."""
  lines = [f"| {corner} | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
  for r in rows:
    cells = []
    for c in cols:
      k = key(r, c)
      b = bands.get(k)
      if values is None:
        cells.append(str(b) if _has_band(b) else "")
        continue
      v = values.get(k)
      state = _cell_state(b, v)
      if state is None:
        cells.append("" if v is None or math.isnan(v) else f"{v:.3f}")
      else:
        cells.append(f"{v:.3f}{'' if state else ' !'} ({b})")
    lines.append(f"| {r} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


TARGET_COLUMNS = (
  "step_error_rate",
  "aligned_error_rate",
  "confident_error_share",
  "final_accuracy",
  "mean_tokens",
  "recheck_after_answer_share",
)


def _grid_specs(result: Mapping[str, Any]) -> list[tuple[str, list[str], list[str], Callable[[str, str], str], str]]:
  """(title, rows, cols, key, corner) of each grid a job's result is shown in: the target report, the ReProbe
  PR-AUC grid and the test-time-scaling grid, rows and columns from `result` (one run's numbers)."""
  specs = []
  groups = list(result.get("target", {}).get("groups", {}))
  if groups:
    specs.append(
      (
        "Target model, its own samples on held-out problems:\n",
        groups,
        list(TARGET_COLUMNS),
        lambda r, c: f"target.groups.{r}.{c}",
        "family/format",
      )
    )
  reprobe = result.get("reprobe", {})
  methods, datasets = list(reprobe.get("methods", {})), list(reprobe.get("datasets", {}))
  if methods:
    means = {"ID mean": "id_mean_pr_auc", "OOD mean": "ood_mean_pr_auc", "overall": "overall_pr_auc"}

    def key(m, c):
      return f"reprobe.methods.{m}.{means[c]}" if c in means else f"reprobe.methods.{m}.{c}.pr_auc"

    specs.append(("Step-level PR-AUC (positive = incorrect step):\n", methods, datasets + list(means), key, "method"))
    specs.append(
      ("", ["incorrect share"], datasets, lambda r, c: f"reprobe.datasets.{c}.incorrect_share", "test steps")
    )
  tts = result.get("tts", {})
  if tts.get("results"):  # the test-time-scaling grid at its largest budget, one column per domain
    results, top = tts["results"], max(tts["config"]["budgets"])
    domains = list(results)
    titled = {title: (cell, sel) for title, cell, sel in tts_rows(results[domains[0]])}

    def tts_key(r, d):
      cell, sel = titled[r]
      return f"tts.results.{d}.{cell}.{budget_key(results[d].get(cell, {}), top)}.{sel}"

    specs.append((f"Test-time scaling, accuracy at N = {top}:\n", list(titled), domains, tts_key, "method"))
  return specs


def grids(result: Mapping[str, Any], bands: Mapping[str, Band], values: Mapping[str, float] | None) -> str:
  """The target report, ReProbe PR-AUC and test-time-scaling grids, each cell a band (or, given `values`, a value
  beside it)."""
  out = []
  for title, rows, cols, key, corner in _grid_specs(result):
    if title:
      out.append(title)
    out.append(grid_markdown(rows, cols, key, bands, values, corner))
  return "\n".join(out)


def outside(result: Mapping[str, Any], bands: Mapping[str, Band]) -> tuple[list[str], int]:
  """(keys of the shown numbers outside their band, how many shown numbers have a band): the count of `!` in the
  grids `beside_bands` prints."""
  values, out, n = flatten(result), [], 0
  for _, rows, cols, key, _ in _grid_specs(result):
    for r in rows:
      for c in cols:
        k = key(r, c)
        state = _cell_state(bands.get(k), values.get(k))
        if state is None:
          continue
        n += 1
        if not state:
          out.append(k)
  return out, n


def summary_markdown(band_file: BandFile, example: Mapping[str, Any]) -> str:
  """The results tables: every number of the job as `mean +- sd` over the band file's seeds, with the machine."""
  return (
    f"Mean +- standard deviation over seeds {', '.join(map(str, band_file.seeds))} (config "
    f"{band_file.config_key}), on {band_file.machine}.\n\n" + grids(example, band_file.bands, None)
  )


def welch_t(a: Band, b: Band) -> float:
  """Welch's t of two bands' means (b minus a); +-inf where both have no spread and the means differ."""
  se = math.sqrt(a.sd**2 / a.n + b.sd**2 / b.n)
  d = b.mean - a.mean
  if se > 0:
    return d / se
  return 0.0 if d == 0 else math.copysign(math.inf, d)


def shared_keys(a: BandFile, b: BandFile) -> list[str]:
  """The numbers two band files can be compared on: in both, with at least two seeds on each side."""
  return [k for k in a.bands if k in b.bands and a.bands[k].n > 1 and b.bands[k].n > 1]


def differing(a: BandFile, b: BandFile, limit: float | None = None) -> list[tuple[str, float]]:
  """The numbers whose means differ between two band files (say two machines' seeds) by more than Welch's |t| of
  `limit`, default t(0.975, min(n) - 1): (key, t), largest |t| first. Numbers with fewer than two seeds on either
  side are left out."""
  keys = shared_keys(a, b)
  if not keys:
    raise DataFormatError("the two band files share no number with at least two seeds on both sides")
  limit = t_975(min(min(a.bands[k].n, b.bands[k].n) for k in keys) - 1) if limit is None else limit
  out = [(k, welch_t(a.bands[k], b.bands[k])) for k in keys]
  return sorted([(k, t) for k, t in out if abs(t) > limit], key=lambda kt: -abs(kt[1]))


def is_timing(key: str) -> bool:
  """Whether a flattened band key is a stage time (a `timings_s` entry) rather than a result."""
  return "timings_s" in key.split(".")
