"""The ReProbe job's config and where its runs live: ReprobeConfig (checked whole when made), its parsing from the
CLI's mapping, the checks against a target's shape, the problems (and in reader mode the labelled solutions) of each
split, the run folder's key, and the check that a probe folder was made for the same probe and features.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Generic, Iterator, NamedTuple, TypeVar

from reprobe_jax.annotate import JudgePrompts, JudgeSettings, annotator_key, check_annotator
from reprobe_jax.errors import ConfigError
from reprobe_jax.features import FeatureMismatchError, FeatureSpec, model_fingerprint
from reprobe_jax.fields import SEED, Int, OneOf, Seq, check_fields, field_name, plain, replace_fields
from reprobe_jax.io.atomic import write_json
from reprobe_jax.io.readers import read_json
from reprobe_jax.jobs.runs import run_key
from reprobe_jax.models import CaptureSpec, LanguageModel
from reprobe_jax.prm.train import PRMTrainConfig
from reprobe_jax.probe import ProbeConfig
from reprobe_jax.probe.train import ProbeTrainConfig
from reprobe_jax.tasks import DIFFICULTIES, FAMILIES, Problem
from reprobe_jax.tasks.data import DATA_TASK, DataConfig, load_data, no_data_file
from reprobe_jax.tasks.dataset_records import LabelledSolution
from reprobe_jax.steps.modes import STEP_MODE
from reprobe_jax.tasks.formats import MODES
from reprobe_jax.tasks.splits import spread
from reprobe_jax.trajectories import TrajectoryConfig, prompt_text


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
  """A feature set's name: distinct FEATURE_PARTS joined by '+', e.g. 'hidden' or 'attn+logit' (docs/method.md §A3)."""

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
  # target finds harder can be tested where it gets 30-70% of its steps right (docs/method.md, "Results over seeds").
  ood_difficulties: tuple[int, ...] = ()
  trajectories: TrajectoryConfig = TrajectoryConfig()
  feature_sets: tuple[str, ...] = ("hidden", "hidden+logit", "attn+logit")
  hidden_layers: tuple[int, ...] = (-1,)
  probe: ProbeShape = ProbeShape()
  train: ProbeTrainConfig = ProbeTrainConfig()
  annotator: str = "rule"
  judge: JudgeSettings = JudgeSettings()
  labels_path: str = ""
  # The user's data file (docs/own-data.md): when `data.path` is set the problems of every split come from it (the
  # math task, domain 'math') and the synthetic fields (domains, problem counts, difficulties) are not read.
  data: DataConfig = DataConfig()

  def __post_init__(self):
    check_fields(
      self,
      {
        "seed": SEED,
        "mode": OneOf(MODES),
        "train_domains": Seq(OneOf(FAMILIES.names() + (DATA_TASK,))),
        "ood_domains": Seq(OneOf(FAMILIES.names()), nonempty=False),
        "train_problems": Int(1),
        "val_problems": Int(1),
        "test_problems": Int(1),
        "difficulties": Seq(OneOf(DIFFICULTIES)),
        "ood_difficulties": Seq(OneOf(DIFFICULTIES), nonempty=False),
        "feature_sets": Seq(FeatureSetName()),
        "hidden_layers": Seq(Int(), distinct=False),
      },
    )
    both = sorted(set(self.train_domains) & set(self.ood_domains))
    if both:
      raise ConfigError(
        f"{field_name(self, 'ood_domains')}: {both} also in train_domains; a domain is either "
        "trained on (in domain) or held out"
      )
    for name in ("trajectories", "probe", "train", "judge", "data"):
      cls = type(getattr(ReprobeConfig, name))
      if not isinstance(getattr(self, name), cls):
        raise ConfigError(f"{field_name(self, name)}: expected a {cls.__name__}, got {getattr(self, name)!r}")
    check_annotator(self.annotator, self.judge, self.labels_path)
    if DATA_TASK in self.train_domains and not self.data.enabled:  # a config for the user's data, and no file
      raise no_data_file(field_name(self, "train_domains"))
    if self.data.enabled and not self.data.step_labelled and self.annotator == "rule":
      raise ConfigError(
        f"{field_name(self, 'annotator')}='rule': the math task of a data file ({self.data.format}) has no exact step "
        "checker (every step would be unlabelled); use 'self', 'judge' or 'import'"
      )
    own = STEP_MODE[self.mode]
    if self.annotator == "rule" and self.trajectories.steps not in ("", own):
      raise ConfigError(
        f"{field_name(self, 'trajectories')}.steps={self.trajectories.steps!r}: the rule annotator labels the "
        f"{self.mode} format's own steps ({own}); leave it '' or label with 'self', 'judge' or 'import'"
      )

  @property
  def domains(self) -> list[str]:
    """Every test domain: the training domains (in domain), then the held-out ones ('math' alone on a data file)."""
    return list(self.in_domains + self.held_out_domains)

  @property
  def in_domains(self) -> tuple[str, ...]:
    """The domains the probes train on: `train_domains`, or ('math',) on a data file."""
    return (DATA_TASK,) if self.data.enabled else self.train_domains

  @property
  def held_out_domains(self) -> tuple[str, ...]:
    """The held-out test domains: `ood_domains`, none on a data file."""
    return () if self.data.enabled else self.ood_domains

  @property
  def reader_mode(self) -> bool:
    """Whether the job reads given solutions instead of sampling (a step-labelled data file: ProcessBench,
    PRM800K): the target is teacher-forced over their steps and their labels are imported (`annotator` not run)."""
    return self.data.enabled and self.data.step_labelled


