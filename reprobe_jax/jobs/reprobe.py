"""The ReProbe job (docs/method.md §A1-§A7): problems -> trajectories -> step labels (rule, self-judge, API judge or
imported) -> features -> probes -> PR-AUC against uncertainty baselines (and the PRM, when asked), trained in domain
(arithmetic) and tested in and out of domain (planning, QA), as the paper does. On the user's data file
(`config.data`, docs/own-data.md) the problems are its splits (domain 'math') and the report adds the outcome
accuracy; on a step-labelled file (ProcessBench, PRM800K: reader mode) the target is teacher-forced over the given
steps instead of sampling, their labels imported, and the report adds ProcessBench's first-error F1.

The job is a graph of stages (`graph.Graph`), read top to bottom below: each is a function of the job's inputs
(`ReprobeJob`) and of the typed results of the stages it names, and a run (`start`) computes each at most once.
Every stage writes its artifact under the run folder and is skipped when that artifact exists, so a rerun reuses
work and an interrupted run resumes (feature extraction and probe training resume mid-way). Artifacts:
  samples_<split>.jsonl        the sampled trajectories (reprobe_jax.trajectories schema), before labels (reader
                               mode: the teacher-forced solutions, labelled from the file)
  trajectories_<split>.jsonl   the same, labelled by `config.annotator`
  features/<set>/              feature shards and manifest;  probe/<set>/  checkpoints, history, TensorBoard
  prm/<key>/                   the PRM baseline trained here, when asked (`prm_folder`; reprobe_jax.prm.train's
                               layout, plus step_scores.npz: the val and test step scores of the PRM and the probes)
  metrics.json, table.md, pr_curves.png, timings.json; with the PRM also cascade.png (reprobe_jax.prm.report);
  metrics.json's 'outcome' on a data file, 'first_error' (and its table in table.md) in reader mode
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

from reprobe_jax.annotate import annotate
from reprobe_jax.errors import ConfigError
from reprobe_jax.eval.machine import describe
from reprobe_jax.eval.report import plot_pr_curves, scorer_metrics, table_markdown
from reprobe_jax.features import FeatureStore, extract
from reprobe_jax.io.atomic import atomic_open, write_json, write_jsonl
from reprobe_jax.jobs.graph import Graph, GraphRun, Stage
from reprobe_jax.jobs.reprobe_config import (
  ReprobeConfig,
  Splits,
  check_probe_spec,
  check_target,
  feature_specs,
  prm_folder,
  split_problems,
)
from reprobe_jax.jobs.reprobe_reader import (
  first_error_markdown,
  first_errors,
  given,
  outcomes,
  solutions,
  teacher_forced,
)
from reprobe_jax.jobs.reprobe_records import (
  LABELLED,
  PRM_ID,
  PRMComparison,
  ReprobeJob,
  ScorerId,
  TestScores,
  TrainedPRM,
  TrainedProbe,
)
from reprobe_jax.jobs.reprobe_scores import (
  baseline_scores,
  probe_scores,
  prm_step_scores,
  test_steps,
  val_scores,
  write_step_scores,
)
from reprobe_jax.jobs.runs import Progress, Run, no_progress
from reprobe_jax.models import LanguageModel
from reprobe_jax.prm import report as prm_report
from reprobe_jax.prm.combine import plot_cascade
from reprobe_jax.prm.train import MODEL as PRM_MODEL
from reprobe_jax.prm.train import PRMTrainConfig, check_separator_for, train_prm
from reprobe_jax.prm.train import history as prm_history
from reprobe_jax.probe import ProbeConfig
from reprobe_jax.probe.bundle import ProbeBundle
from reprobe_jax.probe.data import examples
from reprobe_jax.probe.train import train_probe
from reprobe_jax.tasks import Problem
from reprobe_jax.tasks.dataset_records import LabelledSolution
from reprobe_jax.trajectories import Trajectory, read_trajectories, sample_trajectories


def problems(job: ReprobeJob) -> Splits[Problem]:
  """The problems of every split (`split_problems`)."""
  return split_problems(job.cfg)


def samples(
  job: ReprobeJob, problems: Splits[Problem], solutions: Splits[LabelledSolution] | None
) -> Splits[Trajectory] | None:
  """Every split's sampled trajectories, unlabelled (`samples_<split>.jsonl`); the features of every feature set
  are captured while sampling and go straight into their stores (no second forward). In reader mode the given
  solutions teacher-forced instead (`read_solutions`), labelled from the file. None when the labelled
  trajectories exist already: there is nothing left to label."""
  cfg, run, lm = job.cfg, job.run, job.lm
  if run.sealed(*LABELLED):
    return None
  if solutions is not None:
    return teacher_forced(job, problems, solutions)
  specs = feature_specs(cfg)

  def store(batch, feats):  # features captured while sampling go straight into the stores: no second forward
    for spec in specs:
      extract(
        lm, batch, spec, run.path("features", spec.name), shard_size=max(len(batch), 1), captured=feats[spec.name]
      )

  def one(split: str, ps: list[Problem]) -> list[Trajectory]:
    name, done = f"samples_{split}.jsonl", 0

    def on_batch(n):
      nonlocal done
      done += n
      job.tick(f"sample {split}", done, len(ps))

    run.stage(
      f"sample_{split}",
      [name],
      lambda: write_jsonl(
        run.path(name),
        sample_trajectories(
          lm, ps, cfg.mode, cfg.trajectories, on_batch=on_batch, feature_specs=specs, on_features=store
        ),
        seal=True,
      ),
    )
    return read_trajectories(run.path(name), sealed=True)

  return Splits(*(one(split, ps) for split, ps in problems.items()))


def trajectories(job: ReprobeJob, problems: Splits[Problem], samples: Splits[Trajectory] | None) -> Splits[Trajectory]:
  """Every split's labelled trajectories (`trajectories_<split>.jsonl`): the samples of all splits labelled in one
  annotator call (a judge batches its prompts; an imported file must cover every trajectory); in reader mode the
  samples as they are (labelled from the file; no annotator runs)."""
  cfg, run = job.cfg, job.run
  if samples is not None and cfg.reader_mode:
    given(job, samples)
  elif samples is not None:

    def label():
      every = [t for split in samples for t in split]
      job.tick(f"annotate ({cfg.annotator})", 0, len(every))
      out = annotate(every, {p.id: p for ps in problems for p in ps}, cfg.annotator, cfg.judge, cfg.labels_path, job.lm)
      start = 0
      for name, split in zip(LABELLED, samples):
        write_jsonl(run.path(name), out[start : start + len(split)], seal=True)
        start += len(split)
      job.tick(f"annotate ({cfg.annotator})", len(every), len(every))

    run.stage("annotate", list(LABELLED), label)
  return Splits(*(read_trajectories(run.path(name), sealed=True) for name in LABELLED))


def features(job: ReprobeJob, trajectories: Splits[Trajectory]) -> dict[str, FeatureStore]:
  """{feature set: its store} over every trajectory of every split (those captured while sampling are there
  already; the rest, e.g. imported trajectories, are run through the target)."""
  run = job.run
  every = [t for split in trajectories for t in split]
  stores = {}
  for spec in feature_specs(job.cfg):
    name = spec.name
    with run.timed(f"features_{name}", record=not run.exists(f"features/{name}/manifest.json")):
      stores[name] = extract(
        job.lm,
        every,
        spec,
        run.path("features", name),
        on_shard=lambda k, n, name=name: job.tick(f"features {name}", k, n),
      )
    if stores[name].manifest["model_fingerprint"] != job.fingerprint:
      raise ConfigError(f"features {name} were made by another model")
  return stores


def probes(
  job: ReprobeJob, trajectories: Splits[Trajectory], features: dict[str, FeatureStore]
) -> dict[str, TrainedProbe]:
  """One probe per feature set, trained on the train split and early-stopped on val (docs/method.md §A5)."""
  cfg, run = job.cfg, job.run
  specs = {s.name: s for s in feature_specs(cfg)}
  out = {}
  for name, store in features.items():
    train_ex, val_ex = examples(trajectories.train, store), examples(trajectories.val, store)
    pcfg = ProbeConfig(feature_dim=store.dim, **dataclasses.asdict(cfg.probe))
    pdir = run.path("probe", name)
    check_probe_spec(
      pdir,
      {
        "probe": dataclasses.asdict(pcfg),
        "features": store.manifest["spec"],
        "model_fingerprint": store.manifest["model_fingerprint"],
      },
    )
    with run.timed(f"probe_{name}", record=not os.path.exists(os.path.join(pdir, "history.json"))):
      graphdef, params, rest, history = train_probe(
        pcfg,
        train_ex,
        val_ex,
        cfg.train,
        pdir,
        on_epoch=lambda e, entry, name=name: job.tick(
          f"probe {name} (val PR-AUC {entry['val_pr_auc']:.3f})", e + 1, cfg.train.epochs
        ),
      )
    out[name] = TrainedProbe(
      name, pcfg, graphdef, params, rest, history, ProbeBundle.create(pcfg, params, specs[name], job.fingerprint)
    )
  return out


def prm(job: ReprobeJob, trajectories: Splits[Trajectory]) -> TrainedPRM | None:
  """The PRM baseline (docs/method.md §A7) trained on the train split, early-stopped on val, in
  `prm_folder(run, config)`: reused when finished, resumed when interrupted. None when the job has no PRM."""
  if job.prm is None:
    return None
  run, prm_cfg = job.run, job.prm
  folder = prm_folder(run.directory, prm_cfg)
  made: dict[str, TrainedPRM] = {}

  def train(on_epoch=None) -> TrainedPRM:
    return TrainedPRM(
      prm_cfg, folder, train_prm(job.lm, prm_cfg, trajectories.train, trajectories.val, folder, on_epoch=on_epoch)
    )

  def make():
    made["prm"] = train(lambda e, entry: job.tick(f"prm (val PR-AUC {entry['val_pr_auc']:.3f})", e + 1, prm_cfg.epochs))

  run.stage("prm", [os.path.relpath(os.path.join(folder, PRM_MODEL, "config.json"), run.directory)], make)
  return made["prm"] if "prm" in made else train()  # a finished folder: loaded


def scores(
  job: ReprobeJob, trajectories: Splits[Trajectory], features: dict[str, FeatureStore], probes: dict[str, TrainedProbe]
) -> TestScores:
  """Every test step's labels, and its scores by the uncertainty baselines, the probes and their linear
  baselines."""
  by_scorer = baseline_scores(job.cfg, trajectories.test)
  by_scorer.update(probe_scores(job.cfg, trajectories, features, probes))
  return TestScores(test_steps(job.cfg, trajectories.test), by_scorer)


def prm_comparison(
  job: ReprobeJob,
  trajectories: Splits[Trajectory],
  features: dict[str, FeatureStore],
  probes: dict[str, TrainedProbe],
  prm: TrainedPRM | None,
  scores: TestScores,
) -> PRMComparison | None:
  """With the PRM: its val and test step scores and every probe's go to `<prm folder>/step_scores.npz`
  (`write_step_scores`), and from them (`prm.report.combine`) the 'fusion[<set>]' scores (fitted on val) and the
  cascade. None without the PRM."""
  if prm is None:
    return None
  cfg = job.cfg
  test_prm = prm_step_scores(cfg, prm, trajectories.test)
  val = val_scores(cfg, prm, trajectories, features, probes)
  test = {**{sid: per for sid, per in scores.scores.items() if sid in val}, PRM_ID: test_prm}
  step_file = os.path.join(prm.folder, "step_scores.npz")
  write_step_scores(
    step_file,
    trajectories.val,
    {str(k): v for k, v in val.items()},
    trajectories.test,
    cfg.domains,
    {str(k): v for k, v in test.items()},
  )
  # Fusion (fitted on val) and the cascade (from the probe best on val) read the stored scores back.
  combined = prm_report.combine(prm_report.read_step_scores(step_file), cfg.domains)
  fusion = {ScorerId.parse(name): per for name, per in combined.fusion_scores.items()}
  return PRMComparison(prm, step_file, {PRM_ID: test_prm, **fusion}, combined)


def report(
  job: ReprobeJob,
  scores: TestScores,
  comparison: PRMComparison | None,
  outcomes: dict | None,
  first_errors: dict[str, dict] | None,
) -> dict:
  """Writes metrics.json, table.md, pr_curves.png (and cascade.png with the PRM) and returns the metrics
  (`report.scorer_metrics`, plus the machine, timings_s, with the PRM prm_training and prm_combined, on a data file
  outcome, in reader mode first_error)."""
  cfg, run, steps = job.cfg, job.run, scores.steps
  every = {**scores.scores, **(comparison.scores if comparison is not None else {})}
  named = {}
  for sid, per in every.items():  # a dataset without the answer lines is scored by its domain's scores
    named[str(sid)] = {**per, **{name: per[d] for name, d in steps.domain.items() if name not in per}}
  metrics = scorer_metrics(named, steps.labels, cfg.in_domains, cfg.held_out_domains, steps.groups, seed=cfg.seed)
  metrics["machine"] = str(describe())
  for key, value in (("outcome", outcomes), ("first_error", first_errors)):
    if value is not None:
      metrics[key] = value
  if comparison is not None:
    hist = prm_history(comparison.prm.folder)
    best = [h["val_pr_auc"] for h in hist if h["improved"]]
    metrics["prm_training"] = {
      "folder": os.path.relpath(comparison.prm.folder, run.directory),
      "epochs": len(hist),
      "best_val_pr_auc": best[-1] if best else math.nan,
    }
    metrics["prm_combined"] = comparison.combined.to_json()
  timings = run.timings()
  if timings:
    metrics["timings_s"] = timings
  write_json(run.path("metrics.json"), metrics)
  with atomic_open(run.path("table.md")) as f:
    f.write(
      table_markdown(metrics)
      + ("" if comparison is None else "\n" + prm_report.cascade_markdown(comparison.combined))
      + (
        ""
        if outcomes is None
        else f"\nOutcome accuracy: {outcomes['accuracy']:.3f} ({outcomes['trajectories']} test "
        "trajectories with a known outcome).\n"
      )
      + ("" if first_errors is None else "\n" + first_error_markdown(first_errors))
    )
  plot_pr_curves(named, {d: steps.labels[d] for d in cfg.domains}, run.path("pr_curves.png"))
  if comparison is not None:
    plot_cascade(
      {
        f"{d} ({'PRM' if kind == 'prm' else 'fusion'})": curve
        for d, per in comparison.combined.cascades.items()
        for kind, curve in per.items()
      },
      run.path("cascade.png"),
    )
  return metrics


GRAPH = Graph(
  Stage("problems", problems),
  Stage("solutions", solutions),
  Stage("samples", samples, needs=("problems", "solutions")),
  Stage("trajectories", trajectories, needs=("problems", "samples")),
  Stage("features", features, needs=("trajectories",)),
  Stage("probes", probes, needs=("trajectories", "features")),
  Stage("prm", prm, needs=("trajectories",)),
  Stage("scores", scores, needs=("trajectories", "features", "probes")),
  Stage("prm_comparison", prm_comparison, needs=("trajectories", "features", "probes", "prm", "scores")),
  Stage("outcomes", outcomes, needs=("problems", "trajectories")),
  Stage("first_errors", first_errors, needs=("trajectories", "features", "probes", "prm", "scores", "prm_comparison")),
  Stage("report", report, needs=("scores", "prm_comparison", "outcomes", "first_errors")),
)


def start(
  lm: LanguageModel,
  cfg: ReprobeConfig,
  workdir: str,
  *,
  prm: PRMTrainConfig | None = None,
  progress: Progress | None = None,
) -> GraphRun:
  """A run of the job in the run folder `workdir` (`run_folder`), its stages computed when first asked for
  (`run["probes"]`, `run["report"]`). The config is checked against the target, and the PRM's separator against its
  tokenizer, before anything is made."""
  if prm is not None:
    check_separator_for(lm, prm, "config.prm.separator")
  check_target(cfg, lm)
  return GraphRun(GRAPH, ReprobeJob(lm, cfg, Run(workdir), prm, progress or no_progress))


def evaluate(
  lm: LanguageModel,
  cfg: ReprobeConfig,
  workdir: str,
  *,
  prm: PRMTrainConfig | None = None,
  progress: Progress | None = None,
) -> dict:
  """The whole job: the metrics of `report` (every stage before it run or reused). With `prm`, the PRM baseline
  trained here is scored beside the probes ('prm'), with the fusion rows and the cascade."""
  return start(lm, cfg, workdir, prm=prm, progress=progress)["report"]


def labelled_trajectories(
  lm: LanguageModel, cfg: ReprobeConfig, workdir: str, *, progress: Progress | None = None
) -> Splits[Trajectory]:
  """The run's labelled trajectories of every split (sampled and labelled first where missing)."""
  return start(lm, cfg, workdir, progress=progress)["trajectories"]


