"""What every test-time-scaling strategy checks: before any work, the scorer against the target and the prompt seeds;
where a scorer's output enters a strategy (Best-of-N, beam search and DVTS alike), its type, dtype, shape and
finiteness (`scorers.checked_scores`, `scorers.bad_scores`)."""

from __future__ import annotations

import zlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from reprobe_jax.errors import ConfigError
from reprobe_jax.features import FeatureMismatchError, FeatureSpec, model_fingerprint
from reprobe_jax.fields import check_seeds
from reprobe_jax.io.readers import shown
from reprobe_jax.models import LanguageModel
from reprobe_jax.scorers import ScoreInputs, StepScorer, checked_scores, scorer_name


def scorer_spec(lm: LanguageModel, scorer, feature_spec: FeatureSpec | None = None) -> FeatureSpec | None:
  """The FeatureSpec a scorer reads (its own `StepScorer.feature_spec`, a probe's, else `feature_spec`), checked
  against the target before any work: its layers exist, the scorer's feature width is what this model's features
  have, a scorer trained on another target is refused (FeatureMismatchError), a scorer that reads token ids must
  share the target's vocabulary, and the scorer traces on ScoreInputs of this target's shapes (which also catches a
  scorer that reads features when none are given); a stateful scorer's init_carry and advance trace too, with a
  carry of [B, ...] leaves that advance returns in the same shapes, and its scores are float arrays of [B, S]
  (`score`) and [B] (`score_newest`, `advance`; `scorers.checked_scores`). ConfigError naming the scorer otherwise."""
  if not isinstance(scorer, StepScorer):
    raise ConfigError(f"scorer must be a StepScorer (reprobe_jax.scorers.get_scorer), got {type(scorer).__name__}")
  name = scorer_name(scorer)
  if feature_spec is not None and not isinstance(feature_spec, FeatureSpec):
    raise ConfigError(f"feature_spec must be a FeatureSpec, got {type(feature_spec).__name__}")
  spec = feature_spec
  if scorer.feature_spec is not None:
    if feature_spec is not None and feature_spec != scorer.feature_spec:
      raise ConfigError(f"feature_spec {feature_spec} differs from scorer {name!r}'s own {scorer.feature_spec}")
    spec = scorer.feature_spec
  if spec is not None:
    try:
      spec.capture().resolve_layers(lm.config.num_layers)
    except ConfigError as e:
      raise ConfigError(f"scorer {name!r} reads {spec.name} features this target cannot capture: {e}") from None
  if spec is not None and scorer.feature_dim is not None:
    width = spec.dim(lm.config)
    if width != scorer.feature_dim:
      raise ConfigError(
        f"scorer {name!r} reads {scorer.feature_dim} features per token; this target's "
        f"{spec.name} features have {width} (a {name} of another model size?)"
      )
  if scorer.model_fingerprint is not None and scorer.model_fingerprint != model_fingerprint(lm):
    raise FeatureMismatchError(
      f"scorer {name!r} was trained on target model {scorer.model_fingerprint!r}, "
      f"this model is {model_fingerprint(lm)!r}"
    )
  if scorer.vocab_size is not None and scorer.vocab_size != lm.config.vocab_size:
    raise ConfigError(
      f"scorer {name!r} reads the target's token ids, but its vocabulary has "
      f"{scorer.vocab_size} tokens and the target's {lm.config.vocab_size}: it must share the "
      "target's tokenizer"
    )
  b, t, tp = 2, 16, 16
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  span = jax.ShapeDtypeStruct((b, 2), jnp.int32)
  feats = f"{spec.name} features (layers {spec.hidden_layers})" if spec is not None else "no features"
  cannot = lambda e: ConfigError(
    f"scorer {name!r} cannot score this target ({lm.config.num_layers} layers, hidden size "
    f"{lm.config.hidden_size}) with {feats}: {e}"
  )
  try:
    dim = spec.dim(lm.config) if spec is not None else None
    inputs = ScoreInputs(
      token_mask=jax.ShapeDtypeStruct((b, t), jnp.bool_),
      features=None if dim is None else f32(b, t, dim),
      logprobs=f32(b, t),
      entropy=f32(b, t),
      self_certainty=f32(b, t),
      tokens=jax.ShapeDtypeStruct((b, t), jnp.int32),
      prompt_ids=jax.ShapeDtypeStruct((b, tp), jnp.int32),
      prompt_mask=jax.ShapeDtypeStruct((b, tp), jnp.bool_),
    )
    out = jax.eval_shape(lambda s, i, sp: s.score(i, sp), scorer, inputs, jax.ShapeDtypeStruct((b, 3, 2), jnp.int32))
  except Exception as e:  # the scorer's own code raising while traced (a user's scorer): named, before any work
    raise cannot(e) from e
  checked_scores(scorer, out, (b, 3), "score")  # as every strategy checks it again where the scores enter it
  try:
    if scorer.stateful:  # a stateful scorer's newest step needs the steps before it: the carry
      _check_carry(scorer, inputs, span, t + 8)
    else:
      out = jax.eval_shape(lambda s, i, sp: s.score_newest(i, sp), scorer, inputs, span)
  except Exception as e:
    raise cannot(e) from e
  if not scorer.stateful:
    checked_scores(scorer, out, (b,), "score_newest")
  return spec


def _check_carry(scorer: StepScorer, inputs: ScoreInputs, span, room: int) -> None:
  """A stateful scorer's init_carry and advance traced on abstract inputs of B rows: ConfigError unless every
  carry leaf is [B, ...], advance returns scores [B] and a carry of init_carry's structure, shapes and dtypes."""
  b = inputs.token_mask.shape[0]
  carry = jax.eval_shape(lambda s, i: s.init_carry(i, room), scorer, inputs)
  shapes = lambda c: [(tuple(x.shape), jnp.dtype(x.dtype)) for x in jax.tree.leaves(c)]
  bad = [shape for shape, _ in shapes(carry) if not shape or shape[0] != b]
  if bad:
    raise ConfigError(f"init_carry must return leaves of leading dim B = {b} (one per row); got leaves of shapes {bad}")
  out = jax.eval_shape(lambda s, c, i, sp: s.advance(c, i, sp), scorer, carry, inputs, span)
  if not isinstance(out, tuple) or len(out) != 2:
    raise ConfigError(f"advance must return (scores [B] = [{b}], carry); got {shown(out)}")
  scores, after = out
  checked_scores(scorer, scores, (b,), "advance")
  if jax.tree.structure(after) != jax.tree.structure(carry) or shapes(after) != shapes(carry):
    raise ConfigError(
      f"advance must return a carry of init_carry's structure and shapes {shapes(carry)}; got {shapes(after)}"
    )


def prompt_seeds_for(ids: Sequence[Sequence[int]], given: Sequence[int] | None = None) -> list[int]:
  """One seed per prompt: `given` (checked: integers in [0, 2**32), one per prompt) or, by default, CRC-32 of the
  prompt's token ids, so a prompt draws the same samples in any batch and any order without the caller naming
  seeds (SearchConfig.seed is the base key)."""
  if given is None:
    return [zlib.crc32(np.asarray(p, np.int64).tobytes()) for p in ids]
  seeds = check_seeds(given, "prompt_seeds")
  if len(seeds) != len(ids):
    raise ConfigError(f"prompt_seeds: need one seed per prompt ({len(ids)}), got {len(seeds)}: {shown(given)}")
  return seeds
