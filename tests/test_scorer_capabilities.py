"""The step-scorer interface says what a scorer needs of the target and how it is best run (`StepScorer.feature_spec`,
`feature_dim`, `model_fingerprint`, `vocab_size`, `packs_trajectories`); test-time scaling asks the scorer, never
tests its class, so a scorer of the user's own gets the same checks as the built-in ones."""

from __future__ import annotations

import ast
import pathlib

import jax.numpy as jnp
import pytest
from flax import nnx, struct

from reprobe_jax.errors import ConfigError
from reprobe_jax.features import FeatureMismatchError, FeatureSpec, model_fingerprint
from reprobe_jax.prm.model import from_target
from reprobe_jax.probe import Probe, ProbeBundle, ProbeConfig
from reprobe_jax.scorers import PRMScorer, StepScorer, get_scorer, step_token_mask
from reprobe_jax.tts.checks import scorer_spec

from test_tts_search import SPEC, lm  # noqa: F401 (the tiny word-level model of the search tests)


@struct.dataclass
class OwnScorer(StepScorer):
  """A user's scorer that was trained on features of one target: mean feature value over the step's tokens."""

  spec: FeatureSpec = struct.field(pytree_node=False)
  width: int = struct.field(pytree_node=False)
  fingerprint: str | None = struct.field(pytree_node=False, default=None)
  vocab: int | None = struct.field(pytree_node=False, default=None)
  name = "own"
  feature_spec = property(lambda self: self.spec)
  feature_dim = property(lambda self: self.width)
  model_fingerprint = property(lambda self: self.fingerprint)
  vocab_size = property(lambda self: self.vocab)

  def score(self, inputs, spans):
    in_step = step_token_mask(spans, inputs.token_mask)  # [B, S, T]
    x = jnp.mean(inputs.get("features", self.name), axis=-1)[:, None, :]  # [B, 1, T]
    n = jnp.sum(in_step, axis=-1)
    return jnp.where(n > 0, jnp.sum(jnp.where(in_step, x, 0.0), axis=-1) / jnp.maximum(n, 1), jnp.nan)


def _probe(spec, dim, fingerprint=None):
  cfg = ProbeConfig(feature_dim=dim, d_model=8, n_layers=1, n_heads=2, ff_dim=8)
  return get_scorer(
    "probe", bundle=ProbeBundle.create(cfg, nnx.split(Probe(cfg, rngs=nnx.Rngs(0)))[1], spec, fingerprint)
  )


def test_built_in_scorers_declare_what_they_need(lm):  # noqa: F811
  probe = _probe(SPEC, 32, "abc")
  assert probe.feature_spec == SPEC and probe.feature_dim == 32 and probe.model_fingerprint == "abc"
  assert probe.packs_trajectories and probe.vocab_size is None and not probe.stateful
  prm = PRMScorer(from_target(lm, separator_id=0))
  assert prm.vocab_size == lm.config.vocab_size and prm.stateful and not prm.packs_trajectories
  assert prm.feature_spec is None and prm.feature_dim is None and prm.model_fingerprint is None
  ppl = get_scorer("perplexity")
  assert (ppl.feature_spec, ppl.feature_dim, ppl.model_fingerprint, ppl.vocab_size) == (None,) * 4
  assert not ppl.packs_trajectories
  with pytest.raises(ConfigError, match="packs_trajectories=False"):
    ppl.score_trajectories(jnp.zeros((1, 4, 2)), [])


def test_a_users_scorer_is_checked_by_what_it_declares(lm):  # noqa: F811
  """The checks a probe gets (its own feature set, its width, its target) and a PRM gets (its vocabulary) come from
  the interface: a scorer of another class that declares the same is held to the same."""
  assert scorer_spec(lm, OwnScorer(SPEC, 32)) == SPEC  # the scorer's own feature set, not the caller's
  assert scorer_spec(lm, OwnScorer(SPEC, 32, model_fingerprint(lm))) == SPEC
  with pytest.raises(ConfigError, match="differs from scorer 'own''s own"):
    scorer_spec(lm, OwnScorer(SPEC, 32), FeatureSpec())
  with pytest.raises(ConfigError, match="scorer 'own' reads 7 features per token; this target's .* have 32"):
    scorer_spec(lm, OwnScorer(SPEC, 7))
  with pytest.raises(FeatureMismatchError, match="scorer 'own' was trained on target model 'elsewhere'"):
    scorer_spec(lm, OwnScorer(SPEC, 32, "elsewhere"))
  with pytest.raises(ConfigError, match="scorer 'own' reads the target's token ids, but its vocabulary has 9"):
    scorer_spec(lm, OwnScorer(SPEC, 32, vocab=9))
  with pytest.raises(FeatureMismatchError, match="scorer 'probe' was trained on target model 'elsewhere'"):
    scorer_spec(lm, _probe(SPEC, 32, "elsewhere"))


def test_test_time_scaling_never_tests_a_scorers_class():
  """No module of tts/ imports a concrete scorer class (so none can test `isinstance(scorer, ...)` on one)."""
  concrete = {"ProbeScorer", "PRMScorer", "UncertaintyScorer"}
  tts = pathlib.Path(__file__).parents[1] / "reprobe_jax" / "tts"
  for path in tts.glob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        names = {a.asname or a.name for a in node.names}
        assert not names & concrete, f"{path.name} imports {names & concrete}: ask the scorer's capabilities"
