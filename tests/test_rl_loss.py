"""The policy loss and update (docs/method.md §B2): the clipped objective by hand and against numpy, micro-batched
gradient accumulation against the whole batch (verl #5625), a zero-advantage step, response log-probs against a per-row
forward, 8-device data parallelism against one device, and no recompilation when parameters change."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from reprobe_jax.errors import ConfigError
from reprobe_jax.models import LanguageModel, ModelConfig
from reprobe_jax.rl.loss import (
  LossConfig,
  LossSums,
  batch_counts,
  make_logprobs,
  make_update,
  policy_loss,
  response_logprobs,
)
from reprobe_jax.rl.types import PolicyBatch

TINY = ModelConfig(
  family="llama",
  vocab_size=37,
  hidden_size=16,
  intermediate_size=32,
  num_layers=1,
  num_heads=2,
  num_kv_heads=1,
  head_dim=8,
)
B, P, T = 8, 5, 6
PROMPT_LENS = (5, 2, 4, 1, 3, 5, 2, 4)
RESPONSE_LENS = (6, 1, 3, 6, 2, 5, 4, 1)  # micro-batches of 2 rows then hold 7, 9, 7, 5 tokens: unequal counts


_lp = jax.jit(response_logprobs, static_argnames="graphdef")  # one compile shared by the tests


@pytest.fixture(scope="module")
def lm():
  return LanguageModel.random(TINY, seed=1)


def _sequences(prompt_lens=PROMPT_LENS, response_lens=RESPONSE_LENS, seed=0):
  """Left-padded prompts of P columns then right-padded responses of T columns (id 0 on padding)."""
  rng = np.random.default_rng(seed)
  b = len(prompt_lens)
  tokens = np.zeros((b, P + T), np.int32)
  attn = np.zeros((b, P + T), np.int32)
  resp = np.zeros((b, T), np.float32)
  for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
    tokens[i, P - p : P + r] = rng.integers(1, TINY.vocab_size, p + r)
    attn[i, P - p : P + r] = 1
    resp[i, :r] = 1
  return jnp.asarray(tokens), jnp.asarray(attn), jnp.asarray(resp)


def _batch(lm, *, seed=0, adv_scale=1.0, old_noise=0.3, ref_noise=0.2):
  """A PolicyBatch whose old log-probs are the model's own plus noise (so some ratios leave the clip range)."""
  tokens, attn, resp = _sequences(seed=seed)
  rng = np.random.default_rng(seed + 1)
  cur = _lp(lm.static_graph, lm.params, PolicyBatch(tokens, attn, resp, resp, resp, resp))
  noise = lambda s: jnp.asarray(rng.normal(0, s, (B, T)), jnp.float32) * resp  # noqa: E731
  adv = jnp.asarray(rng.normal(0, 1, (B, T)), jnp.float32) * resp * adv_scale
  return PolicyBatch(
    tokens=tokens,
    attention_mask=attn,
    response_mask=resp,
    old_logprobs=cur + noise(old_noise),
    advantages=adv,
    ref_logprobs=cur + noise(ref_noise),
  )


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


# ------------------------------------------------------------------------------------------------ the loss


