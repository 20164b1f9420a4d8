"""The test-time-scaling grid's config: which strategies, step scorers, budgets and domains (checked whole when
made), its parsing from the CLI's mapping, and how a budget is shaped into beams x candidates."""

from __future__ import annotations

import dataclasses

from reprobe_jax.errors import ConfigError
from reprobe_jax.fields import Int, OneOf, Real, Seq, check_fields, field_name, plain, replace_fields
from reprobe_jax.jobs.reprobe_config import ReprobeConfig
from reprobe_jax.jobs.reprobe_records import PRM_ID, ScorerId
from reprobe_jax.prm.train import PRMTrainConfig
from reprobe_jax.tasks.data import DATA_TASK, no_data_file
from reprobe_jax.scorers import BASELINES
from reprobe_jax.tasks import TASKS
from reprobe_jax.tts.config import AGGREGATIONS, MAX_LOOKAHEAD, MAX_ROWS, MAX_STEPS, STRATEGIES

DVTS_CANDIDATES = 4  # N per subtree; the budget's rest is subtrees (search-and-learn's DVTS default shape)
# The step searches and the smallest budget they run at: at B x N = 1 a search has nothing to choose between (it is
# Best-of-N at N = 1), so their cells skip budget 1, and a grid whose every budget is 1 would give them empty cells.
STEP_SEARCHES = ("beam", "dvts")
MIN_SEARCH_BUDGET = 2


class ScorerName:
  """A config rule: a baseline name (scorers.BASELINES), 'prm' (the PRM trained by the ReProbe job, config.prm) or
  'probe[<feature set>]'."""

  def ok(self, v) -> bool:
    if not isinstance(v, str):
      return False
    sid = ScorerId.parse(v)
    return v in BASELINES or sid == PRM_ID or (sid.kind == "probe" and bool(sid.feature_set))

  def __str__(self) -> str:
    return f"one of {BASELINES}, 'prm' or 'probe[<feature set>]'"


@dataclasses.dataclass(frozen=True)
class TTSConfig:
  """The grid. problems: per domain, spread evenly over the ReProbe split (all difficulties); budgets: trajectories
  per problem for Best-of-N and the votes, B x N for beam search and DVTS; scorers: the step scorers each strategy
  is run with; aggregation: the trajectory score that picks Best-of-N's answer and ranks finished beams; max_steps:
  steps per trajectory; lookahead: greedy steps before a candidate is scored (beam, DVTS); temperature: of every
  sampled strategy (top-k and top-p are the ReProbe trajectories' `sampling`); split: 'test' for the reported
  numbers, 'val' to choose settings (the test split is never used to choose anything); dedupe: beam search keeps
  distinct trajectories (`SearchConfig.dedupe`)."""

  problems: int = 60
  # The grid's domains: any registered task the ReProbe split holds. On a data file (config.data) the default is
  # replaced by the split's own domains ('math'; `grid_domains`).
  domains: tuple[str, ...] = ("arithmetic", "planning", "qa")
  scorers: tuple[str, ...] = ("probe[attn+logit]", "probe[hidden]", "maxprob", "perplexity", "mean_entropy", "random")
  strategies: tuple[str, ...] = STRATEGIES.names()  # ('best_of_n', 'beam', 'dvts')
  budgets: tuple[int, ...] = (1, 2, 4, 8, 16)
  aggregation: str = "min"
  max_steps: int = 12
  lookahead: int = 0
  temperature: float = 1.0
  split: str = "test"
  dedupe: bool = False

  def __post_init__(self):
    check_fields(
      self,
      {
        "problems": Int(1),
        "domains": Seq(OneOf(TASKS.names())),
        "scorers": Seq(ScorerName()),
        "strategies": Seq(OneOf(STRATEGIES.names())),
        "budgets": Seq(Int(1, MAX_ROWS)),
        "aggregation": OneOf(AGGREGATIONS),
        "max_steps": Int(1, MAX_STEPS),
        "lookahead": Int(0, MAX_LOOKAHEAD),
        "temperature": Real(0.0, low_open=True),
        "split": OneOf(("val", "test")),
        "dedupe": OneOf((False, True)),
      },
    )
    if tuple(sorted(self.budgets)) != self.budgets:
      raise ConfigError(f"{field_name(self, 'budgets')}: expected increasing budgets, got {self.budgets}")
    searched = [s for s in self.strategies if s in STEP_SEARCHES]
    if searched and max(self.budgets) < MIN_SEARCH_BUDGET:
      raise ConfigError(
        f"{field_name(self, 'budgets')}: strategy {searched[0]!r} needs a budget >= {MIN_SEARCH_BUDGET} (B x N = 1 "
        f"has nothing to choose between: it is Best-of-N at N = 1), got {self.budgets}; add a budget >= "
        f"{MIN_SEARCH_BUDGET} or drop {searched} from {field_name(self, 'strategies')}"
      )

  @property
  def scorer_ids(self) -> list[ScorerId]:
    """`scorers` as ids, in the config's order."""
    return [ScorerId.parse(name) for name in self.scorers]


def grid_domains(cfg: ReprobeConfig, tcfg: TTSConfig) -> tuple[str, ...]:
  """The domains the grid runs: `tcfg.domains`, or on a data file the ReProbe split's domains ('math') when
  `tcfg.domains` is the default. ConfigError, before any work, naming `config.tts.domains` for a domain the split
  lacks: a synthetic family on a data file, or 'math' (the data file's task) when no file is named."""
  if cfg.data.enabled and tcfg.domains == TTSConfig.domains:
    return tuple(cfg.domains)
  held = cfg.domains if tcfg.split == "test" else list(cfg.in_domains)  # val: the training domains only
  lacking = [d for d in tcfg.domains if d not in held]
  if DATA_TASK in lacking and not cfg.data.enabled:
    raise no_data_file("config.tts.domains")
  if lacking:
    raise ConfigError(
      f"config.tts.domains: the {tcfg.split} split has no {lacking[0]!r} problems (its domains: {held})"
    )
  return tuple(tcfg.domains)


def beam_shape(budget: int) -> tuple[int, int]:
  """(B, N) with B x N = budget and B <= N as close as powers of two allow: 4 -> (2, 2), 8 -> (2, 4), 16 -> (4, 4).
  A budget that is not a power of two gets B = 1."""
  if budget & (budget - 1):
    return 1, budget
  b = 1 << ((budget.bit_length() - 1) // 2)
  return b, budget // b


def dvts_shape(budget: int) -> tuple[int, int]:
  """(subtrees B, candidates N) with B x N = budget: N = DVTS_CANDIDATES where the budget allows."""
  n = DVTS_CANDIDATES if budget % DVTS_CANDIDATES == 0 else budget
  return budget // n, n


def tts_config_from_dict(d) -> TTSConfig:
  """The CLI's `config.tts` section -> TTSConfig, checked whole (ConfigError naming `config.tts.<field>`)."""
  return replace_fields(TTSConfig(), plain(d), root="config.tts")


def check_prm(tcfg: TTSConfig, prm: PRMTrainConfig | None) -> None:
  """ConfigError when the grid names 'prm' but the run has no PRM config (config.prm.enabled)."""
  if PRM_ID in tcfg.scorer_ids and prm is None:
    raise ConfigError(
      "config.tts.scorers names 'prm', but config.prm.enabled is False: the PRM baseline is the one "
      "the ReProbe job trains (config.prm)"
    )
