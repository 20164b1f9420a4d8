"""ReProbe end to end on the synthetic worlds (METHOD Part A): problems -> trajectories -> rule labels ->
features -> probe -> PR-AUC against uncertainty baselines, trained in domain (arithmetic) and tested in and out of
domain (planning, QA), as the paper does.

Every stage writes its artifact under `workdir` and is skipped when that artifact exists, so a rerun reuses work
and an interrupted run resumes (feature extraction and probe training resume mid-way).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Callable, Sequence

import numpy as np

from reprobe_jax import baselines
from reprobe_jax.annotate import annotate_rule
from reprobe_jax.atomic import atomic_open
from reprobe_jax.errors import ConfigError
from reprobe_jax.features import FeatureMismatchError, FeatureSpec, FeatureStore, extract, model_fingerprint
from reprobe_jax.metrics import pr_auc, pr_curve, roc_auc
from reprobe_jax.models import LanguageModel
from reprobe_jax.probe import ProbeConfig
from reprobe_jax.probe.data import Example, examples
from reprobe_jax.probe.train import ProbeTrainConfig, evaluate_examples, predict_examples, train_probe
from reprobe_jax.tasks import make_problems
from reprobe_jax.tasks.io import read_jsonl, write_jsonl
from reprobe_jax.trajectories import TrajectoryConfig, prompt_text, sample_trajectories

Progress = Callable[[str, int, int], None]


@dataclasses.dataclass(frozen=True)
class ProbeShape:
  d_model: int = 128
  n_layers: int = 1
  n_heads: int = 4
  ff_dim: int = 512
  dropout: float = 0.1


@dataclasses.dataclass(frozen=True)
class ReprobeConfig:
  seed: int = 0
  mode: str = "line"
  train_domains: tuple[str, ...] = ("arithmetic",)
  ood_domains: tuple[str, ...] = ("planning", "qa")
  train_problems: int = 360  # per training domain
  val_problems: int = 90
  test_problems: int = 120  # per test domain
  difficulties: tuple[int, ...] = (1, 2, 3)
  trajectories: TrajectoryConfig = TrajectoryConfig()
  feature_sets: tuple[str, ...] = ("hidden", "attn+logit")
  hidden_layers: tuple[int, ...] = (-1,)
  probe: ProbeShape = ProbeShape()
  train: ProbeTrainConfig = ProbeTrainConfig()


def config_from_dict(c) -> ReprobeConfig:
  """The CLI's ConfigDict -> ReprobeConfig (unknown fields are named)."""
  from reprobe_jax.synthetic.build import _replace
  d = dict(c.to_dict() if hasattr(c, "to_dict") else c)
  for k in ("job", "workdir", "target", "target_path"):
    d.pop(k, None)
  nested = {k: dict(d.pop(k, {})) for k in ("trajectories", "probe", "train")}
  for k in ("train_domains", "ood_domains", "difficulties", "feature_sets", "hidden_layers"):
    if k in d:
      d[k] = tuple(d[k])
  cfg = _replace(ReprobeConfig(), d, "")
  return dataclasses.replace(cfg, trajectories=_replace(TrajectoryConfig(), nested["trajectories"], "trajectories"),
                             probe=_replace(ProbeShape(), nested["probe"], "probe"),
                             train=_replace(ProbeTrainConfig(), nested["train"], "train"))


SPLIT_SEEDS = {"train": 2_000_003, "val": 2_000_004, "test": 2_000_005}  # disjoint from the target LM's data


