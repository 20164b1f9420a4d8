"""The ReProbe job (METHOD Part A): problems -> trajectories -> step labels (rule, self-judge, API judge or imported)
-> features -> probe -> PR-AUC against uncertainty baselines, trained in domain (arithmetic) and tested in and out
of domain (planning, QA), as the paper does.

Composed from the shared layers: `runs` (run folder, stages, timings, progress), `annotate`, `features`, `probe`
(the probe, its training and the linear baseline) and `report` (metrics.json, table.md, pr_curves.png). Every stage
writes its artifact under the run folder and is skipped when that artifact exists, so a rerun reuses work and an
interrupted run resumes (feature extraction and probe training resume mid-way). Artifacts:
  samples_<split>.jsonl        the sampled trajectories (reprobe_jax.trajectories schema), before labels
  trajectories_<split>.jsonl   the same, labelled by `config.annotator`
  features/<set>/              feature shards and manifest;  probe/<set>/  checkpoints, history, TensorBoard
  prm/<key>/                   the PRM baseline trained here, when asked (`prm_folder`; reprobe_jax.prm.train's
                               layout, plus step_scores.npz: the val and test step scores of the PRM and the probes)
  metrics.json, table.md, pr_curves.png, timings.json; with the PRM also cascade.png (reprobe_jax.prm.report)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import numpy as np

from reprobe_jax.eval import baselines
from reprobe_jax.jobs import runs
from reprobe_jax.annotate import JudgePrompts, JudgeSettings, annotate, annotator_key, check_annotator
from reprobe_jax.io.atomic import atomic_open
from reprobe_jax.fields import Int, OneOf, Seq, check_fields, field_name, plain, replace_fields
from reprobe_jax.errors import ConfigError
from reprobe_jax.features import FeatureMismatchError, FeatureSpec, extract, model_fingerprint
from reprobe_jax.eval.machine import describe
from reprobe_jax.models import CaptureSpec, LanguageModel
from reprobe_jax.prm import report as prm_report
from reprobe_jax.prm.combine import plot_cascade
from reprobe_jax.prm.model import PRM
from reprobe_jax.prm.train import MODEL as PRM_MODEL
from reprobe_jax.prm.train import PRMTrainConfig, check_separator_for, history as prm_history, prm_scores, train_prm
from reprobe_jax.probe import ProbeConfig
from reprobe_jax.probe import linear
from reprobe_jax.probe.bundle import ProbeBundle
from reprobe_jax.probe.data import examples
from reprobe_jax.probe.train import ProbeTrainConfig, predict_examples, train_probe
from reprobe_jax.eval.report import plot_pr_curves, scorer_metrics, table_markdown
from reprobe_jax.jobs.runs import Progress, Run, no_progress
from reprobe_jax.io.readers import read_json
from reprobe_jax.tasks import DIFFICULTIES, DOMAINS, make_problems
from reprobe_jax.tasks import formats
from reprobe_jax.tasks.formats import MODES
from reprobe_jax.tasks.io import write_jsonl
from reprobe_jax.trajectories import Trajectory, TrajectoryConfig, prompt_text, read_trajectories, \
    sample_trajectories


@dataclasses.dataclass(frozen=True)
class ProbeShape:
  """The probe's shape (`ProbeConfig` without the feature width, which the feature store decides)."""

  d_model: int = 128
  n_layers: int = 1
  n_heads: int = 4
  ff_dim: int = 512
  dropout: float = 0.1

  def __post_init__(self):
    ProbeConfig(feature_dim=1, **dataclasses.asdict(self))  # ProbeConfig's checks, named at this config's path


FEATURE_PARTS = ("hidden", "attn", "logit")


@dataclasses.dataclass(frozen=True)
class FeatureSetName:
  """A feature set's name: distinct FEATURE_PARTS joined by '+', e.g. 'hidden' or 'attn+logit' (METHOD A3)."""

  def ok(self, v) -> bool:
    parts = v.split("+") if isinstance(v, str) else []
    return bool(parts) and all(p in FEATURE_PARTS for p in parts) and len(set(parts)) == len(parts)

  def __str__(self) -> str:
    return f"distinct parts of {', '.join(FEATURE_PARTS)} joined by '+'"


