"""Evaluation entry point: `python eval.py --config=configs/<job>.py [--config.a.b=value ...]`.

Jobs: reprobe (PR-AUC of the probes against the uncertainty baselines, and against the PRM baseline trained here
when `config.prm.enabled`; trains whatever is missing first; prints the numbers beside the shipped bands when the
config is the one they were made with), seeds (the reprobe job once per `config.seeds`, then every number's mean
and spread over seeds: `<workdir>/seeds/<key>/summary.md` and the band file `bands.json` beside it, the key the
config's and the seeds'), tts (test-time scaling: greedy, votes, Best-of-N, beam search and DVTS with each step
scorer at equal budgets; configs/tts_synthetic.py; prints its numbers beside the shipped bands when the config is
the one they were made with), tts_seeds (the tts job once per `config.seeds`, then mean +- sd:
`<workdir>/tts_seeds/<key>/summary.md` and the band file `bands.json`).
"""

from __future__ import annotations

import os

import jax
from absl import app
from ml_collections import config_flags

from reprobe_jax.eval.bands import BandFile, over_seeds, summary_markdown
from reprobe_jax.eval.machine import describe
from reprobe_jax.eval.report import table_markdown
from reprobe_jax.fields import plain
from reprobe_jax.io.atomic import atomic_open, write_json
from reprobe_jax.jobs import reprobe, spae, spae_report, tts, tts_report
from reprobe_jax.jobs.bands import band_key, beside_bands, check_seeds
from reprobe_jax.jobs.cli import (
  ProgressBars,
  build_target,
  job_section,
  parse_flags,
  reprobe_setup,
  run_job,
  target_report,
  workdir_of,
)
from reprobe_jax.jobs.reprobe_config import config_from_dict, prm_config_from_dict
from reprobe_jax.jobs.reprobe_reader import first_error_markdown
from reprobe_jax.jobs.runs import run_key
from reprobe_jax.jobs.tts_config import check_prm, grid_domains, tts_config_from_dict

_CONFIG = config_flags.DEFINE_config_file("config", "configs/reprobe_synthetic.py", "Job configuration.")


def _evaluate(config):
  """(metrics, target report or None, run folder) of one reprobe run."""
  prm = prm_config_from_dict(config.get("prm"))  # checked before the target is built
  lm, cfg, workdir = reprobe_setup(config)
  with ProgressBars() as bars:
    metrics = reprobe.evaluate(lm, cfg, workdir, prm=prm, progress=bars.update)
  return metrics, target_report(config), workdir


