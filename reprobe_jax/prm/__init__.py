"""The PRM baseline (docs/method.md §A7): the Qwen2.5-Math-PRM shape on any decoder of the model table, trained here on
the rule-labelled trajectories the probe learns from, scored whole or incrementally; fusion and cascade with the probe.

  model    PRM, from_target, load_prm, save_prm, rewards, prefill / append_step / step_rewards (incremental)
  train    PRMTrainConfig, train_prm, prm_scores
  combine  Fusion, fit_fusion, cascade_scores, cascade_curve: the probe and the PRM together
  report   combine, read_step_scores, cascade_markdown: the comparison the ReProbe job reports
"""
