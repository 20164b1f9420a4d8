"""Test-time scaling with a step scorer (docs/method.md §A7): Best-of-N, voting, step-level beam search and DVTS.

One short file per strategy over the shared `SearchConfig` (search-and-learn's layout); every strategy returns one
`PromptResult` per prompt (its finished candidates with their per-step scores), and `select` turns those into
answers (trajectory-score aggregation, majority and score-weighted votes, pass@N).
"""

from reprobe_jax.tts.config import AGGREGATIONS, STRATEGIES, SearchConfig
from reprobe_jax.tts.result import Candidate, PromptResult

# Imported in this order, the strategies register as 'best_of_n', 'beam', 'dvts'.
from reprobe_jax.tts.best_of_n import best_of_n
from reprobe_jax.tts.beam import beam_search
from reprobe_jax.tts.dvts import dvts
from reprobe_jax.tts.select import Outcome, first_k, summarize

__all__ = [
  "AGGREGATIONS",
  "STRATEGIES",
  "Candidate",
  "Outcome",
  "PromptResult",
  "SearchConfig",
  "beam_search",
  "best_of_n",
  "dvts",
  "first_k",
  "summarize",
]
