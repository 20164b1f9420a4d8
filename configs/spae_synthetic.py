"""SPAE's step potential on the built-in target's thinking mode (docs/method.md §B1, §B3):

    python eval.py --config=configs/spae_synthetic.py
    python eval.py --config=configs/spae_synthetic.py:v2     # world v2, the control (docs/tasks.md, "Worlds")

Potential curves, saturation against the task's oracle, and plain against probe-truncated decoding (Acc@16,
Len@16, checking tokens, R2W), in domain (arithmetic) and out of domain (planning, qa). The target is the built-in
one with interrupted-thinking traces in its training data (`interrupt_share`, reprobe_jax/synthetic/interrupt.py):
without them a tiny model has never seen the probe suffix inside its thinking and cannot answer it.
"""

import ml_collections

from configs import target_synthetic


def get_config(world: str = target_synthetic.WORLDS[0]) -> ml_collections.ConfigDict:
  """world: the built-in target's world, 'v3' (the default) or 'v2' (the control; docs/tasks.md, "Worlds")."""
  c = ml_collections.ConfigDict()
  c.job = "spae"
  c.workdir = "artifacts/spae_synthetic"
  c.target_path = ""  # empty: the built-in target below (built or reused); else a model folder, GGUF or hub id
  c.target = target_synthetic.get_config(world)
  c.target.interrupt_share = 1.0
  # More thinking traces and a longer run than the ReProbe target: with the defaults (0.4, 1700 steps) the tiny model
  # stays unsure of its answer where the chain completes (Conf 0.64 and Acc 0.82 there in arithmetic, no boundary
  # saturated); with these, Conf 0.85 and Acc 0.94 (docs/method.md). The build takes about 1.5x as long.
  c.target.thinking_fraction = 0.6
  c.target.train.steps = 2600
  c.seed = 0  # the build seed: the built-in target's seed and the problems follow it
  c.target.seed = c.get_ref("seed")
  c.seeds = (0, 1, 2)  # `--config.job=spae_seeds`: the job once per seed (each its own target), then mean +- sd

  c.spae = ml_collections.ConfigDict(
    dict(
      problems=16,
      domains=("arithmetic", "planning", "qa"),
      in_domain=("arithmetic",),
      difficulties=(1, 2, 3),
      samples=16,
      max_new_tokens=192,
      sampling=dict(temperature=0.6, top_k=0, top_p=1.0),
      few_shot=0,
      batch_size=128,
      split="test",
    )
  )
  # docs/method.md §B1: N=5 continuations of at most 10 tokens at T=0.6, eps_sat 0.9; reading='reference_code' reads
  # Conf and Acc from top-20 lists as the released script does.
  c.probe = ml_collections.ConfigDict(
    dict(samples=5, max_tokens=10, temperature=0.6, eps_sat=0.9, reading="paper", top_logprobs=20, batch_size=16)
  )
  return c
