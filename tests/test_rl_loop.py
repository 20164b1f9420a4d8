"""The RL loop's host stages (prompt plans, dynamic sampling, potentials, batch layout) and the loop end to end on a
tiny random model: checkpoints resume to the same parameters and metrics, bad input is refused before work."""

from __future__ import annotations

import dataclasses
import zlib

import jax
import numpy as np
import pytest

from reprobe_jax.errors import CheckpointError, ConfigError
from reprobe_jax.jobs.rl import rl_config_from_dict
from reprobe_jax.models import SamplingParams
from reprobe_jax.rl import loop
from reprobe_jax.rl.rollout import Group, PromptSet, Trajectory, collect, potentials, step_batch, token_steps
from reprobe_jax.spae.potential import ProbeConfig
from reprobe_jax.spae.prober import Prober
from reprobe_jax.tasks import make_problems
from reprobe_jax.tasks.traces import TraceNoise, solve_many
from reprobe_jax.trajectories import prompt_text


def _prompts(lm, n=6):
  problems = make_problems("arithmetic", n, 11, 2)
  ids = lm.encode([prompt_text(lm, p, "thinking") for p in problems])
  return PromptSet(tuple(problems), tuple(tuple(i) for i in ids))


def test_token_steps_worked_example():
  # boundaries end at tokens 2 and 5: tokens 0-2 are step 0, 3-5 step 1, 6-7 (after the last boundary) step 1
  assert token_steps(np.array([2, 5]), 8).tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
  assert token_steps(np.array([0]), 3).tolist() == [0, 0, 0]
  assert token_steps(np.zeros(0, int), 3).tolist() == [-1, -1, -1]


def test_prompt_plan_is_a_pure_function_of_the_step(synthetic_lm):
  ps = _prompts(synthetic_lm, 6)
  a = ps.plan(seed=3, step=7, per_round=2, rounds=3)
  assert [x.tolist() for x in a] == [x.tolist() for x in ps.plan(seed=3, step=7, per_round=2, rounds=3)]
  assert sorted(np.concatenate(a).tolist()) == list(range(6))  # rounds are disjoint within a step
  assert [x.tolist() for x in ps.plan(seed=3, step=8, per_round=2, rounds=3)] != [x.tolist() for x in a]
  with pytest.raises(ConfigError, match="6 prompts.*need 8"):
    ps.plan(seed=0, step=0, per_round=4, rounds=2)


def _group(prompt, rewards, length=3):
  return Group(
    prompt, tuple(Trajectory(prompt, s, tuple(range(length)), True, float(r)) for s, r in enumerate(rewards))
  )


def test_dynamic_sampling_refills_then_trains_on_what_is_there():
  # rewards by prompt: 0 and 2 mixed, 1 and 3 all equal
  table = {0: [0, 1], 1: [1, 1], 2: [1, 0], 3: [0, 0], 4: [0, 0], 5: [1, 1]}
  calls = []

  def roll(idx, round_):
    calls.append((idx.tolist(), round_))
    return [_group(int(i), table[int(i)]) for i in idx]

  plan = [np.array([0, 1]), np.array([2, 3]), np.array([4, 5])]
  kept, st = collect(roll, plan, 2, dynamic=True)
  assert [g.prompt for g in kept] == [0, 2] and st.rounds == 2 and len(calls) == 2  # refilled once, then full
  assert (st.sampled_groups, st.dropped_groups, st.kept_groups, st.short_groups) == (4, 2, 2, 0)
  assert st.mean_reward == pytest.approx(4 / 8)
  # asking for 3 mixed groups: the refills run out after 3 rounds; the step keeps the 2 it has, and says so
  kept, st = collect(roll, plan, 3, dynamic=True)
  assert [g.prompt for g in kept] == [0, 2] and st.rounds == 3 and st.short_groups == 1 and st.dropped_groups == 4
  # nothing mixed at all: an empty batch, no crash
  kept, st = collect(roll, [np.array([1, 3]), np.array([4, 5])], 2, dynamic=True)
  assert kept == [] and st.short_groups == 2
  # without dynamic sampling: one round, every group kept
  kept, st = collect(roll, plan, 2, dynamic=False)
  assert [g.prompt for g in kept] == [0, 1] and st.rounds == 1 and st.dropped_groups == 0


