"""Test-time scaling on your own math problems (docs/own-data.md): SmolLM2-135M-Instruct by default on a GSM8K,
MATH or JSONL file.

    python eval.py --config=configs/tts_math.py --config.data.path=gsm8k_test.jsonl --config.data.format=gsm8k
    python eval.py --config=configs/tts_math.py --config.data.path=... --config.target=<HF folder | .gguf | hub id>

The model is `config.target`. The target, the data split and the probes are the ReProbe math job's
(configs/reprobe_math.py: same workdir and sizes, so a ReProbe run there is reused; what is missing is trained first,
its step labels from the target judging itself). Greedy, majority and weighted votes, Best-of-N and step-level beam
search with the first probe of `config.feature_sets` and with Perplexity, at budgets 1, 2 and 4, on the data's
test split (outcome accuracy by the math task's answer check). Sized for a 20-problem file in minutes on 2 CPU
cores; a config without `--config.data.path` is refused at start. Not part of CI.
"""

import ml_collections

from configs import reprobe_math, tts_smollm2


def get_config() -> ml_collections.ConfigDict:
  c = reprobe_math.get_config()
  c.job = "tts"
  c.prm.enabled = False
  c.tts = tts_smollm2.get_config().tts  # SmolLM2's grid on the synthetic worlds, on the data's test split:
  c.tts.problems = 8  # the first 8 of the split (a 20-problem file at test=0.2 has 4)
  c.tts.domains = ("math",)  # the data file's task; refused without config.data.path
  c.tts.scorers = (f"probe[{c.feature_sets[0]}]", "perplexity")
  c.tts.budgets = (1, 2, 4)
  return c
