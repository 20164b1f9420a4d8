"""A functional RL loop with token-level advantages (docs/method.md §B2): GRPO, DAPO, RF-B and SPAE.

  types       AdvantageInputs, PolicyBatch: what the estimators and the update read
  advantages  ESTIMATORS (the registry), AdvantageConfig, compute_advantages(name, inputs)
  loss        LossConfig, policy_loss, make_update: the clipped, token-level policy-gradient update (jitted)
  rollout     PromptSet, rollout_fn, collect: groups of sampled responses, rewards, step potentials, the batch
  config      RLConfig, METHODS: a run's settings and each method's default loss and sampling
  loop        train_rl, check_run: rollout -> advantages -> update, checkpointed and resumable (RLConfig re-exported)

The job that runs it over seeds and compares methods is `reprobe_jax.jobs.rl`.
"""