def test_clipped_loss_worked_example():
  # One row of 4 tokens, clip range [0.8, 1.28]:
  #   r = 1.5, A = +1: -min(1.5, 1.28) = -1.28 (clipped high)   r = 0.5, A = -1: -min(-0.5, -0.8) = 0.8 (clipped low)
  #   r = 1.5, A = -1: -min(-1.5, -1.28) = 1.5 (not clipped)    r = 0.5, A = +1: -min(0.5, 0.8) = -0.5 (not clipped)
  # token-mean over 4 tokens: (-1.28 + 0.8 + 1.5 - 0.5) / 4 = 0.52 / 4 = 0.13.
  logp = jnp.log(jnp.array([[1.5, 0.5, 1.5, 0.5]]))
  old = jnp.zeros((1, 4))
  adv = jnp.array([[1.0, -1.0, -1.0, 1.0]])
  mask = jnp.ones((1, 4))
  loss, sums = policy_loss(logp, old, adv, mask, LossConfig(), 4, 1)
  assert float(loss) == pytest.approx(0.13, abs=1e-6)
  assert (float(sums.clipped), float(sums.clipped_low), float(sums.clipped_high)) == (2.0, 1.0, 1.0)
  assert float(sums.ratio) == pytest.approx(4.0, abs=1e-6) and float(sums.tokens) == 4.0
  # The whole batch has 10 tokens in 2 rows: the same micro-batch now adds 0.52 / 10 (token-mean) and
  # (0.52 / 4) / 2 = 0.065 (seq-mean-token-mean: its row's mean over the batch's 2 rows).
  assert float(policy_loss(logp, old, adv, mask, LossConfig(), 10, 2)[0]) == pytest.approx(0.052, abs=1e-6)
  seq = LossConfig(aggregation="seq-mean-token-mean")
  assert float(policy_loss(logp, old, adv, mask, seq, 10, 2)[0]) == pytest.approx(0.065, abs=1e-6)
  # k3 with ref - logp = log 2 on every token: e^(log 2) - log 2 - 1 = 0.306853; kl_coef 0.5 adds 0.153426.
  ref = logp + jnp.log(2.0)
  kl = LossConfig(kl_coef=0.5)
  loss_kl, sums_kl = policy_loss(logp, old, adv, mask, kl, 4, 1, ref)
  assert float(loss_kl) == pytest.approx(0.13 + 0.5 * 0.306853, abs=1e-6)
  assert float(sums_kl.kl) == pytest.approx(4 * 0.306853, abs=1e-5)
  assert float(sums_kl.kl_loss) == pytest.approx(0.153426, abs=1e-6)


def _numpy_loss(logp, old, adv, mask, cfg: LossConfig, n_tokens, n_seqs, ref):
  """The objective written token by token in float64."""
  b, t = logp.shape
  per = np.zeros((b, t))
  kl = np.zeros((b, t))
  clipped = 0
  for i in range(b):
    for j in range(t):
      if not mask[i, j]:
        continue
      r = np.exp(logp[i, j] - old[i, j])
      a = adv[i, j]
      unclipped, clip = r * a, np.clip(r, 1 - cfg.clip_low, 1 + cfg.clip_high) * a
      per[i, j] = -min(unclipped, clip)
      clipped += clip < unclipped
      if ref is not None:
        d = ref[i, j] - logp[i, j]
        kl[i, j] = np.exp(d) - d - 1
  if cfg.aggregation == "token-mean":
    agg = lambda x: x.sum() / n_tokens  # noqa: E731
  else:
    agg = lambda x: sum(x[i].sum() / mask[i].sum() for i in range(b) if mask[i].sum()) / n_seqs  # noqa: E731
  return agg(per) + cfg.kl_coef * agg(kl), clipped, kl.sum()


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_clipped_loss_equals_numpy_reference(aggregation, kl_coef):
  rng = np.random.default_rng(3)
  b, t = 6, 9
  mask = np.zeros((b, t))
  for i, n in enumerate([9, 1, 4, 0, 7, 3]):  # row 3 is empty (a padding row)
    mask[i, :n] = 1
  logp = rng.normal(-2, 1, (b, t)) * mask
  old = (logp + rng.normal(0, 0.5, (b, t))) * mask  # ratios from about 0.3 to 3
  adv = rng.normal(0, 1, (b, t)) * mask
  ref = (logp + rng.normal(0, 0.5, (b, t))) * mask
  r, m = np.exp(logp - old), mask > 0
  for low, pos in ((True, True), (True, False), (False, True), (False, False)):  # every side of the clip range
    out = (r < 0.8) if low else (r > 1.28)
    assert np.any(out & m & ((adv > 0) if pos else (adv < 0))), (low, pos)
  cfg = LossConfig(aggregation=aggregation, kl_coef=kl_coef)
  n_tokens, n_seqs = mask.sum() + 3, 6  # a micro-batch of a bigger batch
  f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
  loss, sums = jax.jit(policy_loss, static_argnames="cfg")(
    f32(logp), f32(old), f32(adv), f32(mask), cfg=cfg, n_tokens=n_tokens, n_seqs=n_seqs, ref_logp=f32(ref)
  )
  want, clipped, kl = _numpy_loss(logp, old, adv, mask, cfg, n_tokens, n_seqs, ref)
  assert float(loss) == pytest.approx(want, rel=1e-5, abs=1e-6)
  assert float(sums.clipped) == clipped > 0
  assert float(sums.clipped_low + sums.clipped_high) == clipped
  assert float(sums.clipped_low) == np.sum(m & (r < 0.8) & (adv < 0))
  assert float(sums.clipped_high) == np.sum(m & (r > 1.28) & (adv > 0))
  assert float(sums.ratio) == pytest.approx(r[m].sum(), rel=1e-5)
  assert float(sums.kl) == pytest.approx(kl, rel=1e-5)
  assert float(sums.tokens) == mask.sum()
  assert float(sums.pg_loss + sums.kl_loss) == pytest.approx(float(loss), abs=1e-6)


