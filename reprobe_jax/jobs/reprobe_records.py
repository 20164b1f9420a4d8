"""What the ReProbe job's stages read and hand each other: the job's inputs (`ReprobeJob`), the id of a step scorer,
a trained probe, the PRM trained beside the probes, and the test steps with every scorer's scores. The
test-time-scaling job reads the same records."""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import numpy as np
from flax import nnx

from reprobe_jax.features import model_fingerprint
from reprobe_jax.jobs.reprobe_config import ReprobeConfig, Splits
from reprobe_jax.jobs.runs import Progress, Run, no_progress
from reprobe_jax.models import LanguageModel
from reprobe_jax.prm.model import PRM
from reprobe_jax.prm.report import Combined
from reprobe_jax.prm.train import PRMTrainConfig
from reprobe_jax.probe import ProbeConfig
from reprobe_jax.probe.bundle import ProbeBundle


@dataclasses.dataclass(frozen=True)
class ReprobeJob:
  """What every stage reads: the target, the config, the run folder, the PRM's training config (None: no PRM
  baseline) and the progress callback."""

  lm: LanguageModel
  cfg: ReprobeConfig
  run: Run
  prm: PRMTrainConfig | None = None
  tick: Progress = no_progress

  @functools.cached_property
  def fingerprint(self) -> str:
    """The target's fingerprint (`features.model_fingerprint`): what its features and probes were made from."""
    return model_fingerprint(self.lm)


LABELLED = Splits(*(f"trajectories_{split}.jsonl" for split in Splits._fields))  # the labelled trajectories' files


PER_FEATURE_SET = ("probe", "logreg", "fusion")  # the scorer kinds trained (or fitted) once per feature set
_RENDERED = re.compile(r"(\w+)\[(.+)\]")


@dataclasses.dataclass(frozen=True)
class ScorerId:
  """A step scorer in a job's tables: its kind (an uncertainty baseline's name, 'prm', or one of PER_FEATURE_SET)
  and, for the kinds of PER_FEATURE_SET, the feature set it reads ('hidden', 'attn+logit'). Rendered as
  'probe[hidden]' only where a table, a metrics file or a config names it."""

  kind: str
  feature_set: str = ""

  def __post_init__(self):
    if bool(self.feature_set) != (self.kind in PER_FEATURE_SET):
      raise ValueError(
        f"ScorerId: a {self.kind!r} scorer {'needs' if not self.feature_set else 'has no'} feature "
        f"set, got {self.feature_set!r}"
      )

  def __str__(self) -> str:
    return f"{self.kind}[{self.feature_set}]" if self.feature_set else self.kind

  @classmethod
  def parse(cls, name: str) -> ScorerId:
    """The id a rendered name stands for ('maxprob', 'prm', 'probe[hidden]'): a config entry, a stored file's key."""
    m = _RENDERED.fullmatch(name)
    return cls(m.group(1), m.group(2)) if m and m.group(1) in PER_FEATURE_SET else cls(name)

  @classmethod
  def probe(cls, feature_set: str) -> ScorerId:
    return cls("probe", feature_set)


PRM_ID = ScorerId("prm")

# Per-domain step scores of each scorer: {scorer: {domain: [steps of that domain's test trajectories]}}.
DomainScores = dict[ScorerId, dict[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class TrainedProbe:
  """A probe trained on one feature set (docs/method.md §A4): its config, the split module (graphdef, params, the
  rest of its state), the training history (one entry per epoch), and the bundle a step scorer is made from."""

  feature_set: str
  config: ProbeConfig
  graphdef: nnx.GraphDef
  params: nnx.State
  rest: nnx.State
  history: list[dict[str, Any]]
  bundle: ProbeBundle

  @property
  def best_val_pr_auc(self) -> float:
    return max(h["val_pr_auc"] for h in self.history)


@dataclasses.dataclass(frozen=True)
class TrainedPRM:
  """The PRM baseline trained beside the probes (docs/method.md §A7) in `folder`, with its training config."""

  config: PRMTrainConfig
  folder: str
  model: PRM


@dataclasses.dataclass(frozen=True)
class TestSteps:
  """The test steps the metrics read, per dataset: every test domain, and in line mode '<domain> (steps)', the
  same steps with the '<Answer>' lines unlabelled (their base rate differs by domain). labels: [steps] 1 incorrect,
  0 correct, NaN unknown; groups: [steps] the problem id of each (for the bootstrap); domain: whose scores a
  dataset reads."""

  labels: dict[str, np.ndarray]
  groups: dict[str, np.ndarray]
  domain: dict[str, str]


@dataclasses.dataclass(frozen=True)
class TestScores:
  """The test steps and the scores of the baselines, the probes and their linear baselines."""

  steps: TestSteps
  scores: DomainScores


@dataclasses.dataclass(frozen=True)
class PRMComparison:
  """The PRM's test scores beside the probes' (`scores`: 'prm' and the val-fitted 'fusion[<set>]' of each probe),
  read back from the step scores stored at `step_scores`, and the fusions and cascade (`combined`)."""

  prm: TrainedPRM
  step_scores: str
  scores: DomainScores
  combined: Combined