@dataclasses.dataclass(frozen=True)
class ReprobeConfig:
  """A ReProbe run. `annotator` picks the step labels: 'rule' (exact checkers), 'self' (the target as its own
  two-stage judge, `judge.self_judge`), 'judge' (an OpenAI-compatible server, `judge.api`), 'import' (the JSONL
  file at `labels_path`); it is checked when the config is made (ConfigError naming the field)."""

  seed: int = 0
  mode: str = "line"
  train_domains: tuple[str, ...] = ("arithmetic",)
  ood_domains: tuple[str, ...] = ("planning", "qa")
  train_problems: int = 360  # per training domain
  val_problems: int = 90
  test_problems: int = 120  # per test domain
  difficulties: tuple[int, ...] = (1, 2, 3)
  # The held-out domains' test problems at difficulties of their own (empty: `difficulties`), so a family the
  # target finds harder can be tested where it gets 30-70% of its steps right (issue 13; docs/method.md).
  ood_difficulties: tuple[int, ...] = ()
  trajectories: TrajectoryConfig = TrajectoryConfig()
  feature_sets: tuple[str, ...] = ("hidden", "hidden+logit", "attn+logit")
  hidden_layers: tuple[int, ...] = (-1,)
  probe: ProbeShape = ProbeShape()
  train: ProbeTrainConfig = ProbeTrainConfig()
  annotator: str = "rule"
  judge: JudgeSettings = JudgeSettings()
  labels_path: str = ""

  def __post_init__(self):
    check_fields(self, {"seed": Int(0), "mode": OneOf(MODES), "train_domains": Seq(OneOf(DOMAINS)),
                        "ood_domains": Seq(OneOf(DOMAINS), nonempty=False), "train_problems": Int(1),
                        "val_problems": Int(1), "test_problems": Int(1), "difficulties": Seq(OneOf(DIFFICULTIES)),
                        "ood_difficulties": Seq(OneOf(DIFFICULTIES), nonempty=False),
                        "feature_sets": Seq(FeatureSetName()), "hidden_layers": Seq(Int(), distinct=False)})
    both = sorted(set(self.train_domains) & set(self.ood_domains))
    if both:
      raise ConfigError(f"{field_name(self, 'ood_domains')}: {both} also in train_domains; a domain is either "
                        "trained on (in domain) or held out")
    for name in ("trajectories", "probe", "train", "judge"):
      cls = type(getattr(ReprobeConfig, name))
      if not isinstance(getattr(self, name), cls):
        raise ConfigError(f"{field_name(self, name)}: expected a {cls.__name__}, got {getattr(self, name)!r}")
    check_annotator(self.annotator, self.judge, self.labels_path)


def check_model(cfg: ReprobeConfig, *, num_layers: int, context: int, vocab_size: int) -> None:
  """ConfigError naming the field when `cfg` asks what a target of this size cannot do (hidden layers it lacks,
  more new tokens than its context, top_k above its vocabulary): checked once the target's shape is known and
  before anything is sampled, so a run that cannot finish fails in a second."""
  try:
    CaptureSpec(hidden_layers=cfg.hidden_layers).resolve_layers(num_layers)
  except ConfigError as e:
    raise ConfigError(f"config.hidden_layers={cfg.hidden_layers}: the target has {num_layers} layers "
                      f"({e})") from None
  t = cfg.trajectories
  if t.max_new_tokens >= context:
    raise ConfigError(f"config.trajectories.max_new_tokens={t.max_new_tokens} leaves no room for a prompt in the "
                      f"target's context of {context} tokens")
  if t.top_k > vocab_size:
    raise ConfigError(f"config.trajectories.top_k={t.top_k} is above the target's vocabulary of {vocab_size}")
  if cfg.annotator == "self" and cfg.judge.self_judge.max_new_tokens >= context:
    raise ConfigError(f"config.judge.self_judge.max_new_tokens={cfg.judge.self_judge.max_new_tokens} leaves no "
                      f"room for a prompt in the target's context of {context} tokens")


