"""The one-program RL step update (docs/method.md §B2): `make_step_update` against the sequence it replaces
(`make_logprobs`, then one `make_update` per mini-batch), no recompilation, its FLOP count, and FSDP and data
parallelism on 8 CPU devices against one device, with the shardings and collectives asserted."""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from test_rl_loss import TINY, _copy, _sequences, run_on_8_cpu_devices
from reprobe_jax.errors import ConfigError
from reprobe_jax.models import LanguageModel
from reprobe_jax.rl.loss import LossConfig, batch_counts, make_logprobs, make_update
from reprobe_jax.rl.types import PolicyBatch
from reprobe_jax.rl.update import make_step_update, update_flops

KEYS = ("loss", "pg_loss", "kl_loss", "clip_frac", "ratio_mean", "kl_mean", "approx_kl_old", "grad_norm", "tokens")


@pytest.fixture(scope="module")
def lm():
  return LanguageModel.random(TINY, seed=1)


def _inputs(lm, seed=0):
  """Sequences, advantages, and a reference that differs from the policy (so the KL term is not zero)."""
  tokens, attn, resp = _sequences(seed=seed)
  rng = np.random.default_rng(seed + 7)
  adv = jnp.asarray(rng.normal(0, 1, resp.shape), jnp.float32) * resp
  ref = jax.tree.map(lambda p: p + jnp.asarray(rng.normal(0, 0.05, p.shape), p.dtype), lm.params)
  return tokens, attn, resp, adv, ref


def sequence(lm, tx, cfg, mini, micro, tokens, attn, resp, adv, ref):
  """RLStep's update before the one-program step: old (and reference) log-probs, then a host loop of updates."""
  params = _copy(lm.params)
  opt = tx.init(params)
  lp = make_logprobs(lm.static_graph, micro_batches=mini * micro)
  old = lp(params, tokens, attn, resp)
  ref_lp = lp(ref, tokens, attn, resp) if cfg.kl_coef > 0 else jnp.zeros_like(resp)
  pb = PolicyBatch(tokens, attn, resp, old, adv, ref_lp)
  update = make_update(lm.static_graph, tx, cfg, micro_batches=micro)
  per = tokens.shape[0] // mini
  metrics = []
  for m in range(mini):
    part = jax.tree.map(lambda x: x[m * per : (m + 1) * per], pb)
    params, opt, met = update(params, opt, part, *batch_counts(part))
    metrics.append(met)
  return params, opt, {k: np.array([float(x[k]) for x in metrics]) for k in metrics[0]}


# Every pair of settings (mini x micro, mini x KL, micro x KL) meets once: 4 programs instead of 8 compiles.
_SLOW = pytest.mark.slow  # each combination compiles two programs: the default suite keeps one, .ci/run all four


