"""SPAE's step potentials (docs/method.md §B1, §B3): at each step boundary of a thinking trace, force the model to
state its answer, read its confidence and correctness, and combine them into Phi.

  potential  step_potential (Phi from Acc and Conf), saturated, ProbeConfig, StepPotentials, the probe program
  prober     Prober: forks of a trajectory's own KV cache at every boundary, probed in one batched decode
  decode     decode_thinking: sample thinking traces with every boundary probed as it decodes, one device program
             per call (ThinkingRow)
  metrics    ThinkingOutcome, TrajectoryMetrics, summarise, potential_curves: Acc@k, tokens, truncation and the
             curves of Phi over a trace (§B3)

The RL loop (`reprobe_jax.rl`) shapes token-level advantages with these potentials (§B2).
"""