def split_problems(cfg: ReprobeConfig) -> dict[str, list]:
  """train / val in the training domains, test in every domain; difficulties mixed evenly."""
  def take(domain, n, seed):
    per = -(-n // len(cfg.difficulties))
    out = []
    for d in cfg.difficulties:
      out += make_problems(domain, per, seed + cfg.seed, d)
    return out[:n]
  return {
      "train": [p for d in cfg.train_domains for p in take(d, cfg.train_problems, SPLIT_SEEDS["train"])],
      "val": [p for d in cfg.train_domains for p in take(d, cfg.val_problems, SPLIT_SEEDS["val"])],
      "test": [p for d in cfg.train_domains + cfg.ood_domains
               for p in take(d, cfg.test_problems, SPLIT_SEEDS["test"])],
  }


def data_fingerprint(lm: LanguageModel, cfg: ReprobeConfig) -> str:
  """Hash of the problems of every split and the prompts the target gets for them, so that a changed task
  generator, question layout, few-shot example or chat template gives a new run folder instead of reusing
  trajectories sampled from other prompts."""
  h = hashlib.sha256()
  for split, problems in split_problems(cfg).items():
    for p in problems:
      h.update(json.dumps([split, p.to_json(), prompt_text(lm, p, cfg.mode, cfg.trajectories.few_shot)]).encode())
  return h.hexdigest()


def _record_time(workdir: str, stage: str, seconds: float) -> None:
  """Adds a stage's wall time to timings.json (kept from the run that did the work; cached reruns add nothing)."""
  path = os.path.join(workdir, "timings.json")
  times = {}
  if os.path.exists(path):
    with open(path) as f:
      times = json.load(f)
  times[stage] = round(times.get(stage, 0.0) + seconds, 2)
  with atomic_open(path) as f:
    json.dump(times, f, indent=1)


def _trajectories(lm, cfg: ReprobeConfig, workdir: str, tick: Progress) -> dict[str, list[dict]]:
  splits = split_problems(cfg)
  out = {}
  for split, problems in splits.items():
    path = os.path.join(workdir, f"trajectories_{split}.jsonl")
    if not os.path.exists(path):
      done = 0

      def on_batch(n, split=split, total=len(problems)):
        nonlocal done
        done += n
        tick(f"sample {split}", done, total)

      t0 = time.time()
      recs = sample_trajectories(lm, problems, cfg.mode, cfg.trajectories, on_batch=on_batch)
      write_jsonl(path, annotate_rule(recs, {p.id: p for p in problems}))
      _record_time(workdir, f"sample_{split}", time.time() - t0)
    out[split] = [rec for _, rec in read_jsonl(path)]
  return out


def _feature_spec(name: str, cfg: ReprobeConfig) -> FeatureSpec:
  return FeatureSpec.from_name(name, hidden_layers=cfg.hidden_layers)


def prepare(lm: LanguageModel, cfg: ReprobeConfig, workdir: str, *, progress: Progress | None = None):
  """Trajectories (labelled) and feature stores for every feature set. Returns (trajectories, stores)."""
  tick = progress or (lambda *a: None)
  os.makedirs(workdir, exist_ok=True)
  trajs = _trajectories(lm, cfg, workdir, tick)
  every = [r for recs in trajs.values() for r in recs]
  stores = {}
  for name in cfg.feature_sets:
    fresh = not os.path.exists(os.path.join(workdir, "features", name, "manifest.json"))
    t0 = time.time()
    stores[name] = extract(lm, every, _feature_spec(name, cfg), os.path.join(workdir, "features", name),
                           on_shard=lambda k, n, name=name: tick(f"features {name}", k, n))
    if fresh:
      _record_time(workdir, f"features_{name}", time.time() - t0)
  return trajs, stores


def train_probes(lm: LanguageModel, cfg: ReprobeConfig, workdir: str, *, progress: Progress | None = None):
  """Trains one probe per feature set on the training split; returns {set: (graphdef, params, rest, history)}."""
  tick = progress or (lambda *a: None)
  trajs, stores = prepare(lm, cfg, workdir, progress=progress)
  out = {}
  for name, store in stores.items():
    train_ex, val_ex = examples(trajs["train"], store), examples(trajs["val"], store)
    pcfg = ProbeConfig(feature_dim=store.dim, **dataclasses.asdict(cfg.probe))
    pdir = os.path.join(workdir, "probe", name)
    os.makedirs(pdir, exist_ok=True)
    spec = json.loads(json.dumps({"probe": dataclasses.asdict(pcfg), "features": store.manifest["spec"],
                                  "model_fingerprint": store.manifest["model_fingerprint"]}))
    spec_path = os.path.join(pdir, "probe_spec.json")
    if os.path.exists(spec_path):  # a checkpoint there was trained on other features or with another shape
      with open(spec_path) as f:
        old = json.load(f)
      for key in spec:
        if old.get(key) != spec[key]:
          raise FeatureMismatchError(f"{pdir}: the probe checkpoint was made with {key}={old.get(key)!r}, but the "
                                     f"data has {spec[key]!r}; use another workdir")
    with atomic_open(spec_path) as f:
      json.dump(spec, f, indent=1)
    fresh = not os.path.exists(os.path.join(pdir, "history.json"))
    t0 = time.time()
    out[name] = train_probe(pcfg, train_ex, val_ex, cfg.train, pdir,
                            on_epoch=lambda e, entry, name=name: tick(
                                f"probe {name} (val PR-AUC {entry['val_pr_auc']:.3f})", e + 1, cfg.train.epochs))
    if fresh:
      _record_time(workdir, f"probe_{name}", time.time() - t0)
  return out


# ------------------------------------------------------------------------------------------------ evaluation


def _mean_pooled(exs: Sequence[Example]) -> tuple[np.ndarray, np.ndarray]:
  xs, ys = [], []
  for e in exs:
    for (a, b), y in zip(e.spans, e.labels):
      if b > a:
        xs.append(e.features[a:b].mean(0))
        ys.append(y)
  dim = exs[0].features.shape[1] if exs else 0
  return np.asarray(xs, np.float64).reshape(-1, dim), np.asarray(ys, np.float64)


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1.0, iters: int = 25) -> Callable[[np.ndarray], np.ndarray]:
  """L2-regularised logistic regression by Newton steps on standardised inputs (the linear-probe baseline)."""
  known = ~np.isnan(y)
  x, y = x[known], y[known]
  if len(y) == 0 or y.min() == y.max():  # nothing to separate: predict the base rate
    rate = float(y.mean()) if len(y) else 0.5
    return lambda xq: np.full(len(xq), rate)
  mu, sd = x.mean(0), x.std(0) + 1e-6
  z = np.c_[(x - mu) / sd, np.ones(len(x))]
  w = np.zeros(z.shape[1])
  reg = l2 * np.r_[np.ones(z.shape[1] - 1), 0.0]
  for _ in range(iters):
    p = 1 / (1 + np.exp(-z @ w))
    grad = z.T @ (p - y) + reg * w
    hess = (z * (p * (1 - p))[:, None]).T @ z + np.diag(reg) + 1e-8 * np.eye(len(w))
    w -= np.linalg.solve(hess, grad)
  return lambda xq: 1 / (1 + np.exp(-(np.c_[(xq - mu) / sd, np.ones(len(xq))] @ w)))


