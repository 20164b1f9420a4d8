"""Step scorers (docs/method.md §A6, §A7): one interface over the probe, the uncertainty baselines and the PRM.

`get_scorer(name, **kwargs)` builds one; `score(scorer, inputs, spans)` -> [B, S] and `score_newest(scorer,
inputs, newest_span)` -> [B] run it jitted; `scorer.score` / `scorer.score_newest` are the pure versions to call
inside another jitted program (a search loop).
"""

from reprobe_jax.scorers.base import (
  PendingScores,
  ScoreInputs,
  StepScorer,
  bad_scores,
  checked_scores,
  inputs_from_state,
  nonfinite_error,
  prompt_rows,
  score,
  score_newest,
  scorer_name,
  step_token_mask,
  take_carry,
)
from reprobe_jax.scorers.registry import SCORERS, get_scorer, register_scorer
from reprobe_jax.scorers.uncertainty import BASELINES, UncertaintyScorer
from reprobe_jax.scorers.probe import ProbeScorer
from reprobe_jax.scorers.prm import PRMScorer
from reprobe_jax.scorers.batching import pad_rows, record_rows, score_rows

__all__ = [
  "BASELINES",
  "SCORERS",
  "PRMScorer",
  "PendingScores",
  "ProbeScorer",
  "ScoreInputs",
  "StepScorer",
  "UncertaintyScorer",
  "bad_scores",
  "checked_scores",
  "get_scorer",
  "inputs_from_state",
  "nonfinite_error",
  "pad_rows",
  "prompt_rows",
  "record_rows",
  "register_scorer",
  "score",
  "score_newest",
  "score_rows",
  "scorer_name",
  "step_token_mask",
  "take_carry",
]
