"""Step-level beam search with a step scorer (docs/method.md §A7): B beams per prompt, N candidate next steps from each,
the newest step scored, the top B of B x N kept; every prompt of a call in one jitted search (`tts.search`)."""

from __future__ import annotations

from typing import Sequence

from reprobe_jax.errors import ConfigError
from reprobe_jax.features import FeatureSpec
from reprobe_jax.models import LanguageModel
from reprobe_jax.scorers import StepScorer
from reprobe_jax.tts.config import STRATEGIES, SearchConfig
from reprobe_jax.tts.result import PromptResult
from reprobe_jax.tts.search import run_search


@STRATEGIES.register("beam")
def beam_search(
  lm: LanguageModel,
  scorer: StepScorer,
  prompts,
  cfg: SearchConfig,
  *,
  mode: str = "line",
  feature_spec: FeatureSpec | None = None,
  prompt_seeds: Sequence[int] | None = None,
) -> list[PromptResult]:
  """One PromptResult per prompt: its cfg.beams final beams, best first (by the score of the step each was last
  ranked on), each with its steps' spans and scores. One group of width B (`search.run_search`)."""
  if not isinstance(cfg, SearchConfig) or cfg.strategy != "beam":
    raise ConfigError(f"beam_search runs SearchConfig(strategy='beam'), got {getattr(cfg, 'strategy', cfg)!r}")
  return run_search(
    lm, scorer, prompts, cfg, groups=1, width=cfg.beams, mode=mode, feature_spec=feature_spec, prompt_seeds=prompt_seeds
  )
