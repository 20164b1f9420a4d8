"""The PRM baseline (docs/method.md §A7) as a step scorer: 1 - P(step correct), read at the separator after each step.

Unlike the probe and the uncertainty baselines, a PRM step score depends on every step before it (they are joined
by separators in its input), so it reads the token ids and the prompt (`ScoreInputs.tokens`, `prompt_ids`,
`prompt_mask`), and in a search it is *stateful*: its carry is its own KV cache of each row's prompt and selected
steps, and each round appends only the newest step (`advance`), where search-and-learn re-reads the whole text.
"""

from __future__ import annotations

import inspect
import os

import jax
import jax.numpy as jnp
from flax import struct

from reprobe_jax.errors import ConfigError
from reprobe_jax.io.readers import shown
from reprobe_jax.prm.model import PRM, append_step, load_prm, prefill, step_rewards
from reprobe_jax.scorers.base import ScoreInputs, StepScorer
from reprobe_jax.scorers.registry import SCORERS, unknown_arguments


@struct.dataclass
class PRMScorer(StepScorer):
  """Scores steps with a PRM (its parameters are the traced leaves). Reads tokens, prompt_ids and prompt_mask."""

  prm: PRM
  name = "prm"  # not a field
  stateful = True

  @property
  def vocab_size(self) -> int:
    return self.prm.config.vocab_size

  def _tokens(self, inputs: ScoreInputs):
    tokens = inputs.get("tokens", self.name)
    return jnp.where(inputs.token_mask, tokens, 0).astype(jnp.int32)

  def _prompt(self, inputs: ScoreInputs):
    return inputs.get("prompt_ids", self.name), inputs.get("prompt_mask", self.name)

  def score(self, inputs: ScoreInputs, spans: jax.Array) -> jax.Array:
    """1 - P(correct) [B, S] of every step, the whole text read once; NaN for steps without tokens."""
    ids, mask = self._prompt(inputs)
    return 1.0 - step_rewards(self.prm, ids, mask, self._tokens(inputs), spans)

  def score_newest(self, inputs: ScoreInputs, newest_span: jax.Array) -> jax.Array:
    """Not defined for a PRM on its own: the newest step's score depends on the steps before it, which one span
    does not name. A search calls `advance` on the carry instead; elsewhere call `score` with every span."""
    raise ConfigError(
      "the PRM scores a step after the steps before it: call score() with every span, or init_carry/advance in a search"
    )

  def init_carry(self, inputs: ScoreInputs, room: int):
    """The PRM's KV cache of each row's prompt, with `room` slots for the steps and their separators."""
    ids, mask = self._prompt(inputs)
    return prefill(self.prm, ids, mask, room)

  def advance(self, carry, inputs: ScoreInputs, span: jax.Array):
    """(1 - P(correct) [B] of step `span` [B, 2], the cache with that step and its separator appended)."""
    r, cache = append_step(self.prm, carry, self._tokens(inputs), span)
    return 1.0 - r, cache


@SCORERS.register("prm")
def _prm_scorer(prm: PRM | None = None, *, path: str | None = None, **load_kwargs) -> PRMScorer:
  """From a PRM in memory or a checkpoint folder / hub id (`prm.model.load_prm`'s keyword arguments, with path=)."""
  if (prm is None) == (path is None):
    raise ConfigError("the PRM scorer needs exactly one of prm= or path=")
  loads = [p.name for p in inspect.signature(load_prm).parameters.values() if p.kind is p.KEYWORD_ONLY]
  unknown_arguments("prm", load_kwargs, ["prm", "path"] + loads)
  if prm is not None and not isinstance(prm, PRM):
    raise ConfigError(f"scorer 'prm': prm: expected a PRM, got {shown(prm)}")
  if prm is not None and load_kwargs:
    raise ConfigError(f"scorer 'prm': {sorted(load_kwargs)} load a PRM from path=, not one given as prm=")
  if path is not None and not isinstance(path, (str, os.PathLike)):
    raise ConfigError(f"scorer 'prm': path: expected a folder path or hub id, got {shown(path)}")
  return PRMScorer(prm if prm is not None else load_prm(os.fspath(path), **load_kwargs))