@pytest.mark.parametrize(
  "mini,micro,kl",
  [
    pytest.param(1, 1, 0.0, marks=_SLOW),
    pytest.param(1, 2, 0.1, marks=_SLOW),
    (2, 1, 0.1),
    pytest.param(2, 2, 0.0, marks=_SLOW),
  ],
)
def test_step_update_equals_the_sequence(lm, mini, micro, kl):
  tokens, attn, resp, adv, ref = _inputs(lm)
  cfg = LossConfig(kl_coef=kl)
  tx = optax.adam(3e-2)  # Adam: the second mini-batch's update reads the first's moments
  want, want_opt, want_m = sequence(lm, tx, cfg, mini, micro, tokens, attn, resp, adv, ref)
  step = make_step_update(lm.static_graph, tx, cfg, mini_batches=mini, micro_batches=micro, with_ref=kl > 0)
  params = _copy(lm.params)
  args = (params, tx.init(params), tokens, attn, resp, adv) + ((ref,) if kl > 0 else ())
  got, got_opt, got_m = step(*args)
  moved = 0.0
  for a, b, p in zip(jax.tree.leaves(got), jax.tree.leaves(want), jax.tree.leaves(lm.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)
    moved = max(moved, float(jnp.abs(b - p).max()))
  assert moved > 1e-2  # Adam moved every step's parameters by about the rate
  for a, b in zip(jax.tree.leaves(got_opt), jax.tree.leaves(want_opt)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)
  assert set(got_m) == set(want_m)
  for k in got_m:
    assert got_m[k].shape == (mini,), k
    np.testing.assert_allclose(np.asarray(got_m[k]), want_m[k], atol=2e-5, rtol=1e-4, err_msg=k)
  assert (want_m["kl_mean"] > 0).all() == (kl > 0)
  if mini == 2:  # the second mini-batch's ratios left 1: its old log-probs are the rollout parameters', not its own
    assert abs(want_m["approx_kl_old"][1]) > 1e-4 and abs(want_m["approx_kl_old"][0]) < 1e-6


def test_second_step_compiles_nothing(lm, compile_counter):
  tx = optax.adam(1e-2)
  cfg = LossConfig(kl_coef=0.1)
  step = make_step_update(lm.static_graph, tx, cfg, mini_batches=2, micro_batches=2, with_ref=True)
  tokens, attn, resp, adv, ref = _inputs(lm)
  params = _copy(lm.params)
  params, opt, _ = step(params, tx.init(params), tokens, attn, resp, adv, ref)
  jax.block_until_ready(params)
  before = compile_counter.count
  tokens, attn, resp, adv, _ = _inputs(lm, seed=4)  # new tokens, counts and advantages of the same shapes
  for _ in range(2):
    params, opt, metrics = step(params, opt, tokens, attn, resp, adv, ref)
  jax.block_until_ready(metrics)
  assert compile_counter.count == before, f"{compile_counter.count - before} compilations after the first step"
  assert step._cache_size() == 1


def test_arguments_are_checked_before_any_work(lm):
  tx = optax.sgd(0.1)
  with pytest.raises(ConfigError, match="make_step_update.mini_batches"):
    make_step_update(lm.static_graph, tx, LossConfig(), mini_batches=0, micro_batches=1)
  with pytest.raises(ConfigError, match="make_step_update.with_ref=False"):
    make_step_update(lm.static_graph, tx, LossConfig(kl_coef=0.1), mini_batches=1, micro_batches=1)
  step = make_step_update(lm.static_graph, tx, LossConfig(), mini_batches=3, micro_batches=1)
  tokens, attn, resp, adv, _ = _inputs(lm)
  params = _copy(lm.params)
  with pytest.raises(ConfigError, match="mini_batches=3 must divide the batch of 8 rows"):
    step(params, tx.init(params), tokens, attn, resp, adv)
  with pytest.raises(ConfigError, match="expected 6 arguments"):
    step(params, tx.init(params), tokens, attn, resp)


@pytest.mark.slow  # compiles the unrolled program: over 10 s on 2 cores (the default suite must stay under 15 minutes)
def test_update_flops_counts_every_mini_batch(lm):
  tx = optax.sgd(0.1)
  kw = dict(rows=8, prompt_len=5, response_len=6, micro_batches=1)
  one = update_flops(lm.static_graph, tx, LossConfig(), lm.params, mini_batches=1, **kw)
  two = update_flops(lm.static_graph, tx, LossConfig(), lm.params, mini_batches=2, **kw)
  # mini_batches=2: two updates of 4 rows (about one of 8) plus the old log-probs of the second's 4 rows (a forward,
  # about a third of an update of 4 rows): 1 < two / one < 1.5
  assert one > 0 and 1.0 < two / one < 1.5, (one, two)
  kl = update_flops(lm.static_graph, tx, LossConfig(kl_coef=0.1), lm.params, mini_batches=1, **kw)
  assert kl > one * 1.2  # the reference's forward over the batch


# ------------------------------------------------------------------------------------------------ 8 devices

_MESH_SCRIPT = textwrap.dedent("""
    import test_rl_update as t
    from reprobe_jax.rl.loss import LossConfig
    from reprobe_jax.rl.update import make_step_update

    lm = LanguageModel.random(t.TINY, seed=1)
    a, b = t._inputs(lm, seed=0), t._inputs(lm, seed=3)
    tokens, attn, resp, adv = (jnp.concatenate([x, y]) for x, y in zip(a[:4], b[:4]))  # 16 rows
    ref = a[4]
    tx = optax.adam(3e-2)
    cfg = LossConfig(kl_coef=0.1)
    out = {}
    for name, mesh in (("one", None), ("dp", make_mesh(data=8)), ("fsdp", make_mesh(data=2, fsdp=4))):
      step = make_step_update(lm.static_graph, tx, cfg, mini_batches=2, micro_batches=1, mesh=mesh, with_ref=True)
      params = t._copy(lm.params)
      params, opt, m = step(params, tx.init(params), tokens, attn, resp, adv, ref)
      out[name] = ([np.asarray(x) for x in jax.tree.leaves(params)], {k: np.asarray(v) for k, v in m.items()})
      before = compiles[0]
      params, opt, m2 = step(params, opt, tokens, attn, resp, adv, ref)
      jax.block_until_ready(params)
      assert compiles[0] == before, (name, compiles[0] - before)  # the first step's outputs feed the second
      if mesh is None:
        continue
      rows = ("data", "fsdp") if name == "fsdp" else "data"
      placed = step._args((params, opt, tokens, attn, resp, adv, ref))
      for x in placed[2:6]:
        assert x.sharding.spec[0] == rows, (name, x.sharding)  # the batch's rows split over the row axes
      assert all(v.sharding.is_fully_replicated for v in m2.values())
      leaves = dict(zip([jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]],
                        jax.tree.leaves(params)))
      moments = [x for x in jax.tree.leaves(opt) if x.ndim == 2]
      embed = leaves["['embed_tokens'].value"]  # [vocab 37, embed 16]: embed over fsdp
      down = leaves["['layers'][0]['mlp']['down_proj']['kernel'].value"]  # [mlp 32, embed 16]
      if name == "dp":
        assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves((params, opt)))
      else:
        for x in (embed, down):
          assert tuple(x.sharding.spec) == (None, "fsdp"), x.sharding
          assert x.addressable_shards[0].data.shape == (x.shape[0], x.shape[1] // 4)  # really a quarter per device
        assert all(not x.sharding.is_fully_replicated for x in moments)  # Adam's moments sharded as their params
        assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(opt) if x.ndim == 0)
      for x, y in zip(jax.tree.leaves(placed[0]), jax.tree.leaves(params)):
        assert x.sharding == y.sharding  # the outputs come back where the inputs are kept
      before = compiles[0]
      hlo = step.lower(params, opt, tokens, attn, resp, adv, ref).compile().as_text()
      print(name, "compiles for the HLO text:", compiles[0] - before)
      # shapes as sorted dims: the embedding is gathered as the head's [embed, vocab] too
      found = re.findall(r"f32\\[([\\d,]*)\\]\\S* all-gather\\(", hlo)
      gathered = {tuple(sorted(int(d) for d in g.split(",") if d)) for g in found}
      weights = {tuple(sorted(x.shape)) for x in jax.tree.leaves(lm.params) if x.ndim == 2}
      if name == "dp":
        assert "all-reduce" in hlo  # the gradient sum over the row shards: the rows were not gathered
        assert not gathered & weights, gathered  # weights are replicated: none is ever gathered
      else:
        assert weights <= gathered, weights - gathered  # every weight gathered whole where it is used
        assert "reduce-scatter" in hlo or "all-reduce" in hlo  # gradient shards summed over the row axes
    for name in ("dp", "fsdp"):
      for x, y in zip(out[name][0], out["one"][0]):
        np.testing.assert_allclose(x, y, atol=2e-5, rtol=1e-4)
      for k in out["one"][1]:
        np.testing.assert_allclose(out[name][1][k], out["one"][1][k], atol=2e-5, rtol=1e-4, err_msg=(name, k))
    print("MESH OK")
""")


@pytest.mark.slow  # three meshes' compiles in a subprocess: over 20 s on 2 cores
def test_fsdp_and_data_parallel_step_equal_one_device(tmp_path):
  run_on_8_cpu_devices(tmp_path, _MESH_SCRIPT, "MESH OK", timeout=600)
