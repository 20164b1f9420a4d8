"""The RL run's settings (docs/method.md §B2): `RLConfig`, and the loss and sampling each estimator is trained with
by default (`METHODS`: a method is an estimator plus these; any of them can be overridden in RLConfig).

GRPO: group z-score, sequence-mean token-mean loss, symmetric clip 0.2, no dynamic sampling. DAPO: group z-score,
token-mean, clip 0.2 / 0.28, dynamic sampling. RF-B (group mean baseline, batch whitening) and SPAE take DAPO's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from reprobe_jax.errors import ConfigError
from reprobe_jax.fields import SEED, Int, OneOf, Real, Seq, check_fields, field_name
from reprobe_jax.models.sampling import SamplingParams
from reprobe_jax.rl import advantages as adv_lib
from reprobe_jax.rl import loss as loss_lib
from reprobe_jax.tasks import DIFFICULTIES, TASKS
from reprobe_jax.tasks.data import DATA_TASK, DataConfig, no_data_file
from reprobe_jax.train.optimizer import OptimizerConfig


def config_key(cfg) -> dict:
  """A job config with a `data` field as run keys and checkpoints read it: without `data` on the synthetic world (the
  key it had before data files existed)."""
  out = dataclasses.asdict(cfg)
  if not cfg.data.enabled:
    del out["data"]
  return out


def problems_fingerprint(problems) -> str:
  """Hash of a data run's problems, so other problems in the file at the same path give another run folder."""
  return hashlib.sha256(json.dumps([p.to_json() for p in problems], sort_keys=True).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Method:
  """The loss and sampling an estimator is trained with (the defaults RLConfig's None fields take)."""

  aggregation: str
  clip_high: float
  dynamic_sampling: bool


_DAPO = Method(aggregation="token-mean", clip_high=0.28, dynamic_sampling=True)
METHODS = {
  "grpo": Method(aggregation="seq-mean-token-mean", clip_high=0.2, dynamic_sampling=False),
  "dapo": _DAPO,
  "rf_b": _DAPO,
  "spae": _DAPO,
}


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """advantage: an estimator's name (`advantages.ESTIMATORS`). Per step: `prompts_per_step` groups of
  `group_size` samples are trained on; rollout rounds draw `prompts_per_round` (>= prompts_per_step: the first
  round rolls out every group the step trains on) prompts each, at most 1 + max_refill_rounds rounds when dynamic
  sampling refills the groups it dropped. mini_batches: optimizer updates per rollout batch (clipping acts from the
  second); micro_batches: gradient accumulation within each. dynamic_sampling, clip_high (the loss's upper clip,
  r <= 1 + clip_high) and aggregation ('token-mean' or 'seq-mean-token-mean'): None takes the method's default
  (`METHODS`). Train prompts: `train_problems` problems per difficulty of each train domain from the RL train split
  (disjoint from the target's own data and from val / test); on a data file (`data`), the file's train split in the
  order `tasks.data.PromptOrder` draws it (the train domains, difficulties and problem count are then not read;
  train_domains ('math',) without a file is refused: `no_data_file`)."""

  advantage: str = "spae"
  steps: int = 20
  prompts_per_step: int = 8
  group_size: int = 8
  prompts_per_round: int = 8
  max_refill_rounds: int = 2
  dynamic_sampling: bool | None = None
  max_new_tokens: int = 192
  sampling: SamplingParams = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)  # of the rollouts: top_k stays 0
  optimizer: OptimizerConfig = OptimizerConfig(
    learning_rate=5e-4, schedule="constant", warmup_steps=0, weight_decay=0.0, grad_clip=1.0
  )
  mini_batches: int = 2
  micro_batches: int = 1
  clip_low: float = 0.2
  clip_high: float | None = None
  aggregation: str | None = None
  kl_coef: float = 0.0
  alpha: float = 0.5
  xi: float = 0.5
  train_domains: tuple[str, ...] = ("arithmetic",)
  train_difficulties: tuple[int, ...] = (1, 2, 3)
  train_problems: int = 200
  few_shot: int = 0
  seed: int = 0
  log_every: int = 1
  checkpoint_every: int = 10
  data: DataConfig = DataConfig()

  def __post_init__(self):
    check_fields(self, {"advantage": OneOf(adv_lib.ESTIMATORS.names())})  # the ones registered now, by field
    check_fields(
      self,
      {
        "steps": Int(1),
        "prompts_per_step": Int(1),
        "group_size": Int(2),
        "prompts_per_round": Int(1),
        "max_refill_rounds": Int(0),
        "max_new_tokens": Int(1),
        "mini_batches": Int(1),
        "micro_batches": Int(1),
        "clip_low": Real(0.0, 1.0),
        "kl_coef": Real(0.0),
        "alpha": Real(0.0, 1.0),
        "xi": Real(0.0),
        "train_domains": Seq(OneOf(TASKS.names())),
        "train_difficulties": Seq(OneOf(DIFFICULTIES)),
        "train_problems": Int(1),
        "few_shot": Int(0),
        "seed": SEED,
        "log_every": Int(1),
        "checkpoint_every": Int(1),
      },
    )
    check_fields(self.sampling, {"temperature": Real(0.0, low_open=True)}, field_name(self, "sampling"))
    if self.sampling.top_k != 0:
      raise ConfigError(
        f"{field_name(self, 'sampling')}.top_k: expected 0 (off), got {self.sampling.top_k!r}: the "
        "RL rollouts never filter by top-k (temperature and top_p are theirs to set)"
      )
    # None takes the method's default (`METHODS`); a value is checked as LossConfig checks it, named here.
    overrides = {
      "clip_high": Real(0.0),
      "aggregation": OneOf(loss_lib.AGGREGATIONS),
      "dynamic_sampling": OneOf((True, False)),
    }
    check_fields(self, {k: rule for k, rule in overrides.items() if getattr(self, k) is not None})
    if self.prompts_per_round < self.prompts_per_step:
      raise ConfigError(
        f"{field_name(self, 'prompts_per_round')}={self.prompts_per_round} is below "
        f"{field_name(self, 'prompts_per_step')}={self.prompts_per_step}: a step's first round must roll out every "
        "group it trains on (further rounds only refill groups that dynamic sampling dropped)"
      )
    if not self.train_domains or not self.train_difficulties:
      raise ConfigError(f"{field_name(self, 'train_domains')} and train_difficulties must not be empty")
    if not isinstance(self.data, DataConfig):
      raise ConfigError(f"{field_name(self, 'data')}: expected a DataConfig, got {self.data!r}")
    if DATA_TASK in self.train_domains and not self.data.enabled:
      raise no_data_file(field_name(self, "train_domains"))
    rows = self.prompts_per_step * self.group_size
    if rows % self.mini_batches or (rows // self.mini_batches) % self.micro_batches:
      raise ConfigError(
        f"{field_name(self, 'mini_batches')}={self.mini_batches} and micro_batches="
        f"{self.micro_batches} must divide the {rows} rows of a step (prompts_per_step x "
        "group_size), micro-batches within each mini-batch"
      )

  @property
  def method(self) -> Method:
    base = METHODS.get(self.advantage, _DAPO)
    return Method(
      aggregation=self.aggregation or base.aggregation,
      clip_high=base.clip_high if self.clip_high is None else self.clip_high,
      dynamic_sampling=base.dynamic_sampling if self.dynamic_sampling is None else self.dynamic_sampling,
    )

  @property
  def rounds(self) -> int:
    return 1 + (self.max_refill_rounds if self.method.dynamic_sampling else 0)

  def loss_config(self) -> loss_lib.LossConfig:
    m = self.method
    return loss_lib.LossConfig(
      clip_low=self.clip_low, clip_high=m.clip_high, aggregation=m.aggregation, kl_coef=self.kl_coef
    )
