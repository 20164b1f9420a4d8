"""The ReProbe job's stages on the user's data (docs/own-data.md): reader mode's trajectories (the target
teacher-forced over the given steps of a step-labelled file, `trajectories.teacher`, their labels imported), the
outcome accuracy of the test trajectories, and ProcessBench's first-error F1 of every step scorer
(`eval.processbench`, its threshold chosen on val). `jobs.reprobe` composes them into the job's graph.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from reprobe_jax.eval import baselines, processbench
from reprobe_jax.features import FeatureStore, extract
from reprobe_jax.io.atomic import write_jsonl
from reprobe_jax.jobs.reprobe_config import ReprobeConfig, Splits, feature_specs, split_solutions
from reprobe_jax.jobs.reprobe_records import (
  LABELLED,
  PRM_ID,
  DomainScores,
  PRMComparison,
  ReprobeJob,
  ScorerId,
  TestScores,
  TrainedPRM,
  TrainedProbe,
)
from reprobe_jax.jobs.reprobe_scores import of_domain, predict
from reprobe_jax.jobs.runs import Run
from reprobe_jax.models import LanguageModel
from reprobe_jax.prm.train import prm_scores
from reprobe_jax.probe import linear
from reprobe_jax.probe.data import examples
from reprobe_jax.tasks import Problem, formats
from reprobe_jax.tasks.dataset_records import LabelledSolution
from reprobe_jax.trajectories import Trajectory, read_trajectories, teacher_force


def solutions(job: ReprobeJob) -> Splits[LabelledSolution] | None:
  """Reader mode: the labelled solutions of every split (`split_solutions`); None otherwise."""
  return split_solutions(job.cfg) if job.cfg.reader_mode else None


def teacher_forced(
  job: ReprobeJob, problems: Splits[Problem], solutions: Splits[LabelledSolution]
) -> Splits[list[Trajectory]]:
  """The `samples` stage in reader mode: `read_solutions` into `samples_<split>.jsonl` (labelled from the file)."""
  names = [f"samples_{split}.jsonl" for split in Splits._fields]

  def read():
    for name, split in zip(names, read_solutions(job.lm, job.cfg, job.run, problems, solutions, job.tick)):
      write_jsonl(job.run.path(name), split, seal=True)

  job.run.stage("teacher_force", names, read)
  return Splits(*(read_trajectories(job.run.path(name), sealed=True) for name in names))


def given(job: ReprobeJob, samples: Splits[list[Trajectory]]) -> None:
  """The `trajectories` stage in reader mode: the samples are the labelled trajectories (no annotator runs)."""

  def write():
    for name, split in zip(LABELLED, samples):
      write_jsonl(job.run.path(name), split, seal=True)

  job.run.stage("import", list(LABELLED), write)


def outcomes(job: ReprobeJob, problems: Splits[Problem], trajectories: Splits[Trajectory]) -> dict | None:
  """On a data file, the outcome accuracy of the test trajectories (`outcome_accuracy`); None otherwise."""
  return outcome_accuracy(problems, trajectories.test) if job.cfg.data.enabled else None


def first_errors(
  job: ReprobeJob,
  trajectories: Splits[Trajectory],
  features: dict[str, FeatureStore],
  probes: dict[str, TrainedProbe],
  prm: TrainedPRM | None,
  scores: TestScores,
  prm_comparison: PRMComparison | None,
) -> dict[str, dict] | None:
  """Reader mode: ProcessBench's first-error F1 of every scorer but the fusions (threshold chosen on val,
  `first_error_metrics`); None otherwise."""
  if not job.cfg.reader_mode:
    return None
  test = {**scores.scores, **({PRM_ID: prm_comparison.scores[PRM_ID]} if prm_comparison is not None else {})}
  return first_error_metrics(job.cfg, trajectories, val_step_scores(job.cfg, trajectories, features, probes, prm), test)


def read_solutions(
  lm: LanguageModel,
  cfg: ReprobeConfig,
  run: Run,
  problems: Splits[Problem],
  solutions: Splits[LabelledSolution],
  tick: Callable[[str, int, int], None],
) -> Splits[list[Trajectory]]:
  """Every split's solutions teacher-forced (`teacher_force`, labels from the file), the features of every feature
  set captured in the same pass and stored as they come (no second forward)."""
  specs = feature_specs(cfg)
  by_id = {p.id: p for ps in problems for p in ps}

  def store(batch, feats):
    for spec in specs:
      extract(
        lm, batch, spec, run.path("features", spec.name), shard_size=max(len(batch), 1), captured=feats[spec.name]
      )

  out = []
  for split, sols in solutions.items():
    tick(f"teacher-force {split}", 0, len(sols))
    out.append(
      teacher_force(
        lm,
        by_id,
        sols,
        cfg.mode,
        few_shot=cfg.trajectories.few_shot,
        feature_specs=specs,
        on_features=store,
        batch_size=cfg.trajectories.batch_size,
      )
    )
    tick(f"teacher-force {split}", len(sols), len(sols))
  return Splits(*out)


def outcome_accuracy(problems: Splits[Problem], test: list[Trajectory]) -> dict:
  """{'accuracy', 'trajectories'}: the share of test trajectories whose final answer is right, over those whose
  outcome is known. A given solution's outcome is its file's (`extra['correct']`, None when the file does not say);
  a sampled one's is the answer check (`formats.check_response(...).correct`)."""
  by_id = {p.id: p for ps in problems for p in ps}
  known = []
  for t in test:
    if "correct" in t.extra and t.annotator and t.annotator.startswith("import:"):
      correct = t.extra["correct"]
    else:
      correct = formats.check_response(by_id[t.problem_id], t.response or "", t.mode).correct
    if correct is not None:
      known.append(bool(correct))
  return {"accuracy": float(np.mean(known)) if known else float("nan"), "trajectories": len(known)}


