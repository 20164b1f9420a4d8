"""reprobe-jax: step verification and step potentials from a frozen LLM's internal states."""

__version__ = "0.1.0"