def check_model(cfg: ReprobeConfig, *, num_layers: int, context: int, vocab_size: int) -> None:
  """ConfigError naming the field when `cfg` asks what a target of this size cannot do (hidden layers it lacks,
  more new tokens than its context, top_k above its vocabulary): checked once the target's shape is known and
  before anything is sampled, so a run that cannot finish fails in a second."""
  try:
    CaptureSpec(hidden_layers=cfg.hidden_layers).resolve_layers(num_layers)
  except ConfigError as e:
    raise ConfigError(f"config.hidden_layers={cfg.hidden_layers}: the target has {num_layers} layers ({e})") from None
  t = cfg.trajectories
  if t.max_new_tokens >= context:
    raise ConfigError(
      f"config.trajectories.max_new_tokens={t.max_new_tokens} leaves no room for a prompt in the "
      f"target's context of {context} tokens"
    )
  if t.sampling.top_k > vocab_size:
    raise ConfigError(
      f"config.trajectories.sampling.top_k={t.sampling.top_k} is above the target's vocabulary of {vocab_size}"
    )
  if cfg.annotator == "self" and cfg.judge.self_judge.max_new_tokens >= context:
    raise ConfigError(
      f"config.judge.self_judge.max_new_tokens={cfg.judge.self_judge.max_new_tokens} leaves no "
      f"room for a prompt in the target's context of {context} tokens"
    )


def check_target(cfg: ReprobeConfig, lm: LanguageModel) -> None:
  """`check_model` for a loaded target."""
  check_model(
    cfg, num_layers=lm.config.num_layers, context=lm.config.max_position_embeddings, vocab_size=lm.config.vocab_size
  )


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


def feature_specs(cfg: ReprobeConfig) -> list[FeatureSpec]:
  """The FeatureSpec of every feature set the config names."""
  return [FeatureSpec.from_name(name, hidden_layers=cfg.hidden_layers) for name in cfg.feature_sets]


T = TypeVar("T")


class Splits(NamedTuple, Generic[T]):
  """One list per split: the probes train on `train`, stop early on `val` and are scored on `test`."""

  train: list[T]
  val: list[T]
  test: list[T]

  def items(self) -> Iterator[tuple[str, list[T]]]:
    """(split name, its list) in the order train, val, test."""
    return zip(self._fields, self)


