"""Jobs: the ReProbe, test-time-scaling, SPAE, RL and target-build jobs, each a graph of stages computed once per
run (`graph`) that hand typed records on, with their run folders (`runs`), their config parsing from the CLI's
mappings, their reports, and the CLI layer that train.py and eval.py share (`cli`). Nothing below this package
imports it.

  graph            Stage, Graph, GraphRun: a job as named stages, each computed at most once per run
  runs             Run: a run folder, its on-disk stages (skipped when their artifacts exist) and timings.json
  reprobe          the ReProbe job: problems -> samples -> trajectories -> features -> probes -> (PRM) -> scores
                   -> report; reprobe_config (its config, splits, run folder), reprobe_records (what its stages
                   hand on: ScorerId, TrainedProbe, TrainedPRM, ...), reprobe_scores (the step scores)
  tts              the test-time-scaling grid over a ReProbe run; tts_config, tts_cells, tts_report
  spae, spae_report   the SPAE evaluation        rl, rl_report   RL runs and their comparison over seeds
  target           the built-in target's build; target_config (its config and key)
  bands            the shipped bands (configs/bands/) of a job config, and a run printed beside them
  cli              flags, progress bars, the target model, one-line errors

The modules are imported by their full names (`from reprobe_jax.jobs import reprobe`); the package re-exports
nothing, so importing one job does not import the others (nor define the CLI's flags).
"""