def test_loss_config_and_missing_reference():
  with pytest.raises(ConfigError, match="LossConfig.aggregation: expected one of 'token-mean'"):
    LossConfig(aggregation="seq-mean")
  with pytest.raises(ConfigError, match="LossConfig.clip_low"):
    LossConfig(clip_low=1.0)
  with pytest.raises(ConfigError, match="LossConfig.kl_coef"):
    LossConfig(kl_coef=-0.1)
  z = jnp.zeros((1, 2))
  with pytest.raises(ConfigError, match="kl_coef=0.1 needs ref_logp"):
    policy_loss(z, z, z, z + 1, LossConfig(kl_coef=0.1), 2, 1)
  sums = LossSums.zeros() + LossSums.zeros()
  assert float(sums.clipped) == 0.0


def test_misshapen_batches_are_config_errors_before_any_work():
  z = jnp.zeros((2, 3))
  with pytest.raises(ConfigError, match=r"policy_loss: logp, old_logp, adv, mask .* one \[B, T\]"):
    policy_loss(z, z, jnp.zeros((2, 4)), z, LossConfig(), 6, 2)
  tokens, attn, resp = _sequences()
  PolicyBatch(tokens, attn, resp, resp, resp, resp).check()
  with pytest.raises(ConfigError, match="PolicyBatch: tokens, attention_mask"):
    PolicyBatch(tokens, attn[:, 1:], resp, resp, resp, resp).check()
  with pytest.raises(ConfigError, match="PolicyBatch"):
    PolicyBatch(tokens, attn, resp, resp[:, 1:], resp, resp).check()
  with pytest.raises(ConfigError, match="PolicyBatch"):
    PolicyBatch(tokens.astype(jnp.float32), attn, resp, resp, resp, resp).check()
  with pytest.raises(ConfigError, match="response columns exceed"):
    PolicyBatch(tokens[:, :2], attn[:, :2], resp, resp, resp, resp).check()


# ------------------------------------------------------------------------------------------------ log-probabilities


def test_response_logprobs_equal_a_per_row_forward(lm):
  tokens, attn, resp = _sequences()
  batch = PolicyBatch(tokens, attn, resp, resp, resp, resp)
  got = np.asarray(_lp(lm.static_graph, lm.params, batch))
  want = np.zeros((B, T))
  for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
    ids = np.asarray(tokens[i, P - p : P + r])[None]  # the row alone, without padding
    z = np.asarray(lm.forward(ids).logits[0], np.float64)  # [p + r, V]
    for t in range(r):  # response token t is ids[p + t], predicted at position p + t - 1
      row = z[p + t - 1]
      want[i, t] = row[ids[0, p + t]] - (row.max() + np.log(np.exp(row - row.max()).sum()))
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert np.all(got[np.asarray(resp) == 0] == 0) and np.all(got[np.asarray(resp) > 0] < 0)
  # the micro-batched, compiled reader gives the same
  lp = make_logprobs(lm.static_graph, micro_batches=4)(lm.params, tokens, attn, resp)
  np.testing.assert_allclose(np.asarray(lp), got, atol=1e-6)


# ------------------------------------------------------------------------------------------------ the update


def _run(lm, tx, cfg, micro_batches, batch):
  params = _copy(lm.params)
  update = make_update(lm.static_graph, tx, cfg, micro_batches=micro_batches)
  n_tokens, n_seqs = batch_counts(batch)
  return update(params, tx.init(params), batch, n_tokens, n_seqs)


