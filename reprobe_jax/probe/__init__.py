"""The ReProbe step verifier (docs/method.md §A4)."""

from reprobe_jax.probe.model import Probe, ProbeConfig, abstract_probe, count_params, score_steps
from reprobe_jax.probe.bundle import ProbeBundle, load_probe, save_probe

__all__ = [
  "Probe",
  "ProbeBundle",
  "ProbeConfig",
  "abstract_probe",
  "count_params",
  "load_probe",
  "save_probe",
  "score_steps",
]
