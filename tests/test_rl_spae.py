"""SPAE through `train_rl` on a tiny thinking model: the step potentials are probed inside the step from the
rollout's own KV cache and shape the advantages (the run differs from RF-B's, which reads no potentials); the step
equals the reference step that prefills every kept trajectory again and updates one mini-batch per call, after two
steps; and a run killed by SIGKILL in the middle of a step resumes to the uninterrupted run's parameters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reprobe_jax.models import load_pretrained
from reprobe_jax.rl import loop
from reprobe_jax.rl import loss as loss_lib
from reprobe_jax.rl.probing import KeptPotentials
from reprobe_jax.rl.rollout import Group, policy_batch, potentials
from reprobe_jax.spae.potential import ProbeConfig
from reprobe_jax.train.optimizer import make_optimizer
from reprobe_jax.trajectories import opens_thinking

import rl_thinking
from reprobe_jax.errors import ConfigError

PCFG = ProbeConfig(samples=2, max_tokens=3)
pytestmark = pytest.mark.slow  # a model trained for the purpose, and whole RL steps: minutes on 2 cores


@pytest.fixture(scope="module")
def thinking_dir(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("thinking") / "model")
  rl_thinking.build_thinking_lm(d)
  return d


@pytest.fixture(scope="module")
def thinking_lm(thinking_dir):
  return load_pretrained(thinking_dir)


def _leaves(p):
  return [np.asarray(x) for x in jax.tree.leaves(p)]


def test_spae_trains_through_train_rl_and_differs_from_rf_b(thinking_lm, tmp_path):
  cfg = rl_thinking.tiny_rl()
  spae = loop.train_rl(thinking_lm, cfg, PCFG, str(tmp_path / "spae"), reward=rl_thinking.coin_reward)
  m = spae.metrics
  assert spae.step == 2 and m["skipped"] == [0.0, 0.0]
  assert all(np.isfinite(m["phi_mean"])) and all(-1 <= x <= 1 for x in m["phi_mean"])  # boundaries were probed
  assert all(0 <= x <= 1 for x in m["saturated_share"]) and all(t > 0 for t in m["time_probe"])
  rf_b = loop.train_rl(
    thinking_lm, rl_thinking.tiny_rl(advantage="rf_b"), PCFG, str(tmp_path / "rf_b"), reward=rl_thinking.coin_reward
  )
  assert rf_b.metrics["reward"][0] == m["reward"][0]  # the same first rollout (same parameters and keys)
  assert np.isnan(rf_b.metrics["phi_mean"]).all()
  # the potentials shaped SPAE's advantages: its first update moved the policy elsewhere than RF-B's
  assert any(not np.allclose(a, b, atol=1e-7) for a, b in zip(_leaves(spae.params), _leaves(rf_b.params)))


class ReferenceStep(loop.RLStep):
  """The step as it ran before SPAE moved inside it: every kept trajectory prefilled again from its token ids
  (`rollout.potentials`, `Prober.potentials`), then old log-probs and one jitted update per mini-batch."""

  def _probe(self, roll, kept, step):
    if self.prober is None:
      return None
    groups = [Group(t.prompt, (t,)) for t in kept]
    thinks = self.prober.thinks([self.prompts.prompt_ids[t.prompt] for t in kept], [t.text_ids for t in kept])
    pots = potentials(self.prober, [g for g, th in zip(groups, thinks) if th], self.prompts, step, self.think_id)
    it = iter(pots)
    pots = [next(it) if th else None for th in thinks]
    k = 8 * max(1, -(-max(len(p.cuts) if p else 0 for p in pots) // 8))
    phi, valid = np.zeros((len(kept), k), np.float32), np.zeros((len(kept), k), bool)
    cuts = []
    for r, p in enumerate(pots):
      cuts.append(np.zeros(0, np.int64) if p is None else p.cuts)
      if p is not None:
        phi[r, : len(p.cuts)] = np.nan_to_num(p.phi)
        valid[r, : len(p.cuts)] = np.isfinite(p.phi)
    return KeptPotentials(tuple(cuts), jnp.asarray(phi), jnp.asarray(valid))

  def _update(self, params, opt_state, sb, advantages):
    cfg = self.cfg
    tokens, attn, resp = jnp.asarray(sb.tokens), jnp.asarray(sb.attention_mask), jnp.asarray(sb.response_mask)
    logprobs = loss_lib.make_logprobs(self.policy.static_graph, micro_batches=cfg.micro_batches * cfg.mini_batches)
    update = loss_lib.make_update(self.policy.static_graph, self.tx, cfg.loss_config(), micro_batches=cfg.micro_batches)
    pb = policy_batch(sb, advantages, logprobs(params, tokens, attn, resp))
    per = pb.tokens.shape[0] // cfg.mini_batches
    fetched = []
    for m in range(cfg.mini_batches):
      part = jax.tree.map(lambda x: x[m * per : (m + 1) * per], pb)
      params, opt_state, met = update(params, opt_state, part, *loss_lib.batch_counts(part))
      fetched.append(jax.device_get(met))
    adv_abs = float(jnp.sum(jnp.abs(advantages) * pb.response_mask) / jnp.maximum(jnp.sum(pb.response_mask), 1))
    return params, opt_state, fetched, adv_abs


def _two_steps(step_cls, lm, cfg):
  prompts = loop.check_run(lm, cfg, PCFG, reward=rl_thinking.coin_reward)
  tx, _ = make_optimizer(cfg.optimizer, cfg.steps * cfg.mini_batches)
  step = step_cls(lm, cfg, PCFG, prompts, tx, reward=rl_thinking.coin_reward)
  params = jax.tree.map(jnp.array, lm.params)
  opt_state = tx.init(params)
  metrics = []
  for i in range(2):
    params, opt_state, m = step(params, opt_state, i, None, None)
    metrics.append(m)
  return params, metrics


def test_the_step_equals_the_reference_step_after_two_steps(thinking_lm):
  cfg = rl_thinking.tiny_rl()
  got, got_m = _two_steps(loop.RLStep, thinking_lm, cfg)
  ref, ref_m = _two_steps(ReferenceStep, thinking_lm, cfg)
  for a, b in zip(_leaves(got), _leaves(ref)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)
  for k in ("reward", "response_length", "phi_mean", "saturated_share", "loss", "adv_abs"):
    np.testing.assert_allclose([m[k] for m in got_m], [m[k] for m in ref_m], rtol=1e-3, atol=1e-4, err_msg=k)
  assert all(np.isfinite(m["phi_mean"]) for m in got_m)


_CHILD = textwrap.dedent("""
    import sys, time
    sys.path[:0] = [sys.argv[1], sys.argv[2]]
    import rl_thinking
    from reprobe_jax.models import load_pretrained
    from reprobe_jax.rl import loop
    from reprobe_jax.spae.potential import ProbeConfig
    model, workdir, marker = sys.argv[3:6]
    probe = loop.RLStep._probe

    def probe_then_hang(self, roll, kept, step):  # the second step stops for good inside its probing phase
      out = probe(self, roll, kept, step)
      if step == 1:
        open(marker, "w").close()
        time.sleep(600)
      return out

    loop.RLStep._probe = probe_then_hang
    loop.train_rl(load_pretrained(model), rl_thinking.tiny_rl(steps=3), ProbeConfig(samples=2, max_tokens=3), workdir,
                  reward=rl_thinking.coin_reward)