@pytest.mark.parametrize(
  "cfg",
  [LossConfig(), LossConfig(aggregation="seq-mean-token-mean", kl_coef=0.1)],
  ids=["token-mean", "seq-mean-token-mean+kl"],
)
def test_micro_batched_accumulation_equals_the_whole_batch(lm, cfg):
  batch = _batch(lm)
  tx = optax.sgd(0.5)  # plain SGD: parameter changes are the gradient itself (Adam's first step is ~sign(g))
  full, _, m_full = _run(lm, tx, cfg, 1, batch)
  micro, _, m_micro = _run(lm, tx, cfg, 4, batch)
  moved = 0.0
  for a, b, p in zip(jax.tree.leaves(full), jax.tree.leaves(micro), jax.tree.leaves(lm.params)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-6, rtol=1e-5)
    moved = max(moved, float(jnp.abs(a - p).max()))
  assert moved > 1e-3  # the step did something
  for k in ("loss", "clip_frac", "kl_mean", "grad_norm", "tokens"):
    assert float(m_micro[k]) == pytest.approx(float(m_full[k]), rel=1e-5, abs=1e-7), k
  assert 0 < float(m_full["clip_frac"]) < 1 and float(m_full["tokens"]) == sum(RESPONSE_LENS)
  assert (float(m_full["kl_mean"]) > 0) == (cfg.kl_coef > 0)

  # These rows tell the normalisations apart, so a wrong division would have shown above.
  lp = _lp(lm.static_graph, lm.params, batch)
  ref = batch.ref_logprobs if cfg.kl_coef > 0 else None
  n_tokens, n_seqs = batch_counts(batch)
  if cfg.aggregation == "token-mean":
    # verl #5625: each micro-batch divided by its own token count (7, 9, 7, 5 tokens), then averaged
    wrong = 0.0
    for i in range(4):
      rows = slice(i, None, 4)  # make_update's strided micro-batch i
      mb = jax.tree.map(lambda x: x[rows], batch)
      wrong += (
        float(
          policy_loss(lp[rows], mb.old_logprobs, mb.advantages, mb.response_mask, cfg, batch_counts(mb)[0], 1, None)[0]
        )
        / 4
      )
  else:  # rows of 1 to 6 tokens: the token mean is another loss than the mean of row means
    wrong = float(
      policy_loss(
        lp,
        batch.old_logprobs,
        batch.advantages,
        batch.response_mask,
        LossConfig(kl_coef=cfg.kl_coef),
        n_tokens,
        n_seqs,
        ref,
      )[0]
    )
  assert abs(wrong - float(m_full["loss"])) > 1e-3


