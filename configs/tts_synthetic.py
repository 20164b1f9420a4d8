"""Test-time scaling on the built-in default (docs/method.md §A7): greedy, majority vote, Best-of-N, weighted vote, beam
search and DVTS with the probes and the uncertainty baselines as step scorers, at equal sample budgets.

    python eval.py --config=configs/tts_synthetic.py                     # the whole grid (reuses the ReProbe run)
    python eval.py --config=configs/tts_synthetic.py --config.tts.problems=20 --config.tts.budgets=1,2,4
    python eval.py --config=configs/tts_synthetic.py --config.tts.lookahead=1
    python eval.py --config=configs/tts_synthetic.py:demo                # make demo's small grid (about 2 minutes)
    python eval.py --config=configs/tts_synthetic.py:demo,v2             # the same on world v2, the control
    python eval.py --config=configs/tts_synthetic.py --config.job=tts_seeds   # docs/results.md's tables: seeds 0, 1, 2

The target and the probes come from the ReProbe job's cache (configs/reprobe_synthetic.py: same workdir, same run
folder); what is missing is built first. Outputs: <run folder>/tts/<key>/{metrics.json, table.md, accuracy.png}.
"""

import ml_collections

from configs import reprobe_synthetic, target_synthetic


def get_config(arg: str = "full") -> ml_collections.ConfigDict:
  """arg: the grid, 'full' (every scorer, strategy and budget; about 30 minutes per seed on 2 CPU cores) or 'demo'
  (in domain, the attention+logit probe, Best-of-N / votes and beam search at N = 1, 4, 16), optionally followed by
  the built-in target's world: 'demo,v2' (default 'v3'; docs/tasks.md, "Worlds")."""
  grid, _, world = arg.partition(",")
  if grid not in ("full", "demo"):
    raise ValueError(f"configs/tts_synthetic.py:<grid>[,<world>]: expected 'full' or 'demo', got {grid!r}")
  c = reprobe_synthetic.get_config(world or target_synthetic.WORLDS[0])
  c.job = "tts"
  # The shipped bands of the demo grid (three build seeds, `--config.job=tts_seeds`); none for the full grid.
  c.bands = f"configs/bands/tts_synthetic.demo.{c.target.world}.json" if grid == "demo" else ""
  c.machine_bands = ()
  c.tts = ml_collections.ConfigDict(
    dict(
      problems=60,  # per domain, spread evenly over the ReProbe test split
      domains=("arithmetic", "planning", "qa"),
      # 'prm': the PRM baseline the ReProbe job trains (config.prm); with a probe it adds Best-of-N by their fusion
      # and the cascade (the PRM asked about the steps where the probe is least certain)
      scorers=("probe[attn+logit]", "probe[hidden]", "prm", "maxprob", "perplexity", "mean_entropy", "random"),
      strategies=("best_of_n", "beam", "dvts"),
      budgets=(1, 2, 4, 8, 16),  # trajectories per problem; beam search and DVTS: B x N
      aggregation="min",  # the paper's trajectory score: min over steps of P(correct)
      max_steps=12,
      lookahead=0,
      temperature=1.0,  # of every sampled strategy; chosen on the validation split (docs/method.md)
      split="test",  # 'val' to choose settings: the test split is never used to choose anything
      dedupe=False,
    )
  )  # beam search: keep distinct trajectories (chosen on the validation split, docs/method.md)
  if grid == "demo":
    c.tts.domains = ("arithmetic",)
    c.tts.scorers = ("probe[attn+logit]",)
    c.tts.strategies = ("best_of_n", "beam")
    c.tts.budgets = (1, 4, 16)
  return c
