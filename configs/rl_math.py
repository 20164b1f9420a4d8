"""RL on your own math problems (docs/own-data.md, docs/method.md §B2): SmolLM2-135M-Instruct by default, in
thinking mode, on the train split of a GSM8K, MATH or JSONL file, evaluated on its test split.

    python train.py --config=configs/rl_math.py --config.data.path=gsm8k_train.jsonl --config.data.format=gsm8k
    python train.py --config=configs/rl_math.py --config.data.path=... --config.advantage=dapo --config.rl.steps=50
    python train.py --config=configs/rl_math.py --config.data.path=... --config.target=<HF folder | .gguf | hub id>

The prompts are the data's train split in the order `tasks.data.PromptOrder` draws it (every epoch shuffled anew
from `config.seed`); each step consumes the prompts of the rounds it rolls out, and the run checkpoints its data
position, so a resumed run draws on where it stopped. The reward is the math task's answer check
(`tasks.math.is_equivalent`). The held-out evaluation (docs/method.md §B3) is the first `config.eval.problems` of the
same file's test split. The model is `config.target`. Two steps of one kept group of 8 samples (up to 3 rounds of
2 prompts): sized for a 20-problem file in minutes on 2 CPU cores (`--config.rl.steps=` for a real run); a config
without `--config.data.path` is refused at start.
"""

import ml_collections

from configs import reprobe_math, rl_synthetic, spae_math


def get_config() -> ml_collections.ConfigDict:
  c = rl_synthetic.get_config()
  spae = spae_math.get_config()
  c.workdir = "artifacts/rl_math"
  reprobe_math.use_pretrained(c, spae.target)
  c.data = spae.data  # the RL prompts come from its train split, the evaluation from its test split
  c.seeds = (0,)
  c.rl.update(
    dict(
      steps=2,
      # Groups of 8 and up to 3 rounds of 2 prompts: SmolLM2-135M answers about 1 in 8 of these problems right, so
      # a group of 4 is mostly all wrong (no signal: dynamic sampling drops it) and a step with 2 rounds of 2 such
      # prompts kept no group on the 20-problem file of docs/own-data.md, skipping its update.
      prompts_per_step=1,
      group_size=8,
      prompts_per_round=2,
      max_refill_rounds=2,
      max_new_tokens=160,
      mini_batches=2,
      few_shot=2,  # worked examples in the thinking format, as the SPAE math job's prompts
      train_domains=("math",),  # the data file's task; refused without config.data.path
      checkpoint_every=1,
    )
  )
  # A full fine-tune of 135M parameters: a small rate (the built-in target's 5e-4 is for a 1M-parameter model).
  c.rl.optimizer.learning_rate = 1e-6
  c.probe = spae.probe
  # The held-out evaluation (plain decoding, every boundary probed): the SPAE math job's settings on config.data's
  # test split.
  c.eval = ml_collections.ConfigDict(dict(spae.spae.to_dict(), problems=4, samples=2, seed=0))
  return c