""")


def test_a_run_killed_mid_step_resumes_to_the_uninterrupted_run(thinking_dir, thinking_lm, tmp_path):
  script, marker, cut = tmp_path / "child.py", tmp_path / "in_step_2", tmp_path / "cut"
  script.write_text(_CHILD)
  here = os.path.dirname(os.path.abspath(__file__))
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COORDINATOR")}
  child = subprocess.Popen(
    [sys.executable, str(script), os.path.dirname(here), here, thinking_dir, str(cut), str(marker)],
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
  )
  try:
    deadline = time.time() + 600
    while not marker.exists() and child.poll() is None and time.time() < deadline:
      time.sleep(0.5)
    assert marker.exists(), child.communicate(timeout=60)[0].decode()[-3000:]
    os.kill(child.pid, signal.SIGKILL)  # no handler, no cleanup: the process is gone mid-step
    child.wait(timeout=60)
  finally:
    if child.poll() is None:
      child.kill()
  assert child.returncode == -signal.SIGKILL
  cfg = rl_thinking.tiny_rl(steps=3)
  resumed = loop.train_rl(thinking_lm, cfg, PCFG, str(cut), reward=rl_thinking.coin_reward)
  whole = loop.train_rl(thinking_lm, cfg, PCFG, str(tmp_path / "whole"), reward=rl_thinking.coin_reward)
  assert resumed.step == whole.step == 3
  for a, b in zip(_leaves(resumed.params), _leaves(whole.params)):
    np.testing.assert_array_equal(a, b)
  for k in ("loss", "reward", "phi_mean"):
    np.testing.assert_array_equal(resumed.metrics[k][1:], whole.metrics[k][1:])


def test_a_template_that_opens_the_thinking_is_probed(thinking_dir, tmp_path):
  """A chat template that ends the prompt with `<think>` (DeepSeek-R1-Distill, QwQ): the responses hold no
  `<think>` of their own, yet they think from their first token, and SPAE probes them (it used to skip them all and
  train as RF-B without a word)."""
  lm = load_pretrained(thinking_dir)
  lm.tokenizer.chat_template = lm.tokenizer.chat_template.replace(
    "'<|im_start|>assistant\n'", "'<|im_start|>assistant\n<think>'"
  )
  cfg = rl_thinking.tiny_rl(steps=1)
  prompts = loop.check_run(lm, cfg, PCFG, reward=rl_thinking.coin_reward)
  assert opens_thinking(lm.tokenizer.decode(list(prompts.prompt_ids[0])))
  res = loop.train_rl(lm, cfg, PCFG, str(tmp_path), reward=rl_thinking.coin_reward)
  assert res.metrics["probed_share"][0] > 0 and np.isfinite(res.metrics["phi_mean"][0])
  # a template that closes the thinking in the prompt is refused before any sampling
  lm.tokenizer.chat_template = lm.tokenizer.chat_template.replace("<think>'", "<think>\n\n</think>\n\n'")
  with pytest.raises(ConfigError, match="train prompts"):
    loop.train_rl(lm, cfg, PCFG, str(tmp_path / "closed"), reward=rl_thinking.coin_reward)
