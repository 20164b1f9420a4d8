"""Diverse verifier tree search (docs/method.md §A7, search-and-learn's DVTS): the budget split into B independent
subtrees per prompt, each a beam of width 1 over N candidate next steps (optionally scored after a k-step greedy
lookahead); every prompt of a call in one jitted search (`tts.search`)."""

from __future__ import annotations

from typing import Sequence

from reprobe_jax.errors import ConfigError
from reprobe_jax.features import FeatureSpec
from reprobe_jax.models import LanguageModel
from reprobe_jax.scorers import StepScorer
from reprobe_jax.tts.config import STRATEGIES, SearchConfig
from reprobe_jax.tts.result import PromptResult
from reprobe_jax.tts.search import run_search


@STRATEGIES.register("dvts")
def dvts(
  lm: LanguageModel,
  scorer: StepScorer,
  prompts,
  cfg: SearchConfig,
  *,
  mode: str = "line",
  feature_spec: FeatureSpec | None = None,
  prompt_seeds: Sequence[int] | None = None,
) -> list[PromptResult]:
  """One PromptResult per prompt: the finished trajectory of each of its cfg.beams subtrees, in subtree order (the
  final pick among them, by trajectory score or vote, is `tts.select`'s). B groups of width 1 (`search.run_search`)."""
  if not isinstance(cfg, SearchConfig) or cfg.strategy != "dvts":
    raise ConfigError(f"dvts runs SearchConfig(strategy='dvts'), got {getattr(cfg, 'strategy', cfg)!r}")
  return run_search(
    lm, scorer, prompts, cfg, groups=cfg.beams, width=1, mode=mode, feature_spec=feature_spec, prompt_seeds=prompt_seeds
  )