def train_probes(
  lm: LanguageModel, cfg: ReprobeConfig, workdir: str, *, progress: Progress | None = None
) -> dict[str, TrainedProbe]:
  """The run's probe of every feature set (trained first where missing)."""
  return start(lm, cfg, workdir, progress=progress)["probes"]


def train_prm_stage(
  lm: LanguageModel, cfg: ReprobeConfig, prm: PRMTrainConfig, workdir: str, *, progress: Progress | None = None
) -> TrainedPRM:
  """The run's PRM baseline for `prm` (trained first where missing)."""
  return start(lm, cfg, workdir, prm=prm, progress=progress)["prm"]


def bundles(run: GraphRun, names: Sequence[str] | None = None) -> dict[str, ProbeBundle]:
  """A run's trained probes (trained first where missing) as ProbeBundles: {feature set: bundle}, each with its
  feature spec and the target's fingerprint, ready for `get_scorer("probe", bundle=...)` or `save_probe`."""
  cfg = run.job.cfg
  names = tuple(cfg.feature_sets) if names is None else tuple(names)
  unknown = sorted(set(names) - set(cfg.feature_sets))
  if unknown:
    raise ConfigError(f"probe_bundles: {unknown} are not among config.feature_sets {cfg.feature_sets}")
  trained = run["probes"]
  return {name: trained[name].bundle for name in names}


def probe_bundles(
  lm: LanguageModel,
  cfg: ReprobeConfig,
  workdir: str,
  names: Sequence[str] | None = None,
  *,
  progress: Progress | None = None,
) -> dict[str, ProbeBundle]:
  """`bundles` of a run of the job in `workdir`."""
  return bundles(start(lm, cfg, workdir, progress=progress), names)
