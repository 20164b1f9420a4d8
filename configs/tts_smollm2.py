"""Test-time scaling on a real pretrained model: SmolLM2-135M-Instruct, a smaller grid than the built-in
default's.

    python eval.py --config=configs/tts_smollm2.py

The target and the probes are the ReProbe SmolLM2 job's (configs/reprobe_smollm2.py: same workdir and sizes, so a
ReProbe run there is reused, and what is missing is trained first). Greedy, majority and weighted votes, Best-of-N
and step-level beam search with the attention+logit probe and with Perplexity, at budgets 1, 4 and 8, on 16
arithmetic (in domain) and 16 planning (out of domain) test problems; the PRM baseline is left out (its SmolLM2
fine-tune takes most of an hour on 2 CPU cores; `--config.tts.scorers=...,prm --config.prm.enabled=True` adds it).
Not part of CI.
"""

import ml_collections

from configs import reprobe_smollm2


def get_config() -> ml_collections.ConfigDict:
  c = reprobe_smollm2.get_config()
  c.job = "tts"
  c.prm.enabled = False
  c.tts = ml_collections.ConfigDict(
    dict(
      problems=16,
      domains=("arithmetic", "planning"),
      scorers=("probe[attn+logit]", "perplexity"),
      strategies=("best_of_n", "beam"),
      budgets=(1, 4, 8),
      aggregation="min",
      max_steps=8,
      lookahead=0,
      temperature=1.0,
      split="test",
      dedupe=False,
    )
  )
  return c