def check_target(cfg: ReprobeConfig, lm: LanguageModel) -> None:
  """`check_model` for a loaded target."""
  check_model(cfg, num_layers=lm.config.num_layers, context=lm.config.max_position_embeddings,
              vocab_size=lm.config.vocab_size)


def config_from_dict(c) -> ReprobeConfig:
  """The CLI's ConfigDict -> ReprobeConfig, checked whole (every field's type and range, named on error)."""
  d = plain(c)
  for k in ("job", "workdir", "target", "target_path", "seeds", "bands", "machine_bands", "tts", "prm"):  # the CLI's
    d.pop(k, None)
  return replace_fields(ReprobeConfig(), d, convert={"judge.prompts": JudgePrompts.from_dict})


def prm_config_from_dict(c) -> PRMTrainConfig | None:
  """The CLI's `config.prm` section -> its PRMTrainConfig when `config.prm.enabled`, else None; checked whole
  either way (ConfigError naming `config.prm.<field>`). A section of its own, outside ReprobeConfig, so the run
  folder's key does not change with it."""
  d = plain(c if c is not None else {})
  enabled = d.pop("enabled", False)
  if not isinstance(enabled, bool):
    raise ConfigError(f"config.prm.enabled: expected a bool, got {enabled!r}")
  cfg = replace_fields(PRMTrainConfig(), d, root="config.prm")
  return cfg if enabled else None


def prm_folder(run_dir: str, prm_cfg: PRMTrainConfig) -> str:
  """`<run>/prm/<key>`, the key a hash of the PRMTrainConfig: where the PRM trained for that config lives
  (`<folder>/model` loads with `load_prm`), beside its history.json and step_scores.npz."""
  return os.path.join(run_dir, "prm", runs.run_key(dataclasses.asdict(prm_cfg)))


SPLIT_SEEDS = {"train": 2_000_003, "val": 2_000_004, "test": 2_000_005}  # disjoint from the target LM's data