def split_problems(cfg: ReprobeConfig) -> Splits[Problem]:
  """train / val in the training domains, test in every domain; difficulties mixed evenly (the held-out domains'
  test problems at `ood_difficulties` when it is set). On a data file (`cfg.data`), its splits (`load_data`)."""
  if cfg.data.enabled:
    data = load_data(cfg.data)
    return Splits(*(list(data.problems[s]) for s in ("train", "val", "test")))

  def take(domains, n, split, difficulties=cfg.difficulties):
    return [p for d in domains for p in spread(d, n, split, cfg.seed, difficulties)]

  return Splits(
    train=take(cfg.train_domains, cfg.train_problems, "train"),
    val=take(cfg.train_domains, cfg.val_problems, "val"),
    test=take(cfg.train_domains, cfg.test_problems, "test")
    + take(cfg.ood_domains, cfg.test_problems, "test", cfg.ood_difficulties or cfg.difficulties),
  )


def split_solutions(cfg: ReprobeConfig) -> Splits[LabelledSolution]:
  """The labelled solutions of every split of a step-labelled data file (`load_data`: a solution lands in its
  problem's split). ConfigError naming the split's fraction when a split holds none: the probes train on train,
  early-stop and choose ProcessBench's threshold on val, and are scored on test."""
  if not cfg.reader_mode:
    raise ConfigError(f"config.data.format={cfg.data.format!r}: not a step-labelled format (processbench, prm800k)")
  data = load_data(cfg.data)
  out = Splits(*(list(data.solutions[s]) for s in Splits._fields))
  for split, sols in out.items():
    if not sols:
      field = "config.data.val, config.data.test" if split == "train" else f"config.data.{split}"
      raise ConfigError(
        f"{field}: the {split} split of {cfg.data.path} holds no labelled solution ({len(data.problems[split])} "
        f"problems, none with a solution: a PRM800K line whose labelling ended before its first step gives none); "
        "use more problems or other fractions"
      )
  return out


def data_fingerprint(lm: LanguageModel, cfg: ReprobeConfig) -> str:
  """Hash of the problems of every split and the prompts the target gets for them, so that a changed task
  generator, question layout, few-shot example or chat template gives a new run folder instead of reusing
  trajectories sampled from other prompts."""
  h = hashlib.sha256()
  for split, problems in split_problems(cfg).items():
    for p in problems:
      prompt = prompt_text(
        lm, p, cfg.mode, cfg.trajectories.few_shot, cfg.trajectories.first_step, cfg.trajectories.goal_mark
      )
      h.update(json.dumps([split, p.to_json(), prompt]).encode())
  if cfg.reader_mode:  # the given steps and their labels are the trajectories: other ones, another folder
    for split, sols in split_solutions(cfg).items():
      for s in sols:
        h.update(json.dumps([split, s.to_json()]).encode())
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
  for option in ("first_step", "goal_mark", "steps"):  # off: the same run, the folder it had before the option existed
    if not getattr(cfg.trajectories, option):
      del config["trajectories"][option]
  if not cfg.data.enabled:  # the synthetic world: the folder it had before data files existed
    del config["data"]
  annotation = annotator_key(cfg.annotator, cfg.judge, cfg.labels_path)
  if annotation is not None:
    config["annotation"] = annotation
  return os.path.join(root, run_key(config, model_fingerprint(lm), data_fingerprint(lm, cfg)))


def prm_folder(run_dir: str, prm_cfg: PRMTrainConfig) -> str:
  """`<run>/prm/<key>`, the key a hash of the PRMTrainConfig: where the PRM trained for that config lives
  (`<folder>/model` loads with `load_prm`), beside its history.json and step_scores.npz."""
  return os.path.join(run_dir, "prm", run_key(dataclasses.asdict(prm_cfg)))


def check_probe_spec(pdir: str, spec: dict) -> None:
  """Writes `<pdir>/probe_spec.json`; FeatureMismatchError when a checkpoint there was trained on other features
  or with another probe shape."""
  os.makedirs(pdir, exist_ok=True)
  spec = json.loads(json.dumps(spec))
  spec_path = os.path.join(pdir, "probe_spec.json")
  if os.path.exists(spec_path):
    old = read_json(spec_path, "probe spec", sealed=True)
    for key in spec:
      if old.get(key) != spec[key]:
        raise FeatureMismatchError(
          f"{pdir}: the probe checkpoint was made with {key}={old.get(key)!r}, but the "
          f"data has {spec[key]!r}; use another workdir"
        )
  write_json(spec_path, spec, seal=True)
