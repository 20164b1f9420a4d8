"""RL with SPAE and its baselines from the built-in target's thinking mode (docs/method.md §B2):

    python train.py --config=configs/rl_synthetic.py --config.advantage=spae     # one method, one seed
    python train.py --config=configs/rl_synthetic.py --config.job=rl_compare     # GRPO, DAPO, RF-B, SPAE x seeds
    python train.py --config=configs/rl_synthetic.py:v2 --config.job=rl_compare  # on world v2, the control

The start policy is the SPAE target (configs/spae_synthetic.py: interrupted-thinking traces, so its step potential
reads something); it is built once (or reused) and every method and seed starts from it. Training prompts are
arithmetic problems of the RL train split; the evaluation is docs/method.md §B3 at k=16 on held-out test problems in
domain (arithmetic) and out of domain (planning, qa), the same problems for every run.
"""

import ml_collections
from ml_collections import config_dict

from configs import spae_synthetic, target_synthetic


def get_config(world: str = target_synthetic.WORLDS[0]) -> ml_collections.ConfigDict:
  """world: the built-in target's world, 'v3' (the default) or 'v2' (the control; docs/tasks.md, "Worlds")."""
  base = spae_synthetic.get_config(world)
  c = ml_collections.ConfigDict()
  c.job = "rl"
  c.workdir = "artifacts/rl_synthetic"
  c.target_path = ""  # empty: the built-in SPAE target (built or reused); else a model folder, GGUF or hub id
  c.target = base.target
  c.advantage = "spae"  # grpo | dapo | rf_b | spae (reprobe_jax/rl/advantages.py)
  c.seed = 0  # the RL seed (prompts and rollouts); the start policy is the same for every seed
  c.methods = ("grpo", "dapo", "rf_b", "spae")  # `--config.job=rl_compare`
  c.seeds = (0, 1, 2)
  # what `--config.job=rl_compare` made over those seeds (every method's numbers; written beside its table.md)
  c.bands = f"configs/bands/rl_synthetic.{world}.json"
  # 20 steps at 5e-4 fit the comparison (4 methods x 3 seeds) in about an hour on 2 cores; the rate was chosen
  # on training reward (DAPO and SPAE pilots at 5e-4: rollout accuracy 0.13 -> ~0.4 in 16 steps), not on test.
  # reprobe_jax.rl.loop.RLConfig; None fields take the method's default (METHODS: GRPO's loss and clip, else DAPO's)
  c.rl = ml_collections.ConfigDict(
    dict(
      steps=20,
      prompts_per_step=8,
      group_size=8,
      prompts_per_round=8,
      max_refill_rounds=2,
      max_new_tokens=192,
      sampling=dict(temperature=1.0, top_k=0, top_p=1.0),  # the rollouts never filter by top-k
      optimizer=dict(learning_rate=5e-4, schedule="constant", warmup_steps=0, grad_clip=1.0, weight_decay=0.0),
      mini_batches=2,
      micro_batches=1,
      # None: the method's default (--config.rl.dynamic_sampling=false, --config.rl.clip_high=0.3, ...)
      dynamic_sampling=config_dict.placeholder(bool),
      clip_low=0.2,
      clip_high=config_dict.placeholder(float),
      aggregation=config_dict.placeholder(str),  # token-mean | seq-mean-token-mean
      kl_coef=0.0,
      alpha=0.5,
      xi=0.5,
      train_domains=("arithmetic",),
      train_difficulties=(1, 2, 3),
      train_problems=200,
      few_shot=0,
      log_every=1,
      checkpoint_every=10,
    )
  )
  c.probe = base.probe
  # The held-out evaluation (reprobe_jax.jobs.spae.SPAEJobConfig; plain decoding only, every boundary probed): the
  # SPAE job's settings on 8 problems a domain, the same problems for every method and seed.
  c.eval = ml_collections.ConfigDict(dict(base.spae.to_dict(), problems=8, seed=0))
  return c
