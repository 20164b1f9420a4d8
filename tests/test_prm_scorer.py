"""The PRM as a step scorer: in beam search and DVTS its incremental scores (its own KV cache, each step
appended once) equal the PRM on each kept candidate's whole text; Best-of-N scores every step of every row; a PRM
of another vocabulary and a newest-step call are refused."""

from __future__ import annotations

import numpy as np
import pytest

from reprobe_jax.errors import ConfigError
from reprobe_jax.models import LanguageModel, SamplingParams
from reprobe_jax.prm.model import from_target
from reprobe_jax.scorers import PRMScorer, get_scorer
from reprobe_jax.tts import SearchConfig
from reprobe_jax.tts.beam import beam_search
from reprobe_jax.tts.best_of_n import best_of_n
from reprobe_jax.tts.dvts import dvts

from test_scorer_carry import CFG, _own_scores
from test_tts_search import MODEL, PROMPTS, lm  # noqa: F401 (the tiny word-level model of the search tests)


@pytest.fixture(scope="module")
def scorer(lm):  # noqa: F811
  return get_scorer("prm", prm=from_target(lm, separator_id=0, seed=3))


def _check(results, scorer, *, last_too):
  checked = 0
  for prompt, res in zip(PROMPTS, results):
    for cand in res.candidates:
      own = _own_scores(scorer, prompt, cand)
      # a last step that ended on EOS was scored with that EOS, which the candidate's response drops
      k = len(own) if last_too or cand.finish_reason != "eos" else len(own) - 1
      np.testing.assert_allclose(cand.step_scores[:k], own[:k], atol=1e-5)
      checked += k
  return checked


@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
@pytest.mark.parametrize("strategy", ["beam", "dvts"])
def test_search_scores_equal_the_prm_on_each_whole_text(lm, scorer, strategy):  # noqa: F811
  run = beam_search if strategy == "beam" else dvts
  got = run(lm, scorer, PROMPTS, SearchConfig(strategy, beams=2, **CFG), prompt_seeds=[4, 5, 6])
  assert _check(got, scorer, last_too=False) >= 6
  scores = [s for r in got for c in r.candidates for s in c.step_scores]
  assert np.std(scores) > 1e-4  # the rewards differ between steps: the comparison can fail


@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_best_of_n_scores_every_step_with_the_whole_text(lm, scorer):  # noqa: F811
  cfg = SearchConfig("best_of_n", n=3, max_steps=4, max_new_tokens=24, sampling=SamplingParams(1.0, top_k=0, top_p=1.0))
  results = best_of_n(lm, scorer, PROMPTS, cfg, prompt_seeds=[1, 2, 3])
  assert _check(results, scorer, last_too=True) >= 9
  # the test-time-scaling job rescores stored candidates the same way (fusion and cascade read these scores)
  from reprobe_jax.jobs.tts_cells import rescore, with_scores

  again = rescore(scorer, PROMPTS, results)
  for res, per in zip(results, again):
    for cand, s in zip(res.candidates, per):
      np.testing.assert_allclose(s, cand.scores, atol=1e-5)
  flipped = with_scores(results, [[1 - s for s in per] for per in again])
  assert [c.steps for r in flipped for c in r.candidates] == [c.steps for r in results for c in r.candidates]
  np.testing.assert_allclose(flipped[0].candidates[0].scores, 1 - again[0][0])


def test_a_prm_of_another_vocabulary_and_newest_step_calls_are_refused(lm, scorer):  # noqa: F811
  other = LanguageModel.random(MODEL.replace(vocab_size=MODEL.vocab_size + 5), seed=1)
  wrong = PRMScorer(from_target(other, separator_id=0))
  with pytest.raises(ConfigError, match=r"vocabulary has 69 tokens and the target's 64"):
    beam_search(lm, wrong, PROMPTS, SearchConfig("beam", beams=2, **CFG))
  with pytest.raises(ConfigError, match="after the steps before it"):
    scorer.score_newest(None, None)
  with pytest.raises(ConfigError, match="exactly one of prm= or path="):
    get_scorer("prm")