def evaluate(lm: LanguageModel, cfg: ReprobeConfig, workdir: str, *, progress: Progress | None = None) -> dict:
  """Scores every test step with the probes and the baselines; writes metrics.json, table.md, pr_curves.png."""
  probes = train_probes(lm, cfg, workdir, progress=progress)
  trajs, stores = prepare(lm, cfg, workdir)
  for name, store in stores.items():
    if store.manifest["model_fingerprint"] != model_fingerprint(lm):
      raise ConfigError(f"features {name} were made by another model")
  test = trajs["test"]
  domains = list(cfg.train_domains + cfg.ood_domains)
  rng = np.random.default_rng(cfg.seed)
  scores: dict[str, dict[str, np.ndarray]] = {}
  labels: dict[str, np.ndarray] = {}
  for d in domains:
    recs = [r for r in test if r["domain"] == d]
    labels[d] = np.concatenate([[np.nan if x is None else x for x in r["labels"]] for r in recs])
    for b in baselines.BASELINES:
      scores.setdefault(b, {})[d] = np.concatenate([
          baselines.step_scores(b, np.asarray(r["logprobs"]), np.asarray(r["entropy"]),
                                np.asarray(r["self_certainty"]), [(s["start"], s["end"]) for s in r["steps"]], rng)
          for r in recs])
  for name, (graphdef, params, rest, _) in probes.items():
    store = stores[name]
    lr = fit_logistic(*_mean_pooled(examples(trajs["train"], store)))
    for d in domains:
      exs = examples([r for r in test if r["domain"] == d], store)
      scores.setdefault(f"probe[{name}]", {})[d] = np.concatenate(
          predict_examples(graphdef, params, rest, exs, cfg.train.batch_size, store.dim))
      x, _ = _mean_pooled(exs)
      pooled = np.full(len(labels[d]), np.nan)
      # mean pooling skips steps with no tokens; those have NaN labels and are skipped by the metrics too
      nonempty = np.concatenate([e.spans[:, 1] > e.spans[:, 0] for e in exs])
      pooled[nonempty] = lr(x)
      scores.setdefault(f"logreg[{name}]", {})[d] = np.nan_to_num(pooled, nan=0.5)
  metrics = summarise(scores, labels, cfg)
  if os.path.exists(os.path.join(workdir, "timings.json")):
    with open(os.path.join(workdir, "timings.json")) as f:
      metrics["timings_s"] = json.load(f)
  with atomic_open(os.path.join(workdir, "metrics.json")) as f:
    json.dump(metrics, f, indent=1)
  with atomic_open(os.path.join(workdir, "table.md")) as f:
    f.write(table_markdown(metrics))
  plot_pr_curves(scores, labels, os.path.join(workdir, "pr_curves.png"))
  return metrics


