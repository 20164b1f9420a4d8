"""The built-in target's build config: everything that decides the built model (its hash names the output folder),
checked whole when made, and its parsing from the CLI's mapping."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Mapping

from reprobe_jax.errors import ConfigError
from reprobe_jax.fields import (
  SEED,
  Int,
  OneOf,
  Pairs,
  Real,
  Seq,
  check_fields,
  check_seed,
  field_name,
  plain,
  replace_fields,
  sorted_pairs,
)
from reprobe_jax.jobs.runs import run_key
from reprobe_jax.synthetic.train_lm import TRAIN_LM_RULES, TrainLMConfig
from reprobe_jax.tasks import DIFFICULTIES, make_problems
from reprobe_jax.tasks.formats import MODES, user_prompt
from reprobe_jax.tasks.traces import WORLDS, TraceNoise, solve_many

FAMILIES = ("arithmetic", "planning", "qa")


@dataclasses.dataclass(frozen=True)
class TinyLMShape:
  hidden_size: int = 192
  intermediate_size: int = 512
  num_layers: int = 4
  num_heads: int = 4
  num_kv_heads: int = 2
  max_position_embeddings: int = 1024

  def __post_init__(self):
    check_fields(self, {name: Int(1) for name in (f.name for f in dataclasses.fields(self))})
    head_dim, rest = divmod(self.hidden_size, self.num_heads)
    if rest or head_dim % 2:  # rotary embeddings rotate pairs of a head's dimensions
      raise ConfigError(
        f"{field_name(self, 'num_heads')}: expected a divisor of hidden_size={self.hidden_size} "
        f"that leaves an even head size, got {self.num_heads}"
      )
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(
        f"{field_name(self, 'num_kv_heads')}: expected a divisor of num_heads={self.num_heads}, got {self.num_kv_heads}"
      )


@dataclasses.dataclass(frozen=True)
class SyntheticBuildConfig:
  """Everything that decides the built model; its hash names the output folder."""

  seed: int = 0
  train_problems_per_difficulty: int = 600  # per difficulty (1, 2, 3), times the family's weight
  # In-domain arithmetic gets more of the budget than the out-of-domain families (whose prompts are also longer).
  family_weights: tuple[tuple[str, float], ...] = (("arithmetic", 2.0), ("planning", 1.0), ("qa", 1.0))
  prompt_loss_weight: float = 0.2
  # Share of the training problems that also get a thinking-mode trace (every problem gets a line-mode one). The
  # in-domain line-mode skill is what the quality band measures and it needs most of the budget; re-checking is
  # learned from far fewer thinking traces.
  thinking_fraction: float = 1.0
  # Share of the thinking traces that also teach answering when interrupted at a boundary (the SPAE target's
  # skill, synthetic/interrupt.py); 0 = none (and the field stays out of the config's hash, so older builds keep
  # their folders). interrupt_guess_share: how often an unfinished chain answers another problem's answer instead
  # of its running value.
  interrupt_share: float = 0.0
  interrupt_guess_share: float = 0.25
  interrupt_loss_weight: float = 4.0  # the weight of an interrupted answer's tokens in the loss (a trace's: 1)
  eval_problems_per_family: int = 64
  difficulties: tuple[int, ...] = (1, 2, 3)
  # The world the traces come from (docs/tasks.md, "Worlds"): 'v2' or 'v3'. `noise` starts from the world's own
  # TraceNoise (`traces.WORLDS`) when it is not given; overrides of single fields apply on top of it.
  world: str = "v2"
  noise: TraceNoise | None = None
  vocab_size: int = 1024
  model: TinyLMShape = TinyLMShape()
  train: TrainLMConfig = TrainLMConfig()
  buckets: tuple[int, ...] = (128, 192, 256, 384)
  eval_temperature: float = 1.0
  max_new_tokens: tuple[tuple[str, int], ...] = (("line", 96), ("thinking", 192))

  def __post_init__(self):
    check_fields(
      self,
      {
        "seed": SEED,
        "train_problems_per_difficulty": Int(1),
        "family_weights": Pairs(OneOf(FAMILIES), Real(0.0)),
        "prompt_loss_weight": Real(0.0),
        "thinking_fraction": Real(0.0, 1.0, low_open=True),
        "eval_problems_per_family": Int(1),
        "interrupt_share": Real(0.0, 1.0),
        "interrupt_guess_share": Real(0.0, 1.0),
        "interrupt_loss_weight": Real(0.0, low_open=True),
        "difficulties": Seq(OneOf(DIFFICULTIES)),
        "world": OneOf(tuple(WORLDS)),
        "vocab_size": Int(1),
        "buckets": Seq(Int(1)),
        "eval_temperature": Real(0.0),
        "max_new_tokens": Pairs(OneOf(MODES), Int(1), MODES),
      },
    )
    if self.noise is None:
      object.__setattr__(self, "noise", WORLDS[self.world])
    for name, cls in (("noise", TraceNoise), ("model", TinyLMShape), ("train", TrainLMConfig)):
      if not isinstance(getattr(self, name), cls):
        raise ConfigError(f"{field_name(self, name)}: expected a {cls.__name__}, got {getattr(self, name)!r}")
    check_fields(self.train, TRAIN_LM_RULES, where=field_name(self, "train"))

  def key(self) -> str:
    """Hash of the config and of what the task code makes from it (a changed generator, prompt or solver
    rebuilds instead of reusing a model trained on other data)."""
    return run_key(keyed_fields(dataclasses.asdict(self)), _task_code_fingerprint(self))


INTERRUPT_FIELDS = ("interrupt_share", "interrupt_guess_share", "interrupt_loss_weight")


def keyed_fields(d: Mapping) -> dict:
  """A build config's fields (a dict) as its key hashes them: without the fields added later while they are at the
  value that means 'as before', so older builds keep their keys, and so do the bands made with them
  (`reprobe_jax.jobs.bands.band_key`): the interrupted-thinking ones when interrupt_share is 0, `world` when it is
  'v2', and the noise's `procedures` when there are none."""
  d = dict(d)
  if not d.get("interrupt_share"):
    for name in INTERRUPT_FIELDS:
      d.pop(name, None)
  if d.get("world", "v2") == "v2":
    d.pop("world", None)
  if isinstance(d.get("noise"), Mapping) and not d["noise"].get("procedures"):
    d["noise"] = {k: v for k, v in d["noise"].items() if k != "procedures"}
  return d


