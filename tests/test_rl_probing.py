"""SPAE inside the RL step: the kept trajectories' potentials read from the rollout's own decode state (its KV cache
forked at every boundary, nothing prefilled again) equal those of the same token ids prefilled afresh."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from reprobe_jax.errors import ConfigError
from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.rl.probing import probe_kept, with_potentials
from reprobe_jax.rl.rollout import Group, PromptSet, Trajectory, potentials, step_batch, token_steps
from reprobe_jax.spae.potential import ProbeConfig
from reprobe_jax.spae.prober import Prober
from reprobe_jax.tasks import make_problems
from reprobe_jax.tasks.traces import TraceNoise, solve_many
from reprobe_jax.trajectories import prompt_text


def _rollout_like(lm, n_prompts=3, group_size=2):
  """A round's decode state as the rollout leaves it (each prompt prefilled once, its G rows reading it as a shared
  prefix) with clean thinking traces forced in as the responses, and the matching groups. Row (p, 1) of prompts
  p >= 1 drops the trace's first 5 tokens (so it has no '<think>': no thinking block)."""
  problems = make_problems("arithmetic", n_prompts, 21, 2)
  ids = lm.encode([prompt_text(lm, p, "thinking") for p in problems])
  ps = PromptSet(tuple(problems), tuple(tuple(i) for i in ids))
  tok = lm.tokenizer
  traces = solve_many(list(problems), "thinking", 0, TraceNoise.clean())
  eos = tok.eos_token_id
  responses, groups = [], []
  for i, t in enumerate(traces):
    full = tuple(tok(t.text, add_special_tokens=False)["input_ids"]) + (eos,)
    trajs = []
    for s in range(group_size):
      r = full if s == 0 or i == 0 else full[5:]
      responses.append(list(r))
      trajs.append(Trajectory(i, s, r, True, float(s == 0), round=0, row=i * group_size + s))
    groups.append(Group(i, tuple(trajs)))
  smp = lm.sampler(capture=CaptureSpec())
  state = smp.prefill([list(p) for p in ids], max_new_tokens=max(map(len, responses)), n=group_size, seed=0)
  assert state.cache.prefix is not None  # the rows read their prompt's prefill as a shared prefix, as a rollout's do
  return ps, groups, smp.force(state, responses + [None] * (state.batch - len(responses)))


def test_kept_potentials_from_the_rollout_state_equal_a_fresh_prefill(synthetic_lm):
  lm = synthetic_lm
  ps, groups, state = _rollout_like(lm)
  prober = Prober(lm, ProbeConfig(samples=2, max_tokens=3, batch_size=2))  # several calls per round
  think = lm.tokenizer.convert_tokens_to_ids("<think>")
  kept = [t for g in groups[1:] for t in g.trajectories] + list(groups[0].trajectories)  # any order of rows
  thinks = [think in t.text_ids for t in kept]
  got = probe_kept(prober, {0: state}, kept, ps, 3, thinks)
  ref = potentials(prober, groups[1:] + groups[:1], ps, 3, think)  # the same token ids prefilled again
  phi, valid = jax.device_get((got.phi, got.valid))
  assert phi.shape[1] % 8 == 0 and phi.shape[0] == len(kept)
  probed = 0
  for r, p in enumerate(ref):
    np.testing.assert_array_equal(got.cuts[r], p.cuts)
    k = len(p.cuts)
    np.testing.assert_array_equal(valid[r, :k], np.isfinite(p.phi))
    assert not valid[r, k:].any()
    np.testing.assert_allclose(phi[r, :k][valid[r, :k]], p.phi[np.isfinite(p.phi)], rtol=1e-4, atol=1e-5)
    probed += int(valid[r].sum())
  assert probed >= 6  # real boundaries were probed, not only empty rows
  assert [len(c) for c in got.cuts].count(0) == 2  # the two rows without '<think>' have no boundary


def test_potentials_enter_the_step_batch_on_device(synthetic_lm):
  lm = synthetic_lm
  ps, groups, state = _rollout_like(lm)
  prober = Prober(lm, ProbeConfig(samples=2, max_tokens=3))
  think = lm.tokenizer.convert_tokens_to_ids("<think>")
  kept = [t for g in groups[:2] for t in g.trajectories]
  got = probe_kept(prober, {0: state}, kept, ps, 0, [think in t.text_ids for t in kept])
  sb = step_batch(groups[:2], None, ps, want=3, group_size=2, response_len=256, pad_id=0)
  inp = with_potentials(sb, got)
  ref = step_batch(
    groups[:2], potentials(prober, groups[:2], ps, 0, think), ps, want=3, group_size=2, response_len=256, pad_id=0
  ).adv_inputs
  for field in ("token_step", "step_valid", "rewards", "row_mask", "response_mask"):
    np.testing.assert_array_equal(np.asarray(getattr(inp, field)), np.asarray(getattr(ref, field)), err_msg=field)
  np.testing.assert_allclose(np.asarray(inp.phi), np.asarray(ref.phi), rtol=1e-4, atol=1e-5)
  n = len(kept[0].response_ids)
  assert np.asarray(inp.token_step)[0, :n].tolist() == token_steps(got.cuts[0], n).tolist()
  with pytest.raises(ConfigError, match="thinking flags"):
    probe_kept(prober, {0: state}, kept, ps, 0, [True])