def summarise(scores, labels, cfg: ReprobeConfig) -> dict:
  id_d, ood_d = list(cfg.train_domains), list(cfg.ood_domains)
  def dataset(y):  # a domain whose steps all went unlabelled has no incorrect share (null, not NaN, in JSON)
    y = np.asarray(y, dtype=float)
    n = int(np.sum(~np.isnan(y)))
    return {"steps": n, "incorrect_share": float(np.nanmean(y)) if n else None}

  out = {"datasets": {d: dataset(labels[d]) for d in labels}, "methods": {}}
  for method, per in scores.items():
    m = {}
    for d in labels:
      m[d] = {"pr_auc": pr_auc(labels[d], per[d]), "roc_auc": roc_auc(labels[d], per[d])}
    for key in ("pr_auc", "roc_auc"):
      m[f"id_mean_{key}"] = float(np.mean([m[d][key] for d in id_d]))
      m[f"ood_mean_{key}"] = float(np.mean([m[d][key] for d in ood_d])) if ood_d else float("nan")
      m[f"overall_{key}"] = float(np.mean([m[d][key] for d in id_d + ood_d]))
    out["methods"][method] = m
  return out


def table_markdown(metrics: dict) -> str:
  datasets = list(metrics["datasets"])
  head = ["method"] + [f"{d} PR-AUC" for d in datasets] + ["ID mean", "OOD mean", "overall"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for method, m in metrics["methods"].items():
    cells = [f"{m[d]['pr_auc']:.3f}" for d in datasets]
    cells += [f"{m['id_mean_pr_auc']:.3f}", f"{m['ood_mean_pr_auc']:.3f}", f"{m['overall_pr_auc']:.3f}"]
    lines.append(f"| {method} | " + " | ".join(cells) + " |")
  share = ", ".join(f"{d}: {v['steps']} steps, " + ("none labelled" if v["incorrect_share"] is None else
                                                      f"{100 * v['incorrect_share']:.0f}% incorrect")
                    for d, v in metrics["datasets"].items())
  return "\n".join(lines) + f"\n\nTest steps ({share}).\n"


def plot_pr_curves(scores, labels, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, len(labels), figsize=(5 * len(labels), 4), squeeze=False)
  for ax, d in zip(axes[0], labels):
    for method, per in scores.items():
      if method == "random":
        continue
      r, p = pr_curve(labels[d], per[d])
      ax.plot(r, p, label=f"{method} ({pr_auc(labels[d], per[d]):.2f})", lw=2 if method.startswith("probe") else 1)
    if np.any(~np.isnan(labels[d])):  # the base rate: a random scorer's precision
      ax.axhline(np.nanmean(labels[d]), color="gray", ls=":", lw=1)
    ax.set(title=d, xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02))
    ax.legend(fontsize=7)
  fig.tight_layout()
  with atomic_open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=110)
  plt.close(fig)
