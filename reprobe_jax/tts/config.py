"""The configuration every test-time-scaling strategy shares (docs/method.md §A7), checked whole before any work
starts."""

from __future__ import annotations

import dataclasses
from typing import Callable

from reprobe_jax.fields import SEED, Int, OneOf, check_fields, field_name
from reprobe_jax.errors import ConfigError
from reprobe_jax.models.sampling import SamplingParams
from reprobe_jax.registry import Registry
from reprobe_jax.tts.result import PromptResult

# name -> the strategy's function `fn(lm, scorer, prompts, cfg, *, mode, feature_spec, prompt_seeds)` -> one
# PromptResult per prompt. Each strategy's module registers itself; the package imports them in the order
# 'best_of_n', 'beam', 'dvts' (the TTS job's default grid order).
STRATEGIES: Registry[Callable[..., list[PromptResult]]] = Registry("search strategy")
# How a trajectory's per-step scores (higher = more likely incorrect) become one trajectory score (higher = worse):
# 'min' is the paper's min over steps of P(correct), i.e. the worst step's score; 'product' is 1 - prod P(correct)
# and needs scores that are probabilities (the probe, a PRM).
AGGREGATIONS = ("min", "mean", "last", "product")
# Upper bounds of the int fields that become shapes or int32 arrays of the compiled search (rows per prompt, the step
# slots, the token budget, the unrolled lookahead): a larger value is a ConfigError naming the field, not an
# OverflowError deep in a jit or a program too large to compile.
MAX_ROWS = 4096  # n x beams decode rows per prompt
MAX_STEPS = 4096  # step slots per row
MAX_NEW_TOKENS = 2**20  # tokens per trajectory (a target's context bounds it further)
MAX_LOOKAHEAD = 16  # greedy steps past a candidate, each one unrolled into the search program


@dataclasses.dataclass(frozen=True)
class SearchConfig:
  """One strategy's shape. n: trajectories per prompt (best_of_n) or candidate next steps sampled from each beam
  (beam, dvts); beams: the beam width B (beam) or the number of independent subtrees (dvts), 1 for best_of_n;
  max_steps: steps per trajectory before a row is finished; max_new_tokens: each trajectory's token budget;
  lookahead: greedy steps taken past a candidate before it is scored (beam, dvts; the candidate is kept, not the
  lookahead); aggregation: the trajectory score that picks the final answer; sampling: how each token is drawn
  (temperature 0 = greedy); seed: the search's base seed (each prompt's randomness comes from its own seed, so a
  prompt gets the same result in any batch)."""

  strategy: str = "beam"
  n: int = 4
  beams: int = 1
  max_steps: int = 12
  max_new_tokens: int = 96
  lookahead: int = 0
  aggregation: str = "min"
  sampling: SamplingParams = SamplingParams(temperature=1.0, top_k=50, top_p=0.95)
  seed: int = 0
  dedupe: bool = False  # beam, dvts: a candidate whose whole response equals a better one's of its group is kept
  #                       only when the group has no other candidate left (search-and-learn's filter_duplicates)

  def __post_init__(self):
    check_fields(
      self,
      {
        "strategy": OneOf(STRATEGIES.names()),
        "n": Int(1, MAX_ROWS),
        "beams": Int(1, MAX_ROWS),
        "max_steps": Int(1, MAX_STEPS),
        "max_new_tokens": Int(1, MAX_NEW_TOKENS),
        "lookahead": Int(0, MAX_LOOKAHEAD),
        "aggregation": OneOf(AGGREGATIONS),
        "seed": SEED,
        "dedupe": OneOf((False, True)),
      },
    )
    if self.n * self.beams > MAX_ROWS:
      raise ConfigError(
        f"{field_name(self, 'n')}: n x beams = {self.n} x {self.beams} decode rows per prompt, at most {MAX_ROWS}"
      )
    if not isinstance(self.sampling, SamplingParams):
      raise ConfigError(
        f"{field_name(self, 'sampling')}: expected a SamplingParams, got {type(self.sampling).__name__}"
      )
    if self.strategy == "best_of_n" and self.beams != 1:
      raise ConfigError(
        f"{field_name(self, 'beams')}: best_of_n has no beams (use n for its trajectories), got {self.beams}"
      )
    if self.strategy == "best_of_n" and self.dedupe:
      raise ConfigError(f"{field_name(self, 'dedupe')}: best_of_n samples independent trajectories, nothing to dedupe")
    if self.strategy == "best_of_n" and self.lookahead:
      raise ConfigError(f"{field_name(self, 'lookahead')}: best_of_n scores whole trajectories, it has no lookahead")

  @property
  def rows_per_prompt(self) -> int:
    """Decode rows a prompt holds at once: its N trajectories, or its B beams x N candidates."""
    return self.n * self.beams

  @property
  def steps_per_round(self) -> int:
    """Steps a prompt samples per search round (beam, dvts): B x N candidates, each extended by the lookahead.
    Best-of-N samples rows_per_prompt whole trajectories instead; equal budgets compare PromptResult.sampled_steps."""
    return self.n * self.beams * (1 + self.lookahead)
