"""The ReProbe job's step scores: every test step scored by the uncertainty baselines, the probes, their linear
baselines and the PRM, and the val and test scores stored for the fusion and the cascade (`write_step_scores`)."""

from __future__ import annotations

import numpy as np

from reprobe_jax.eval import baselines
from reprobe_jax.features import FeatureStore
from reprobe_jax.io.atomic import atomic_open
from reprobe_jax.jobs.reprobe_config import ReprobeConfig, Splits
from reprobe_jax.jobs.reprobe_records import PRM_ID, DomainScores, ScorerId, TestSteps, TrainedPRM, TrainedProbe
from reprobe_jax.prm.train import prm_scores
from reprobe_jax.probe import linear
from reprobe_jax.probe.data import Example, examples
from reprobe_jax.probe.train import predict_examples
from reprobe_jax.tasks.response import is_answer_line
from reprobe_jax.trajectories import Trajectory


def of_domain(recs: list[Trajectory], domain: str) -> list[Trajectory]:
  return [r for r in recs if r.domain == domain]


def test_steps(cfg: ReprobeConfig, test: list[Trajectory]) -> TestSteps:
  """The labels and problem ids of every test step, per dataset (`TestSteps`)."""
  labels, groups, domain = {}, {}, {}
  for d in cfg.domains:
    recs = of_domain(test, d)
    labels[d] = np.concatenate([np.asarray(r.labels, np.float64) for r in recs])
    groups[d] = np.concatenate([[r.problem_id] * len(r.labels) for r in recs])
    domain[d] = d
    if cfg.mode == "line" and not cfg.reader_mode:  # without the '<Answer>' lines (whose base rate differs by domain)
      answer = np.concatenate([[is_answer_line(s.text) for s in r.steps] for r in recs]).astype(bool)
      labels[f"{d} (steps)"] = np.where(answer, np.nan, labels[d])
      groups[f"{d} (steps)"] = groups[d]
      domain[f"{d} (steps)"] = d
  return TestSteps(labels, groups, domain)


def baseline_scores(cfg: ReprobeConfig, test: list[Trajectory]) -> DomainScores:
  """Every uncertainty baseline's test step scores; 'random' draws from one stream seeded by `cfg.seed`, domain
  by domain in `cfg.domains`' order."""
  rng = np.random.default_rng(cfg.seed)
  out: DomainScores = {}
  for d in cfg.domains:
    recs = of_domain(test, d)
    for b in baselines.BASELINES:
      out.setdefault(ScorerId(b), {})[d] = np.concatenate(
        [
          baselines.step_scores(
            b, np.asarray(r.logprobs), np.asarray(r.entropy), np.asarray(r.self_certainty), r.spans, rng
          )
          for r in recs
        ]
      )
  return out


def predict(probe: TrainedProbe, exs: list[Example], batch_size: int) -> list[np.ndarray]:
  """The probe's P(incorrect) of every step of every example, one array [num_steps] per example."""
  return predict_examples(probe.graphdef, probe.params, probe.rest, exs, batch_size, probe.config.feature_dim)


def probe_scores(
  cfg: ReprobeConfig, trajs: Splits[Trajectory], stores: dict[str, FeatureStore], probes: dict[str, TrainedProbe]
) -> DomainScores:
  """Each probe's test step scores, and those of a logistic regression on the same features, mean-pooled per step
  and fitted on the train split (the probe's linear baseline)."""
  out: DomainScores = {}
  for name, probe in probes.items():
    store = stores[name]
    lr = linear.fit_logistic(*linear.mean_pooled(examples(trajs.train, store)))
    for d in cfg.domains:
      exs = examples(of_domain(trajs.test, d), store)
      out.setdefault(ScorerId.probe(name), {})[d] = np.concatenate(predict(probe, exs, cfg.train.batch_size))
      out.setdefault(ScorerId("logreg", name), {})[d] = linear.step_scores(lr, exs)
  return out


def prm_step_scores(cfg: ReprobeConfig, prm: TrainedPRM, test: list[Trajectory]) -> dict[str, np.ndarray]:
  """The PRM's test step scores per domain."""
  per_traj = prm_scores(prm.model, test, prm.config.batch_size)
  return {d: np.concatenate([s for s, r in zip(per_traj, test) if r.domain == d]) for d in cfg.domains}


def val_scores(
  cfg: ReprobeConfig,
  prm: TrainedPRM,
  trajs: Splits[Trajectory],
  stores: dict[str, FeatureStore],
  probes: dict[str, TrainedProbe],
) -> dict[ScorerId, list[np.ndarray]]:
  """The PRM's and every probe's val step scores, per trajectory (what a fusion is fitted on)."""
  out = {PRM_ID: prm_scores(prm.model, trajs.val, prm.config.batch_size)}
  for name, probe in probes.items():
    out[ScorerId.probe(name)] = predict(probe, examples(trajs.val, stores[name]), cfg.train.batch_size)
  return out


def write_step_scores(
  path: str,
  val: list[Trajectory],
  val_scores: dict[str, list[np.ndarray]],
  test: list[Trajectory],
  domains: list[str],
  test_scores: dict[str, dict[str, np.ndarray]],
) -> None:
  """Every val and test step's scores, for fitting a fusion on val and drawing a cascade on test without rescoring:
  an .npz with, per split ('val', 'test'), one entry per step in the same order: `<split>/labels` (1 incorrect,
  0 correct, NaN unknown), `<split>/trajectory_id`, `<split>/problem_id`, `<split>/domain`, `<split>/step` (its
  index in the trajectory), `<split>/answer` (a line-mode '<Answer>' line) and `<split>/score/<scorer>`. val is in
  file order; test by domain (`domains`' order), file order within each, as the metrics read it. val_scores:
  {scorer: per trajectory [num_steps]}; test_scores: {scorer: {domain: [steps of that domain]}}."""

  def columns(recs: list[Trajectory]) -> dict[str, np.ndarray]:
    steps = [(r, k, s) for r in recs for k, s in enumerate(r.steps)]
    return {
      "labels": np.concatenate([r.label_array() for r in recs] + [np.zeros(0, np.float32)]),
      "trajectory_id": np.asarray([r.id for r, _, _ in steps], str),
      "problem_id": np.asarray([r.problem_id for r, _, _ in steps], str),
      "domain": np.asarray([r.domain for r, _, _ in steps], str),
      "step": np.asarray([k for _, k, _ in steps], np.int32),
      "answer": np.asarray([r.mode == "line" and is_answer_line(s.text) for r, _, s in steps], bool),
    }

  arrays = {f"val/{k}": v for k, v in columns(val).items()}
  arrays.update(
    {f"val/score/{name}": np.concatenate(list(per) + [np.zeros(0, np.float32)]) for name, per in val_scores.items()}
  )
  ordered = [r for d in domains for r in test if r.domain == d]
  arrays.update({f"test/{k}": v for k, v in columns(ordered).items()})
  arrays.update({f"test/score/{name}": np.concatenate([per[d] for d in domains]) for name, per in test_scores.items()})
  with atomic_open(path, "wb", seal=True) as f:
    np.savez(f, **arrays)
