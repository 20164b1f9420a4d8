"""The ReProbe step verifier (METHOD A4)."""

from reprobe_jax.probe.model import Probe, ProbeConfig, count_params, score_steps

__all__ = ["Probe", "ProbeConfig", "count_params", "score_steps"]