def _thinking_groups(lm, ps, group_size=2):
  """Groups whose responses are the problems' clean thinking traces (paragraph boundaries, '</think>', EOS), plus
  one response without '<think>'."""
  tok = lm.tokenizer
  traces = solve_many(list(ps.problems), "thinking", 0, TraceNoise.clean())
  eos = tok.eos_token_id
  groups = []
  for i, t in enumerate(traces[:2]):
    ids = tuple(tok(t.text, add_special_tokens=False)["input_ids"]) + (eos,)
    trajs = [Trajectory(i, s, ids if s == 0 or i == 0 else ids[5:], True, float(s == 0)) for s in range(group_size)]
    groups.append(Group(i, tuple(trajs)))
  return groups


@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_potentials_of_kept_trajectories_and_their_batch(synthetic_lm):
  lm = synthetic_lm
  ps = _prompts(lm, 4)
  groups = _thinking_groups(lm, ps)
  pcfg = ProbeConfig(samples=2, max_tokens=3, batch_size=4)
  prober = Prober(lm, pcfg)
  think = lm.tokenizer.convert_tokens_to_ids("<think>")
  pots = potentials(prober, groups, ps, step=3, think_id=think)
  trajs = [t for g in groups for t in g.trajectories]
  assert think not in trajs[3].text_ids and len(pots[3].cuts) == 0  # no '<think>': no thinking steps
  for j in (0, 1, 2):  # each alone through the prober, with the seed the loop derives
    seed = zlib.crc32(f"{ps.problems[trajs[j].prompt].id}/3/{trajs[j].sample}".encode())
    alone = prober.potentials(
      [ps.prompt_ids[trajs[j].prompt]], [trajs[j].text_ids], [ps.problems[trajs[j].prompt].answer], [seed]
    )[0]
    assert len(alone.cuts) > 0
    np.testing.assert_array_equal(pots[j].cuts, alone.cuts)
    np.testing.assert_allclose(pots[j].phi, alone.phi, rtol=1e-4, atol=1e-6)
  sb = step_batch(groups, pots, ps, want=3, group_size=2, response_len=256, pad_id=0)
  inp = sb.adv_inputs
  assert sb.tokens.shape[0] == 6 and sb.real_rows == 4
  assert np.asarray(inp.row_mask).tolist() == [True] * 4 + [False] * 2  # a missing group: masked copies
  assert float(np.asarray(inp.response_mask)[4:].sum()) == 0
  for r, t in enumerate(trajs):
    n = len(t.response_ids)
    plen = sb.tokens.shape[1] - 256
    p = ps.prompt_ids[t.prompt]
    assert sb.tokens[r, plen - len(p) : plen].tolist() == list(p)  # prompt left-padded
    assert sb.tokens[r, plen : plen + n].tolist() == list(t.response_ids)  # response (EOS included) right-padded
    assert sb.attention_mask[r].sum() == len(p) + n and np.asarray(inp.response_mask)[r].sum() == n
    k = len(pots[r].cuts)
    np.testing.assert_allclose(np.asarray(inp.phi)[r, :k], pots[r].phi, rtol=1e-6)
    assert np.asarray(inp.step_valid)[r].sum() == k
    assert np.asarray(inp.token_step)[r, :n].tolist() == token_steps(pots[r].cuts, n).tolist()
  assert np.asarray(inp.rewards)[:4].tolist() == [1.0, 0.0, 1.0, 0.0]


def _tiny_rl(**kw):
  base = dict(
    advantage="dapo",
    steps=3,
    prompts_per_step=2,
    group_size=2,
    prompts_per_round=2,
    max_refill_rounds=1,
    max_new_tokens=12,
    optimizer=dataclasses.replace(loop.RLConfig().optimizer, learning_rate=1e-2),
    train_problems=4,
    train_difficulties=(1,),
    mini_batches=2,
    checkpoint_every=1,
  )
  base.update(kw)
  return loop.RLConfig(**base)


