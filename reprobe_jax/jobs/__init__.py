"""Jobs: the ReProbe, test-time scaling, SPAE, RL and target-build jobs as graphs of stages, their run folders,
config parsing, reports, and the CLI layer that train.py and eval.py share. Nothing below this package imports it."""