def split_problems(cfg: ReprobeConfig) -> dict[str, list]:
  """train / val in the training domains, test in every domain; difficulties mixed evenly (the held-out domains'
  test problems at `ood_difficulties` when it is set)."""
  def take(domain, n, seed, difficulties=cfg.difficulties):
    per = -(-n // len(difficulties))
    out = []
    for d in difficulties:
      out += make_problems(domain, per, seed + cfg.seed, d)
    return out[:n]
  held_out = cfg.ood_difficulties or cfg.difficulties
  return {
      "train": [p for d in cfg.train_domains for p in take(d, cfg.train_problems, SPLIT_SEEDS["train"])],
      "val": [p for d in cfg.train_domains for p in take(d, cfg.val_problems, SPLIT_SEEDS["val"])],
      "test": [p for d in cfg.train_domains for p in take(d, cfg.test_problems, SPLIT_SEEDS["test"])]
              + [p for d in cfg.ood_domains for p in take(d, cfg.test_problems, SPLIT_SEEDS["test"], held_out)],
  }


def data_fingerprint(lm: LanguageModel, cfg: ReprobeConfig) -> str:
  """Hash of the problems of every split and the prompts the target gets for them, so that a changed task
  generator, question layout, few-shot example or chat template gives a new run folder instead of reusing
  trajectories sampled from other prompts."""
  h = hashlib.sha256()
  for split, problems in split_problems(cfg).items():
    for p in problems:
      prompt = prompt_text(lm, p, cfg.mode, cfg.trajectories.few_shot, cfg.trajectories.first_step,
                           cfg.trajectories.goal_mark)
      h.update(json.dumps([split, p.to_json(), prompt]).encode())
  return h.hexdigest()


def run_folder(root: str, lm: LanguageModel, cfg: ReprobeConfig) -> str:
  """`<root>/<key>`, the key a hash of the config, the target model and the problems and prompts. The annotator
  settings enter only when they decide the labels (`annotate.annotator_key`): a 'rule' run keeps the folder it had
  before the annotator option existed."""
  config = dataclasses.asdict(cfg)
  for name in ("annotator", "judge", "labels_path"):
    del config[name]
  if tuple(cfg.ood_difficulties) in ((), tuple(cfg.difficulties)):  # the same problems: the folder it had before
    del config["ood_difficulties"]
  for option in ("first_step", "goal_mark"):  # off: the same prompts, the folder it had before the option existed
    if not getattr(cfg.trajectories, option):
      del config["trajectories"][option]
  annotation = annotator_key(cfg.annotator, cfg.judge, cfg.labels_path)
  if annotation is not None:
    config["annotation"] = annotation
  return os.path.join(root, runs.run_key(config, model_fingerprint(lm), data_fingerprint(lm, cfg)))


def trajectories(lm: LanguageModel, cfg: ReprobeConfig, workdir: str, *,
                 progress: Progress | None = None) -> dict[str, list[Trajectory]]:
  """{split: labelled trajectories}: samples every split, then labels all of them in one annotator call (a judge
  batches its prompts; an imported file must cover every trajectory)."""
  tick = progress or no_progress
  run = Run(workdir)
  splits = split_problems(cfg)
  labelled = {split: f"trajectories_{split}.jsonl" for split in splits}
  check_target(cfg, lm)  # found now, not after sampling
  if not run.exists(*labelled.values()):
    samples = {split: _samples(lm, cfg, run, split, problems, tick) for split, problems in splits.items()}

    def label():
      every = [t for split in splits for t in samples[split]]
      tick(f"annotate ({cfg.annotator})", 0, len(every))
      out = annotate(every, {p.id: p for ps in splits.values() for p in ps}, cfg.annotator, cfg.judge,
                     cfg.labels_path, lm)
      start = 0
      for split in splits:
        write_jsonl(run.path(labelled[split]), out[start:start + len(samples[split])])
        start += len(samples[split])
      tick(f"annotate ({cfg.annotator})", len(every), len(every))

    run.stage("annotate", list(labelled.values()), label)
  return {split: read_trajectories(run.path(name)) for split, name in labelled.items()}


def _samples(lm, cfg: ReprobeConfig, run: Run, split: str, problems, tick: Progress) -> list[Trajectory]:
  name = f"samples_{split}.jsonl"
  done = 0

  def on_batch(n):
    nonlocal done
    done += n
    tick(f"sample {split}", done, len(problems))

  specs = feature_specs(cfg)

  def store(batch, feats):  # features captured while sampling go straight into the stores: no second forward
    for spec in specs:
      extract(lm, batch, spec, run.path("features", spec.name), shard_size=max(len(batch), 1),
              captured=feats[spec.name])

  run.stage(f"sample_{split}", [name], lambda: write_jsonl(
      run.path(name), sample_trajectories(lm, problems, cfg.mode, cfg.trajectories, on_batch=on_batch,
                                          feature_specs=specs, on_features=store)))
  return read_trajectories(run.path(name))


def feature_specs(cfg: ReprobeConfig) -> list[FeatureSpec]:
  """The FeatureSpec of every feature set the config names."""
  return [FeatureSpec.from_name(name, hidden_layers=cfg.hidden_layers) for name in cfg.feature_sets]


def prepare(lm: LanguageModel, cfg: ReprobeConfig, workdir: str, *, progress: Progress | None = None):
  """Labelled trajectories and feature stores for every feature set. Returns (trajectories, stores)."""
  tick = progress or no_progress
  run = Run(workdir)
  trajs = trajectories(lm, cfg, workdir, progress=tick)
  every = [t for recs in trajs.values() for t in recs]
  stores = {}
  for spec in feature_specs(cfg):
    name = spec.name
    with run.timed(f"features_{name}", record=not run.exists(f"features/{name}/manifest.json")):
      stores[name] = extract(lm, every, spec, run.path("features", name),
                             on_shard=lambda k, n, name=name: tick(f"features {name}", k, n))
  return trajs, stores


def train_probes(lm: LanguageModel, cfg: ReprobeConfig, workdir: str, *, progress: Progress | None = None):
  """Trains one probe per feature set on the training split; returns {set: (graphdef, params, rest, history)}."""
  tick = progress or no_progress
  run = Run(workdir)
  trajs, stores = prepare(lm, cfg, workdir, progress=progress)
  out = {}
  for name, store in stores.items():
    train_ex, val_ex = examples(trajs["train"], store), examples(trajs["val"], store)
    pcfg = ProbeConfig(feature_dim=store.dim, **dataclasses.asdict(cfg.probe))
    pdir = run.path("probe", name)
    os.makedirs(pdir, exist_ok=True)
    spec = json.loads(json.dumps({"probe": dataclasses.asdict(pcfg), "features": store.manifest["spec"],
                                  "model_fingerprint": store.manifest["model_fingerprint"]}))
    spec_path = os.path.join(pdir, "probe_spec.json")
    if os.path.exists(spec_path):  # a checkpoint there was trained on other features or with another shape
      old = read_json(spec_path, "probe spec")
      for key in spec:
        if old.get(key) != spec[key]:
          raise FeatureMismatchError(f"{pdir}: the probe checkpoint was made with {key}={old.get(key)!r}, but the "
                                     f"data has {spec[key]!r}; use another workdir")
    runs.write_json(spec_path, spec)
    with run.timed(f"probe_{name}", record=not os.path.exists(os.path.join(pdir, "history.json"))):
      out[name] = train_probe(pcfg, train_ex, val_ex, cfg.train, pdir,
                              on_epoch=lambda e, entry, name=name: tick(
                                  f"probe {name} (val PR-AUC {entry['val_pr_auc']:.3f})", e + 1, cfg.train.epochs))
  return out


def probe_bundles(lm: LanguageModel, cfg: ReprobeConfig, workdir: str, names: tuple[str, ...] | None = None, *,
                  progress: Progress | None = None) -> dict[str, ProbeBundle]:
  """The run's trained probes (trained first where missing) as ProbeBundles: {feature set: bundle}, each with its
  feature spec and the target's fingerprint, ready for `get_scorer("probe", bundle=...)` or `save_probe`."""
  names = tuple(cfg.feature_sets) if names is None else tuple(names)
  unknown = sorted(set(names) - set(cfg.feature_sets))
  if unknown:
    raise ConfigError(f"probe_bundles: {unknown} are not among config.feature_sets {cfg.feature_sets}")
  probes = train_probes(lm, cfg, workdir, progress=progress)
  specs = {s.name: s for s in feature_specs(cfg)}
  fingerprint = model_fingerprint(lm)
  out = {}
  for name in names:
    spec_file = read_json(os.path.join(workdir, "probe", name, "probe_spec.json"), "probe spec")
    out[name] = ProbeBundle.create(ProbeConfig(**spec_file["probe"]), probes[name][1], specs[name], fingerprint)
  return out


def train_prm_stage(lm: LanguageModel, cfg: ReprobeConfig, prm_cfg: PRMTrainConfig, workdir: str, *,
                    progress: Progress | None = None) -> PRM:
  """The PRM baseline (METHOD A7) trained on the train split, early-stopped on the val split, in
  `prm_folder(workdir, prm_cfg)`: a cached stage ('prm'), reused when finished, resumed when interrupted."""
  tick = progress or no_progress
  check_separator_for(lm, prm_cfg, "config.prm.separator")  # before anything is sampled or trained
  run = Run(workdir)
  trajs = trajectories(lm, cfg, workdir, progress=tick)
  folder = prm_folder(workdir, prm_cfg)
  made: dict[str, PRM] = {}

  def train(on_epoch=None) -> PRM:
    return train_prm(lm, prm_cfg, trajs["train"], trajs["val"], folder, on_epoch=on_epoch)

  def make():
    made["prm"] = train(lambda e, entry: tick(f"prm (val PR-AUC {entry['val_pr_auc']:.3f})", e + 1, prm_cfg.epochs))

  run.stage("prm", [os.path.relpath(os.path.join(folder, PRM_MODEL, "config.json"), workdir)], make)
  return made["prm"] if "prm" in made else train()  # a finished folder: loaded


def evaluate(lm: LanguageModel, cfg: ReprobeConfig, workdir: str, *, prm: PRMTrainConfig | None = None,
             progress: Progress | None = None) -> dict:
  """Scores every test step with the probes, their linear baselines and the uncertainty baselines, and with `prm`
  the PRM baseline trained here (`train_prm_stage`, scorer 'prm'); writes metrics.json, table.md, pr_curves.png
  and returns the metrics (`report.scorer_metrics`, plus timings_s and, with `prm`, prm_training). With `prm` the
  PRM's and every probe's val and test step scores go to `<prm folder>/step_scores.npz` (`write_step_scores`), and
  from them (`prm.report.combine`) the 'fusion[<set>]' rows (fitted on val), the cascade table below the PR-AUC
  table, cascade.png and metrics['prm_combined']."""
  if prm is not None:
    check_separator_for(lm, prm, "config.prm.separator")  # a separator the tokenizer lacks fails before training
  probes = train_probes(lm, cfg, workdir, progress=progress)
  model = train_prm_stage(lm, cfg, prm, workdir, progress=progress) if prm is not None else None
  trajs, stores = prepare(lm, cfg, workdir)
  run = Run(workdir)
  for name, store in stores.items():
    if store.manifest["model_fingerprint"] != model_fingerprint(lm):
      raise ConfigError(f"features {name} were made by another model")
  test = trajs["test"]
  domains = list(cfg.train_domains + cfg.ood_domains)
  rng = np.random.default_rng(cfg.seed)
  scores: dict[str, dict[str, np.ndarray]] = {}
  labels: dict[str, np.ndarray] = {}
  groups: dict[str, np.ndarray] = {}
  for d in domains:
    recs = [r for r in test if r.domain == d]
    labels[d] = np.concatenate([np.asarray(r.labels, np.float64) for r in recs])
    groups[d] = np.concatenate([[r.problem_id] * len(r.labels) for r in recs])
    if cfg.mode == "line":  # the same steps without the '<Answer>' lines, whose base rate differs by domain
      answer = np.concatenate([[formats.is_answer_line(s.text) for s in r.steps] for r in recs]).astype(bool)
      labels[f"{d} (steps)"] = np.where(answer, np.nan, labels[d])
      groups[f"{d} (steps)"] = groups[d]
    for b in baselines.BASELINES:
      scores.setdefault(b, {})[d] = np.concatenate([
          baselines.step_scores(b, np.asarray(r.logprobs), np.asarray(r.entropy), np.asarray(r.self_certainty),
                                r.spans, rng)
          for r in recs])
  for name, (graphdef, params, rest, _) in probes.items():
    store = stores[name]
    lr = linear.fit_logistic(*linear.mean_pooled(examples(trajs["train"], store)))
    for d in domains:
      exs = examples([r for r in test if r.domain == d], store)
      scores.setdefault(f"probe[{name}]", {})[d] = np.concatenate(
          predict_examples(graphdef, params, rest, exs, cfg.train.batch_size, store.dim))
      scores.setdefault(f"logreg[{name}]", {})[d] = linear.step_scores(lr, exs)
  combined = None
  if model is not None:
    per_traj = prm_scores(model, test, prm.batch_size)
    for d in domains:
      scores.setdefault("prm", {})[d] = np.concatenate([s for s, r in zip(per_traj, test) if r.domain == d])
    folder = prm_folder(workdir, prm)
    val = {"prm": prm_scores(model, trajs["val"], prm.batch_size)}
    for name, (graphdef, params, rest, _) in probes.items():
      val[f"probe[{name}]"] = predict_examples(graphdef, params, rest, examples(trajs["val"], stores[name]),
                                               cfg.train.batch_size, stores[name].dim)
    step_file = os.path.join(folder, "step_scores.npz")
    write_step_scores(step_file, trajs["val"], val, test, domains,
                      {name: per for name, per in scores.items() if name in val})
    # Fusion (fitted on val) and the cascade (from the probe best on val) read the stored scores back.
    combined = prm_report.combine(prm_report.read_step_scores(step_file), domains)
    scores.update(combined.fusion_scores)
  for per in scores.values():  # a dataset without the answer lines is scored by the same scores
    for name in labels:
      if name not in per:
        per[name] = per[name.split(" ")[0]]
  metrics = scorer_metrics(scores, labels, cfg.train_domains, cfg.ood_domains, groups, seed=cfg.seed)
  metrics["machine"] = str(describe())
  if model is not None:
    hist = prm_history(folder)
    best = [h["val_pr_auc"] for h in hist if h["improved"]]
    metrics["prm_training"] = {"folder": os.path.relpath(folder, workdir), "epochs": len(hist),
                               "best_val_pr_auc": best[-1] if best else float("nan")}
    metrics["prm_combined"] = combined.to_json()
  timings = run.timings()
  if timings:
    metrics["timings_s"] = timings
  runs.write_json(run.path("metrics.json"), metrics)
  with atomic_open(run.path("table.md")) as f:
    f.write(table_markdown(metrics) + ("" if combined is None else "\n" + prm_report.cascade_markdown(combined)))
  plot_pr_curves(scores, {d: labels[d] for d in domains}, run.path("pr_curves.png"))
  if combined is not None:
    plot_cascade({f"{d} ({'PRM' if kind == 'prm' else 'fusion'})": curve for d, per in combined.cascades.items()
                  for kind, curve in per.items()}, run.path("cascade.png"))
  return metrics


def write_step_scores(path: str, val: list[Trajectory], val_scores: dict[str, list[np.ndarray]],
                      test: list[Trajectory], domains: list[str], test_scores: dict[str, dict[str, np.ndarray]]
                      ) -> None:
  """Every val and test step's scores, for fitting a fusion on val and drawing a cascade on test without rescoring:
  an .npz with, per split ('val', 'test'), one entry per step in the same order: `<split>/labels` (1 incorrect,
  0 correct, NaN unknown), `<split>/trajectory_id`, `<split>/problem_id`, `<split>/domain`, `<split>/step` (its
  index in the trajectory), `<split>/answer` (a line-mode '<Answer>' line) and `<split>/score/<scorer>`. val is in
  file order; test by domain (`domains`' order), file order within each, as the metrics read it. val_scores:
  {scorer: per trajectory [num_steps]}; test_scores: {scorer: {domain: [steps of that domain]}}."""

  def columns(recs: list[Trajectory]) -> dict[str, np.ndarray]:
    steps = [(r, k, s) for r in recs for k, s in enumerate(r.steps)]
    return {"labels": np.concatenate([r.label_array() for r in recs] + [np.zeros(0, np.float32)]),
            "trajectory_id": np.asarray([r.id for r, _, _ in steps], str),
            "problem_id": np.asarray([r.problem_id for r, _, _ in steps], str),
            "domain": np.asarray([r.domain for r, _, _ in steps], str),
            "step": np.asarray([k for _, k, _ in steps], np.int32),
            "answer": np.asarray([r.mode == "line" and formats.is_answer_line(s.text) for r, _, s in steps], bool)}

  arrays = {f"val/{k}": v for k, v in columns(val).items()}
  arrays.update({f"val/score/{name}": np.concatenate(list(per) + [np.zeros(0, np.float32)])
                 for name, per in val_scores.items()})
  ordered = [r for d in domains for r in test if r.domain == d]
  arrays.update({f"test/{k}": v for k, v in columns(ordered).items()})
  arrays.update({f"test/score/{name}": np.concatenate([per[d] for d in domains]) for name, per in test_scores.items()})
  with atomic_open(path, "wb") as f:
    np.savez(f, **arrays)
