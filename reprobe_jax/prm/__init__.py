"""The PRM baseline (METHOD A7): the Qwen2.5-Math-PRM shape on any decoder of the model table, trained here on the
rule-labelled trajectories the probe learns from, scored whole or incrementally; fusion and cascade with the probe."""