def run_reprobe(config) -> None:
  metrics, report, workdir = _evaluate(config)
  print("\nStep-level PR-AUC (positive = incorrect step):\n")
  print(table_markdown(metrics))
  if "outcome" in metrics:  # a data file: how often the target's final answer is right
    o = metrics["outcome"]
    print(f"Outcome accuracy: {o['accuracy']:.3f} ({o['trajectories']} test trajectories with a known outcome)")
  if "first_error" in metrics:  # reader mode: ProcessBench's first-error F1 (threshold chosen on val)
    print("\n" + first_error_markdown(metrics["first_error"]))
  timings = metrics.get("timings_s", {})
  if timings:
    print("Stage times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
  print(f"Wrote {os.path.join(workdir, 'metrics.json')}, table.md, pr_curves.png; TensorBoard: {workdir}/probe")
  if "prm_training" in metrics:
    t = metrics["prm_training"]
    print(
      f"PRM baseline: {workdir}/{t['folder']} ({t['epochs']} epochs, best val PR-AUC {t['best_val_pr_auc']:.3f}; "
      "step_scores.npz holds the val and test step scores of the PRM and the probes)"
    )
    with open(os.path.join(workdir, "table.md")) as f:  # the cascade table follows the PR-AUC table there
      table = f.read()
    if "Cascade from" in table:
      print("\n" + table[table.index("Cascade from") :] + f"(plot: {workdir}/cascade.png)")
  print(beside_bands(config, {"reprobe": metrics, "target": report or {}}, machine=metrics["machine"]))


def _per_seed(config, seeds):
  """The config once per build seed (the built-in target's seed follows it), announcing each. Between seeds the
  compiled programs of the previous seed's model are dropped (`jax.clear_caches`): each seed builds its own model
  and samplers, and a process that kept them all ran out of memory maps in LLVM (vm.max_map_count) in the third
  seed of the SPAE job."""
  for i, seed in enumerate(seeds):
    if i:
      jax.clear_caches()
    one = config.copy_and_resolve_references()
    one.seed = seed
    if "target" in one and not isinstance(one.target, str):  # the built-in target's build section
      one.target.seed = seed
    print(f"\n=== seed {seed} ===")
    yield one


def run_seeds(config) -> None:
  seeds = check_seeds(config.get("seeds"))
  out = os.path.join(workdir_of(config), "seeds", run_key({"config": band_key(config), "seeds": seeds}))
  results = []
  for one in _per_seed(config, seeds):
    metrics, report, _ = _evaluate(one)
    results.append({"reprobe": metrics, "target": report or {}})
  band_file = BandFile(
    job="reprobe", seeds=seeds, machine=str(describe()), config_key=band_key(config), bands=over_seeds(results)
  )
  summary = summary_markdown(band_file, results[0])
  band_file.save(os.path.join(out, "bands.json"))
  with atomic_open(os.path.join(out, "summary.md")) as f:
    f.write(summary)
  print("\n" + summary)
  shipped = f" (copy it to {config.bands} to make it the shipped bands)" if config.get("bands") else ""
  print(f"Wrote {out}/summary.md and {out}/bands.json{shipped}")


def run_tts(config) -> None:
  tcfg = tts_config_from_dict(config.get("tts", {}))
  prm = prm_config_from_dict(config.get("prm"))
  check_prm(tcfg, prm)  # before the target is built
  grid_domains(config_from_dict(config), tcfg)  # 'math' without a data file, a domain the split lacks
  lm, cfg, workdir = reprobe_setup(config)
  with ProgressBars() as bars:
    metrics = tts.evaluate(lm, cfg, tcfg, workdir, prm=prm, progress=bars.update)
  print("\nTest-time scaling (accuracy; the step scorer after the comma):\n")
  print(tts_report.table_markdown(metrics))
  print(
    f"Wrote {metrics['directory']}/metrics.json, table.md, accuracy.png"
    + (", cascade.png" if "cascade" in metrics else "")
  )
  print(beside_bands(config, {"tts": metrics}, machine=metrics["machine"]))


def run_tts_seeds(config) -> None:
  """The tts job once per config.seeds (each seed its own target, probes and samples), then mean +- sd."""
  seeds = check_seeds(config.get("seeds"))
  tcfg = tts_config_from_dict(config.get("tts", {}))
  prm = prm_config_from_dict(config.get("prm"))
  check_prm(tcfg, prm)
  per_seed = []
  for one in _per_seed(config, seeds):
    lm, cfg, workdir = reprobe_setup(one)
    with ProgressBars() as bars:
      metrics = tts.evaluate(lm, cfg, tcfg, workdir, prm=prm, progress=bars.update)
    per_seed.append({k: v for k, v in metrics.items() if k != "directory"})
  merged = tts_report.over_seeds(per_seed)
  # the whole config's key (the world and the ReProbe settings too, not only the grid): each world's seeds apart
  out = os.path.join(workdir_of(config), "tts_seeds", run_key({"config": band_key(config), "seeds": seeds}))
  os.makedirs(out, exist_ok=True)
  table = tts_report.table_markdown(merged)
  write_json(os.path.join(out, "per_seed.json"), per_seed)
  bands = over_seeds([{"tts": m} for m in per_seed])
  BandFile(job="tts", seeds=seeds, machine=str(describe()), config_key=band_key(config), bands=bands).save(
    os.path.join(out, "bands.json")
  )
  with atomic_open(os.path.join(out, "summary.md")) as f:
    f.write(table)
  tts_report.plot_budgets(merged, os.path.join(out, "accuracy.png"))
  if "cascade" in merged:
    tts_report.plot_cascade(merged, os.path.join(out, "cascade.png"))
  print("\n" + table)
  shipped = f" (copy it to {config.bands} to make it the shipped bands)" if config.get("bands") else ""
  print(f"Wrote {out}/summary.md, per_seed.json, accuracy.png, bands.json{shipped}")


def _spae_once(config) -> dict:
  jcfg = job_section(config, "spae", spae.job_config_from_dict, ("seed", "data"))  # config.seed, config.data
  pcfg = spae.probe_config_from_dict(config.get("probe", {}))
  lm = build_target(config)  # every field above is checked before the target is built
  with ProgressBars() as bars:
    result = spae.evaluate(lm, jcfg, pcfg, workdir_of(config), progress=bars.update)
  with open(os.path.join(result["directory"], "table.md")) as f:
    print("\n" + f.read())
  print(f"Wrote {result['directory']}/metrics.json, table.md, curves_*.png, displacement_*.png")
  return result


def run_spae(config) -> None:
  """SPAE's step potential on thinking trajectories: oracle agreement, plain against probe-truncated decoding."""
  _spae_once(config)


def run_spae_seeds(config) -> None:
  """The spae job once per config.seeds (each seed its own built-in target and problems), then mean +- sd."""
  seeds = check_seeds(config.get("seeds"))
  per_seed = [{k: v for k, v in _spae_once(one).items() if k != "directory"} for one in _per_seed(config, seeds)]
  out = os.path.join(
    workdir_of(config),
    "spae_seeds",
    run_key({"spae": plain(config.get("spae", {})), "probe": plain(config.get("probe", {})), "seeds": seeds}),
  )
  os.makedirs(out, exist_ok=True)
  table = spae_report.seeds_markdown(per_seed)
  write_json(os.path.join(out, "per_seed.json"), per_seed)
  with atomic_open(os.path.join(out, "summary.md")) as f:
    f.write(table)
  print("\n" + table)
  print(f"Wrote {out}/summary.md, per_seed.json")


def main(argv):
  del argv
  run_job(
    _CONFIG.value,
    {
      "reprobe": run_reprobe,
      "seeds": run_seeds,
      "tts": run_tts,
      "tts_seeds": run_tts_seeds,
      "spae": run_spae,
      "spae_seeds": run_spae_seeds,
    },
  )


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
