"""reprobe-jax: step verification (ReProbe) and step potentials (SPAE) from a frozen LLM's internal states.

The packages follow the data flow (docs/layout.md): models -> steps -> tasks -> trajectories -> annotate ->
features -> probe / prm / scorers -> tts / spae / rl -> eval -> jobs. The root holds only what every package
shares and none owns:
  errors    the typed errors (ReprobeError and its kinds) that name what is wrong, so the CLI prints one line;
  fields    the field rules (Int, Real, OneOf, Seq, ...) every config dataclass checks itself with, and the
            mapping -> dataclass conversion that names the dotted field on error (a config of any layer uses it);
  registry  the one Registry type behind every pluggable piece found by name (step scorers, advantage estimators,
            search strategies, annotators, task families).
"""

__version__ = "0.1.0"
