"""Test-time scaling on the built-in default (issue 14): greedy, majority vote, Best-of-N, weighted vote, beam
search and DVTS with the probes and the uncertainty baselines as step scorers, at equal sample budgets.

    python eval.py --config=configs/tts_synthetic.py                     # the whole grid (reuses the ReProbe run)
    python eval.py --config=configs/tts_synthetic.py --config.tts.problems=20 --config.tts.budgets=1,2,4
    python eval.py --config=configs/tts_synthetic.py --config.tts.lookahead=1

The target and the probes come from the ReProbe job's cache (configs/reprobe_synthetic.py: same workdir, same run
folder); what is missing is built first. Outputs: <run folder>/tts/<key>/{metrics.json, table.md, accuracy.png}.
"""

import ml_collections

from configs import reprobe_synthetic


def get_config() -> ml_collections.ConfigDict:
  c = reprobe_synthetic.get_config()
  c.job = "tts"
  c.tts = ml_collections.ConfigDict(dict(
      problems=60,  # per domain, spread evenly over the ReProbe test split
      domains=("arithmetic", "planning", "qa"),
      scorers=("probe[attn+logit]", "probe[hidden]", "maxprob", "perplexity", "mean_entropy", "random"),
      strategies=("best_of_n", "beam", "dvts"),
      budgets=(1, 2, 4, 8, 16),  # trajectories per problem; beam search and DVTS: B x N
      aggregation="min",  # the paper's trajectory score: min over steps of P(correct)
      max_steps=12,
      lookahead=0,
      temperature=1.0,  # of every sampled strategy; chosen on the validation split (README)
      split="test"))  # 'val' to choose settings: the test split is never used to choose anything
  return c
