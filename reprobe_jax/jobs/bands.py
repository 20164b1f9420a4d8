"""The shipped bands (configs/bands/, docs/results.md) seen from a job's config: which config a band file belongs to (`band_key`), the seeds a seeds
job runs (`check_seeds`), a single run's numbers printed beside the bands (`beside_bands`), and
`python -m reprobe_jax.jobs.bands A.json B.json` (which numbers of two band files differ beyond their seed spread).
The band math itself (Band, over_seeds, BandFile, the grids) is `reprobe_jax.eval.bands`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Mapping, Sequence

from reprobe_jax.errors import ConfigError
from reprobe_jax.eval.bands import BandFile, differing, flatten, grids, is_timing, outside, shared_keys
from reprobe_jax.fields import SEED, plain
from reprobe_jax.jobs.runs import run_key
from reprobe_jax.jobs.target_config import config_from_dict, keyed_fields


def check_seeds(seeds) -> tuple[int, ...]:
  """`config.seeds` as a tuple: at least two distinct seeds (`fields.SEED`; ConfigError naming it otherwise)."""
  ok = (
    isinstance(seeds, (tuple, list))
    and len(seeds) >= 2
    and all(SEED.ok(x) for x in seeds)
    and len(set(seeds)) == len(seeds)
  )
  if not ok:
    raise ConfigError(f"config.seeds: expected two or more distinct seeds, each {SEED}, got {seeds!r}")
  return tuple(int(x) for x in seeds)


# What changes per run, or names band files, not what the bands depend on.
_RUN_ONLY = ("job", "workdir", "seed", "seeds", "bands", "machine_bands")


def band_key(config) -> str:
  """Hash of a job config without its seed, workdir and the CLI's own fields: bands apply to exactly this config."""
  d = plain(config)
  for k in _RUN_ONLY:
    d.pop(k, None)
  extra = []
  if d.get("target_path"):  # a pretrained target: the built-in target's build section (its world too) is unused
    d.pop("target", None)
  elif isinstance(d.get("target"), Mapping):
    d["target"] = keyed_fields({k: v for k, v in d["target"].items() if k not in _RUN_ONLY})
    # the built-in target's build key also hashes what the task code makes
    extra.append(config_from_dict(dict(d["target"], seed=0), "config.target").key())
  return run_key(d, *extra)


def beside_bands(config, result: Mapping[str, Any], *, machine: str) -> str:
  """A single run's numbers beside the shipped bands (`config.bands`), or a line saying why they are not
  compared: no band file, or bands made with another config. Where `config.machine_bands` holds a band file made on
  this run's machine kind (the same `machine` line) for this config, a line after it says how many numbers fall
  outside those bands: the build repeats on one CPU kind, so there it should be none."""
  path = config.get("bands") if hasattr(config, "get") else None
  if not path:
    return ""
  if not isinstance(path, str) or not os.path.exists(path):
    return f"(No band file at {path!r}: `--config.job=seeds` makes one.)"
  band_file = BandFile.load(path)
  key = band_key(config)
  if band_file.config_key != key:
    return (
      f"(The bands in {path} were made with another config ({band_file.config_key}, this one {key}); not compared.)"
    )
  out = (
    f"\nThis run ({machine}) beside the shipped bands (mean +- sd over seeds "
    f"{', '.join(map(str, band_file.seeds))} on {band_file.machine}; '!' = outside the 95% prediction interval "
    f"of one more seed and the seeds' range):\n\n" + grids(result, band_file.bands, flatten(result))
  )
  for other in config.get("machine_bands", ()) or ():
    if not os.path.exists(other):
      continue
    own = BandFile.load(other)
    if own.machine != machine or own.config_key != key:
      continue
    flagged, n = outside(result, own.bands)
    out += (
      f"\nBeside the bands made on this machine kind ({other}, seeds {', '.join(map(str, own.seeds))} on "
      f"{own.machine}): {len(flagged)} of {n} numbers outside" + (": " + ", ".join(flagged) if flagged else "") + ".\n"
    )
  return out


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m reprobe_jax.jobs.bands A.json B.json`: which numbers of two band files differ beyond their seed
  spread."""
  p = argparse.ArgumentParser(prog="python -m reprobe_jax.jobs.bands", description=main.__doc__)
  p.add_argument("a")
  p.add_argument("b")
  p.add_argument(
    "--limit", type=float, default=None, help="Welch |t| above which a number differs (default t(0.975, seeds - 1))"
  )
  args = p.parse_args(argv)
  a, b = BandFile.load(args.a), BandFile.load(args.b)
  diff = differing(a, b, args.limit)
  shared = shared_keys(a, b)
  print(f"A = {a.machine} (seeds {list(a.seeds)}), B = {b.machine} (seeds {list(b.seeds)})")
  # Stage times say how fast the machine is, not what it computed: counted and listed apart from the results.
  for label, part in (("results", False), ("stage times", True)):
    rows = [(k, t) for k, t in diff if is_timing(k) == part]
    n = sum(1 for k in shared if is_timing(k) == part)
    if not n:
      continue
    print(f"\n{len(rows)} of {n} {label} differ")
    if rows:
      print("| number | A | B | Welch t |\n|---|---|---|---|")
    for k, t in rows:
      print(f"| {k} | {a.bands[k]} | {b.bands[k]} | {t:.2f} |")


if __name__ == "__main__":
  main()