def test_zero_advantages_leave_the_parameters_unchanged(lm):
  batch = _batch(lm, adv_scale=0.0)
  params, _, metrics = _run(lm, optax.adam(1e-2), LossConfig(), 2, batch)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(lm.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert float(metrics["grad_norm"]) == 0.0 and float(metrics["loss"]) == 0.0


def test_no_recompilation_when_parameters_change(lm, compile_counter):
  tx = optax.adam(1e-2)
  update = make_update(lm.static_graph, tx, LossConfig(), micro_batches=2)
  params = _copy(lm.params)
  opt_state = tx.init(params)
  first = _batch(lm, seed=0)
  params, opt_state, _ = update(params, opt_state, first, *batch_counts(first))
  jax.block_until_ready(params)
  before = compile_counter.count
  second = _batch(lm, seed=5)  # new tokens, advantages and counts of the same shapes
  for _ in range(2):
    params, opt_state, metrics = update(params, opt_state, second, *batch_counts(second))
  jax.block_until_ready(metrics)
  assert compile_counter.count == before, f"{compile_counter.count - before} compilations after the first step"
  assert update._cache_size() == 1


def test_micro_batches_must_divide_the_batch(lm):
  batch = _batch(lm)
  with pytest.raises(ConfigError, match="micro_batches=3 must divide the batch of 8 rows"):
    _run(lm, optax.sgd(0.1), LossConfig(), 3, batch)
  with pytest.raises(ConfigError, match="make_update.micro_batches"):
    make_update(lm.static_graph, optax.sgd(0.1), LossConfig(), micro_batches=0)


# ------------------------------------------------------------------------------------------------ data parallel

# What every 8-device script starts with (`run_on_8_cpu_devices` puts it first): this checkout's package and tests
# folder on the path, and `compiles[0]` counting XLA compilations.
SCRIPT_HEAD = textwrap.dedent("""
    import re, sys
    import jax, jax.numpy as jnp, numpy as np, optax
    from jax._src import dispatch
    sys.path[:0] = [sys.argv[1], sys.argv[2]]  # this checkout's package, then its tests folder
    import reprobe_jax
    assert reprobe_jax.__file__.startswith(sys.argv[1]), reprobe_jax.__file__
    from reprobe_jax.models import LanguageModel, make_mesh

    assert jax.device_count() == 8, jax.devices()
    compiles = [0]
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, d, **kw: compiles.__setitem__(0, compiles[0] + (event == dispatch.BACKEND_COMPILE_EVENT)))
""")

_DP_SCRIPT = textwrap.dedent("""
    import test_rl_loss as t
    from reprobe_jax.rl.loss import LossConfig, batch_counts, make_logprobs, make_update

    lm = LanguageModel.random(t.TINY, seed=1)
    batch = t._batch(lm)
    tx = optax.sgd(0.5)
    cfg = LossConfig(kl_coef=0.1)
    out = {}
    for name, mesh in (("one", None), ("dp", make_mesh(data=8))):
      lp = make_logprobs(lm.static_graph, micro_batches=1, mesh=mesh)(lm.params, batch.tokens, batch.attention_mask,
                                                                       batch.response_mask)
      update = make_update(lm.static_graph, tx, cfg, micro_batches=1, mesh=mesh)
      params = t._copy(lm.params)
      opt_state = tx.init(params)
      params, opt_state, m = update(params, opt_state, batch, *batch_counts(batch))
      first = [np.asarray(x) for x in jax.tree.leaves(params)]
      before = compiles[0]
      params, opt_state, m2 = update(params, opt_state, batch, *batch_counts(batch))
      jax.block_until_ready(params)
      assert compiles[0] == before, (name, compiles[0] - before)  # the first step's outputs feed the second
      out[name] = (np.asarray(lp), first, float(m["grad_norm"]), float(m["loss"]))
      if mesh is not None:
        assert lp.sharding.spec[0] == "data", lp.sharding
        assert all(x.sharding.is_fully_replicated for x in jax.tree.leaves(params))
        before = compiles[0]
        hlo = update.lower(params, opt_state, batch, *batch_counts(batch)).compile().as_text()
        print("compiles for the HLO text:", compiles[0] - before)
        assert "all-reduce" in hlo  # the gradient sum over the row shards: the rows were not gathered
    np.testing.assert_allclose(out["dp"][0], out["one"][0], atol=1e-6)
    for a, b in zip(out["dp"][1], out["one"][1]):
      np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
    assert abs(out["dp"][2] - out["one"][2]) < 1e-5 * out["one"][2] and abs(out["dp"][3] - out["one"][3]) < 1e-6
    print("DP OK")
""")


def run_on_8_cpu_devices(tmp_path, script: str, ok: str, timeout: int = 300) -> str:
  """Runs SCRIPT_HEAD + `script` in a subprocess with 8 CPU devices; asserts it exits 0 printing `ok`; returns its
  stdout."""
  path = tmp_path / "on8.py"
  path.write_text(SCRIPT_HEAD + script)
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  env["JAX_PLATFORMS"] = "cpu"
  for k in ("JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS"):
    env.pop(k, None)
  here = os.path.dirname(os.path.abspath(__file__))
  proc = subprocess.run(
    [sys.executable, str(path), os.path.dirname(here), here],
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
    cwd=os.path.dirname(here),
  )
  assert proc.returncode == 0 and ok in proc.stdout, (
    f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}"
  )
  return proc.stdout


@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_data_parallel_update_equals_one_device(tmp_path):
  run_on_8_cpu_devices(tmp_path, _DP_SCRIPT, "DP OK")