def _coin_reward(problem, text):
  """A reward that mixes within groups on a random model's noise: the parity of the response's CRC."""
  return float(zlib.crc32(text.encode()) % 2)


class _Kill(Exception):
  pass


@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_a_killed_run_resumes_to_the_uninterrupted_run(synthetic_lm, tmp_path):
  cfg, pcfg = _tiny_rl(), ProbeConfig(samples=2, max_tokens=3)
  whole = loop.train_rl(synthetic_lm, cfg, pcfg, str(tmp_path / "whole"), reward=_coin_reward)
  assert whole.step == 3 and len(whole.metrics["loss"]) == 3
  assert any(v > 0 for v in whole.metrics["sampled_groups"])

  def kill(step, m):
    if step == 2:
      raise _Kill()

  with pytest.raises(_Kill):
    loop.train_rl(synthetic_lm, cfg, pcfg, str(tmp_path / "cut"), reward=_coin_reward, on_step=kill)
  resumed = loop.train_rl(synthetic_lm, cfg, pcfg, str(tmp_path / "cut"), reward=_coin_reward)
  leaves = lambda p: [np.asarray(x) for x in jax.tree.leaves(p)]
  for a, b in zip(leaves(whole.params), leaves(resumed.params)):
    np.testing.assert_array_equal(a, b)
  for k in ("loss", "reward", "dropped_groups", "clip_fraction"):
    np.testing.assert_array_equal(whole.metrics[k], resumed.metrics[k])
  moved = [not np.array_equal(a, b) for a, b in zip(leaves(whole.params), leaves(synthetic_lm.params))]
  assert any(moved)  # the loop trained the policy (and left the model it started from as it was)
  # a checkpoint of another config is refused, naming the field
  with pytest.raises(CheckpointError, match=r"rl\.optimizer\.learning_rate"):
    other = dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, learning_rate=5e-3))
    loop.train_rl(synthetic_lm, other, pcfg, str(tmp_path / "whole"), reward=_coin_reward)


def test_bad_rl_input_is_refused_before_work(synthetic_lm, tmp_path):
  with pytest.raises(ConfigError, match="unknown.*grpo.*spae|grpo.*dapo.*rf_b.*spae"):
    loop.RLConfig(advantage="ppo")
  with pytest.raises(ConfigError, match="group_size"):
    loop.RLConfig(group_size=1)
  with pytest.raises(ConfigError, match="mini_batches"):
    loop.RLConfig(prompts_per_step=3, group_size=2, mini_batches=4)
  with pytest.raises(ConfigError, match="advantage"):
    rl_config_from_dict({"advantage": "reinforce"})
  with pytest.raises(
    ConfigError,
    match=r"^config\.rl\.sampling\.temperature: expected a finite number > 0\.0, "
    r"got 0\.0$",
  ):
    rl_config_from_dict({"sampling": {"temperature": 0}})
  with pytest.raises(ConfigError, match=r"^RLConfig\.sampling\.temperature: expected a finite number > 0\.0"):
    loop.RLConfig(sampling=SamplingParams(temperature=0.0))
  with pytest.raises(
    ConfigError,
    match=r"^config\.rl\.sampling\.top_k: expected 0 \(off\), got 20: the RL rollouts "
    r"never filter by top-k",
  ):
    rl_config_from_dict({"sampling": {"top_k": 20}})
  with pytest.raises(ConfigError, match=r"^config\.rl\.sampling\.top_p: expected a finite number in \(0\.0, 1\.0\]"):
    rl_config_from_dict({"sampling": {"top_p": 1.5}})
  assert rl_config_from_dict({"sampling": {"top_p": 0.9}}).sampling == SamplingParams(1.0, top_k=0, top_p=0.9)
  # 4 prompts cannot fill 1 + 2 refill rounds of 2 prompts
  with pytest.raises(ConfigError, match="4 prompts.*need 6"):
    loop.train_rl(synthetic_lm, _tiny_rl(max_refill_rounds=2), ProbeConfig(), str(tmp_path / "x"), reward=_coin_reward)
  assert not (tmp_path / "x").exists()
