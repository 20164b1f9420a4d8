"""Test-time scaling with a step scorer (METHOD A7): Best-of-N, voting, step-level beam search and DVTS.

One short file per strategy over the shared `SearchConfig` (search-and-learn's layout); every strategy returns one
`PromptResult` per prompt (its finished candidates with their per-step scores), and `select` turns those into
answers (trajectory-score aggregation, majority and score-weighted votes, pass@N).
"""

from reprobe_jax.tts.config import AGGREGATIONS, STRATEGIES, SearchConfig
from reprobe_jax.tts.result import Candidate, PromptResult

__all__ = ["AGGREGATIONS", "STRATEGIES", "Candidate", "PromptResult", "SearchConfig"]