def _task_code_fingerprint(cfg: "SyntheticBuildConfig") -> str:
  """A few problems of every family and difficulty, their prompts and noisy traces in both formats, hashed."""
  h = hashlib.sha256()
  for family in FAMILIES:
    for d in cfg.difficulties:
      problems = make_problems(family, 4, cfg.seed, d)
      for mode in MODES:
        for p, t in zip(problems, solve_many(problems, mode, cfg.seed, cfg.noise)):
          h.update(json.dumps([p.to_json(), user_prompt(p, mode), t.text]).encode())
  return h.hexdigest()


def config_from_dict(c, root: str = "config") -> SyntheticBuildConfig:
  """The CLI's ml_collections ConfigDict -> the frozen build config (library code never sees a ConfigDict),
  checked whole; errors name fields under `root` (e.g. 'config.target' when a ReProbe job builds its target)."""
  d = plain(c)
  d.pop("job", None)
  d.pop("workdir", None)
  train = d.pop("train", {})
  if isinstance(train, Mapping):  # the training seed follows the build's seed unless the config sets it
    if "seed" in d:  # named as the user wrote it, before the training seed copied from it is checked
      check_seed(d["seed"], f"{root}.seed")
    train = {"seed": d.get("seed", SyntheticBuildConfig.seed), **train}
  world = d.pop("world", SyntheticBuildConfig.world)
  if world not in WORLDS:
    raise ConfigError(f"{root}.world: expected one of {sorted(WORLDS)}, got {world!r}")
  return replace_fields(
    SyntheticBuildConfig(world=world),  # the world's noise, then the overrides of its fields
    {**d, "train": train},
    convert={"family_weights": sorted_pairs, "max_new_tokens": sorted_pairs},
    root=root,
  )