def val_step_scores(
  cfg: ReprobeConfig,
  trajs: Splits[Trajectory],
  stores: dict[str, FeatureStore],
  probes: dict[str, TrainedProbe],
  prm: TrainedPRM | None,
) -> dict[ScorerId, list[np.ndarray]]:
  """Every scorer's val step scores, per trajectory (what ProcessBench's threshold is chosen on): the uncertainty
  baselines ('random' from its own stream seeded by `cfg.seed`), each probe, its logistic regression (fitted on
  train, as for test) and the PRM."""
  rng = np.random.default_rng(cfg.seed)
  val = trajs.val
  out: dict[ScorerId, list[np.ndarray]] = {}
  for b in baselines.BASELINES:
    out[ScorerId(b)] = [
      baselines.step_scores(
        b, np.asarray(r.logprobs), np.asarray(r.entropy), np.asarray(r.self_certainty), r.spans, rng
      )
      for r in val
    ]
  for name, probe in probes.items():
    exs = examples(val, stores[name])
    out[ScorerId.probe(name)] = predict(probe, exs, cfg.train.batch_size)
    lr = linear.fit_logistic(*linear.mean_pooled(examples(trajs.train, stores[name])))
    out[ScorerId("logreg", name)] = _split(linear.step_scores(lr, exs), val)
  if prm is not None:
    out[PRM_ID] = prm_scores(prm.model, val, prm.config.batch_size)
  return out


def _split(flat: np.ndarray, recs: list[Trajectory]) -> list[np.ndarray]:
  """Concatenated step scores back into one array per trajectory."""
  return np.split(np.asarray(flat), np.cumsum([len(r.steps) for r in recs])[:-1]) if recs else []


def first_error_metrics(
  cfg: ReprobeConfig, trajs: Splits[Trajectory], val: dict[ScorerId, list[np.ndarray]], test: DomainScores
) -> dict[str, dict]:
  """{scorer: ProcessBench's numbers on test at the threshold chosen on val (`processbench.evaluate`)} for every
  scorer with val scores; test scores are the job's (per domain, `cfg.domains`' order, file order within)."""
  ordered = [r for d in cfg.domains for r in of_domain(trajs.test, d)]
  test_labels = [r.label_array() for r in ordered]
  val_labels = [r.label_array() for r in trajs.val]
  out = {}
  for sid, per in val.items():
    if sid in test:
      flat = np.concatenate([test[sid][d] for d in cfg.domains])
      out[str(sid)] = processbench.evaluate(val_labels, per, test_labels, _split(flat, ordered))
  return out


def first_error_markdown(results: dict[str, dict]) -> str:
  """ProcessBench's table: one row per scorer (threshold from val, accuracies and F1 on test)."""
  lines = ["| method | tau (val) | val F1 | error acc | correct acc | F1 |", "|---|---|---|---|---|---|"]
  for name, m in results.items():
    lines.append(
      f"| {name} | {m['tau']:.3g} | {m['val_f1']:.3f} | {m['error_acc']:.3f} | {m['correct_acc']:.3f} | {m['f1']:.3f} |"
    )
  n = next(iter(results.values()), {"n_error": 0, "n_correct": 0})
  return (
    "\n".join(lines) + f"\n\nProcessBench's first-error F1 (Zheng et al., 2024): the first step scored above tau, tau "
    f"chosen on val; test solutions: {n['n_error']} with an error, {n['n_correct']} correct.\n"
  )
