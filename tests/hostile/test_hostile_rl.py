"""Hostile inputs to the RL surfaces and the trainer's checkpoints, grouped by class: a user reward's output checked
where it enters, advantage inputs checked by row, one seed rule, orbax checkpoints that carry a checksum of their
state and meta, RL settings that are refused (and settable from the CLI), and the RL job checked whole before it
creates anything."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import zlib

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import rl_synthetic
from reprobe_jax.errors import CheckpointError, ConfigError
from reprobe_jax.jobs import rl as rl_job
from reprobe_jax.jobs.spae import SPAEJobConfig
from reprobe_jax.rl import loop
from reprobe_jax.rl.advantages import compute_advantages
from reprobe_jax.rl.config import Method, RLConfig
from reprobe_jax.rl.rollout import PromptSet, reward_of, rollout_fn
from reprobe_jax.rl.types import AdvantageInputs
from reprobe_jax.models import SamplingParams
from reprobe_jax.spae.potential import ProbeConfig
from reprobe_jax.tasks import make_problems
from reprobe_jax.train import checksum
from reprobe_jax.train.trainer import Trainer, TrainerConfig

NAN, INF = float("nan"), float("inf")


def _tiny_rl(**kw) -> RLConfig:
  base = dict(
    advantage="dapo",
    steps=1,
    prompts_per_step=2,
    group_size=2,
    prompts_per_round=2,
    max_refill_rounds=0,
    max_new_tokens=6,
    train_problems=2,
    train_difficulties=(1,),
    mini_batches=1,
    checkpoint_every=1,
  )
  return RLConfig(**{**base, **kw})


def _coin_reward(problem, text):
  return float(zlib.crc32(text.encode()) % 2)


# ------------------------------------------------------------------ a user reward's output, where it enters


def test_a_nan_reward_stops_train_rl_before_any_update_or_checkpoint(synthetic_lm, tmp_path):
  calls = []

  def nan_on_third(problem, text):
    calls.append(text)
    return NAN if len(calls) == 3 else 1.0

  workdir = tmp_path / "run"
  with pytest.raises(
    ConfigError, match=r"^the reward function .*nan_on_third on problem \d+ \('[^']+'\), response 0 returned nan: "
  ):
    loop.train_rl(synthetic_lm, _tiny_rl(), ProbeConfig(), str(workdir), reward=nan_on_third)
  assert not glob.glob(str(workdir / "train_state" / "*" / "state")), "a step was checkpointed"


_PROMPTS = PromptSet(tuple(make_problems("arithmetic", 2, 0, 1)), ((1, 2), (1, 3)))


class _Broken(Exception):
  pass


def _raises(problem, text):
  raise _Broken("no parser for this")


@pytest.mark.parametrize(
  "value, shown",
  [
    (NAN, "nan"),
    (INF, "inf"),
    (-INF, "-inf"),
    (np.float32("nan"), r"np\.float32\(nan\)"),
    (True, "True"),
    (np.bool_(False), r"np\.False_"),
    ("1.0", "'1.0'"),
    (None, "None"),
    (np.array([1.0, 0.0]), r"array\(\[1\., 0\.\]\)"),
    (np.array(1.0), r"array\(1\.\)"),
    ([1.0], r"\[1\.0\]"),
    (1e39, "1e\\+39"),  # finite in float64, inf on device
    (10**400, "1000"),  # past float's range
    (complex(1, 0), r"\(1\+0j\)"),
  ],
)
def test_a_reward_that_is_not_a_finite_number_is_named(value, shown):
  def reward(problem, text):
    return value

  with pytest.raises(
    ConfigError,
    match=rf"^the reward function .*reward on problem 1 \('{_PROMPTS.problems[1].id}'\), response 3 returned {shown}",
  ):
    reward_of(reward, reward.__qualname__, _PROMPTS, 1, 3, "text")


@pytest.mark.parametrize("value", [0, 1, 0.5, -2, np.float32(1.0), np.int64(0), np.float64(0.25)])
def test_finite_rewards_pass_as_floats(value):
  got = reward_of(lambda p, t: value, "r", _PROMPTS, 0, 0, "text")
  assert type(got) is float and got == float(value)


def test_a_reward_that_raises_is_named_with_its_cause():
  with pytest.raises(ConfigError, match=r"_raises on problem 0 .*response 2 raised _Broken: no parser for this") as e:
    reward_of(_raises, _raises.__qualname__, _PROMPTS, 0, 2, "text")
  assert isinstance(e.value.__cause__, _Broken)


def test_a_reward_that_is_not_a_function_is_refused_before_work(synthetic_lm, tmp_path):
  with pytest.raises(ConfigError, match="reward must be a function .* got 5"):
    loop.train_rl(synthetic_lm, _tiny_rl(), ProbeConfig(), str(tmp_path / "run"), reward=5)
  assert not (tmp_path / "run").exists()
  with pytest.raises(ConfigError, match="rollout_fn: reward must be a function"):
    rollout_fn(
      synthetic_lm, _PROMPTS, group_size=2, max_new_tokens=2, sampling=SamplingParams(1.0), seed=0, step=0, reward="x"
    )


# ------------------------------------------------------------------ advantage inputs, checked by row


def _inputs(rewards, *, phi=None, valid=None, token_step=None, row_mask=None, t=3, group_size=2, mask=None):
  b = len(rewards)
  phi = np.zeros((b, 2), np.float32) if phi is None else np.asarray(phi, np.float32)
  return AdvantageInputs(
    rewards=jnp.asarray(rewards, jnp.float32),
    row_mask=jnp.asarray(np.ones(b, bool) if row_mask is None else row_mask),
    response_mask=jnp.asarray(np.ones((b, t), bool) if mask is None else mask),
    token_step=jnp.asarray(np.zeros((b, t), np.int32) if token_step is None else np.asarray(token_step, np.int32)),
    phi=jnp.asarray(phi),
    step_valid=jnp.asarray(np.ones(phi.shape, bool) if valid is None else valid),
    group_size=group_size,
  )


@pytest.mark.parametrize("name", ["grpo", "dapo", "rf_b", "spae"])
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_a_non_finite_reward_names_its_row(name, bad):
  with pytest.raises(ConfigError, match=rf"^AdvantageInputs\.rewards\[2\] \(row 2, group 1\) is {bad}: every real row"):
    compute_advantages(name, _inputs([1.0, 0.0, bad, 1.0]))


@pytest.mark.parametrize("name", ["grpo", "rf_b", "spae"])
def test_a_padding_row_is_never_read_whatever_it_holds(name):
  rows = np.array([True, True, False, False])
  phi = np.array([[0.2, 0.5], [0.1, 0.3], [0.0, 0.0], [0.0, 0.0]])
  clean = np.asarray(compute_advantages(name, _inputs([1.0, 0.0, 1.0, 1.0], row_mask=rows, phi=phi)))
  phi[2:] = [[NAN, 9.0], [INF, NAN]]
  dirty = np.asarray(compute_advantages(name, _inputs([1.0, 0.0, NAN, INF], row_mask=rows, phi=phi)))
  assert np.any(clean != 0)
  np.testing.assert_array_equal(dirty, clean)


@pytest.mark.parametrize("bad, shown", [(NAN, "nan"), (INF, "inf"), (1.5, "1.5"), (-7.0, "-7.0")])
def test_a_bad_phi_on_a_probed_step_names_row_and_step(bad, shown):
  phi = np.array([[0.2, 0.5], [0.1, 0.3], [0.4, bad], [0.0, 0.9]])
  with pytest.raises(
    ConfigError, match=rf"^AdvantageInputs\.phi\[2, 1\] \(row 2, step 1\) is {shown} on a probed step"
  ):
    compute_advantages("spae", _inputs([1.0, 0.0, 1.0, 0.0], phi=phi))
  # an unprobed step (step_valid False) may hold anything: it is never read
  valid = np.ones((4, 2), bool)
  valid[2, 1] = False
  assert np.all(
    np.isfinite(np.asarray(compute_advantages("spae", _inputs([1.0, 0.0, 1.0, 0.0], phi=phi, valid=valid))))
  )
  # an estimator that reads no potentials does not check them
  assert np.all(np.isfinite(np.asarray(compute_advantages("grpo", _inputs([1.0, 0.0, 1.0, 0.0], phi=phi)))))


@pytest.mark.parametrize("bad", [2, -2, 10**6])
def test_a_token_step_past_the_steps_is_named(bad):
  steps = np.zeros((4, 3), np.int32)
  steps[1, 2] = bad
  with pytest.raises(ConfigError, match=rf"^AdvantageInputs\.token_step\[1, 2\] \(row 1, token 2\) is {bad}: expected"):
    compute_advantages("spae", _inputs([1.0, 0.0, 1.0, 0.0], token_step=steps))


@pytest.mark.parametrize(
  "make, match",
  [
    (lambda: _inputs([1.0, 0.0, 1.0]), "group_size: expected an int >= 1 that divides the batch of 3 rows"),
    (
      lambda: dataclasses.replace(_inputs([1.0, 0.0]), rewards=jnp.zeros(3)),
      r"AdvantageInputs\.rewards: expected shape \(2,\), got \(3,\)",
    ),
    (
      lambda: dataclasses.replace(_inputs([1.0, 0.0]), response_mask=jnp.ones(2, bool)),
      r"AdvantageInputs\.response_mask: expected shape \[B, T\], got \(2,\)",
    ),
    (
      lambda: dataclasses.replace(_inputs([1.0, 0.0]), step_valid=jnp.ones((2, 3), bool)),
      r"AdvantageInputs\.phi / step_valid: expected equal shapes",
    ),
    (lambda: {"rewards": [1.0, 0.0]}, "compute_advantages: expected AdvantageInputs, got dict"),
  ],
)
def test_misshapen_advantage_inputs_are_named(make, match):
  with pytest.raises(ConfigError, match=match):
    compute_advantages("grpo", make())


# ------------------------------------------------------------------ one seed rule


@pytest.mark.parametrize("seed", [2**32, 2**64, -1, 1.5, True, "3"])
def test_rl_seeds_follow_the_seed_rule(seed):
  with pytest.raises(
    ConfigError, match=rf"^RLConfig\.seed: expected a seed, an int in \[0, 4294967295\], got {seed!r}"
  ):
    _tiny_rl(seed=seed)
  with pytest.raises(ConfigError, match=r"^config\.rl\.seed: expected"):
    rl_job.rl_config_from_dict({"seed": seed})
  with pytest.raises(ConfigError, match=r"^PromptSet\.plan: seed: expected a seed"):
    _PROMPTS.plan(seed, 0, 1, 1)
  with pytest.raises(ConfigError, match=r"^TrainerConfig\.seed: expected a seed, an int in \[0, 4294967295\]"):
    TrainerConfig(steps=1, seed=seed)


def test_train_rl_checks_the_seed_at_its_entry(synthetic_lm, tmp_path):
  cfg = _tiny_rl()
  object.__setattr__(cfg, "seed", 2**64)  # past the config's own check: the entry checks it again
  with pytest.raises(ConfigError, match=r"^RLConfig\.seed: expected a seed, an int in \[0, 4294967295\], got 1844674"):
    loop.train_rl(synthetic_lm, cfg, ProbeConfig(), str(tmp_path / "run"), reward=_coin_reward)
  assert not (tmp_path / "run").exists()
  with pytest.raises(ConfigError, match=r"^rollout_fn: seed: expected a seed"):
    rollout_fn(synthetic_lm, _PROMPTS, group_size=2, max_new_tokens=2, sampling=SamplingParams(1.0), seed=2**32, step=0)
  with pytest.raises(ConfigError, match=r"^PromptSet\.plan: step: expected an int >= 0, got -1"):
    _PROMPTS.plan(0, -1, 1, 1)


# ------------------------------------------------------------------ checkpoints carry a checksum


def _batch(i: int) -> dict:
  x = np.random.default_rng([7, i]).normal(size=(8, 3)).astype(np.float32)
  return {"x": jnp.asarray(x), "y": jnp.asarray(x @ np.array([1.5, -2.0, 0.5], np.float32))}


def _loss(params, batch, rng, frozen):
  return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2) + 1e-3 * jnp.sum(params["e"] ** 2)


def _params():
  e = np.random.default_rng(0).normal(size=4096).astype(np.float32)  # incompressible: its bytes are on disk as is
  return {"w": jnp.zeros(3), "b": jnp.zeros(()), "e": jnp.asarray(e)}


CFG = TrainerConfig(steps=4, log_every=2, checkpoint_every=2, keep_latest=2)


def _fit(workdir):
  return Trainer(_loss, optax.adam(0.05), CFG, str(workdir)).fit(_params(), _batch)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A finished 4-step run with checkpoints at steps 2 and 4; each test damages a copy and resumes."""
  workdir = tmp_path_factory.mktemp("trained") / "run"
  return workdir, _fit(workdir)


@pytest.fixture()
def copy(saved, tmp_path):
  workdir = tmp_path / "copy"
  shutil.copytree(saved[0], workdir)
  return workdir


def _flip(step_dir, n=16):
  """Flips n bytes in the middle of the largest data file, its size unchanged."""
  files = [p for p in glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True) if os.path.isfile(p)]
  path = max(files, key=os.path.getsize)
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.seek(size // 2)
    data = f.read(n)
    f.seek(size // 2)
    f.write(bytes(b ^ 0xFF for b in data))
  assert os.path.getsize(path) == size


def _edit_meta(step_dir, edit):
  path = os.path.join(step_dir, "meta", "metadata")
  with open(path) as f:
    meta = json.load(f)
  edit(meta)
  with open(path, "w") as f:
    json.dump(meta, f)


def test_an_undamaged_checkpoint_resumes_and_its_checksum_is_stored(saved, copy):
  again = _fit(copy)
  assert again.step == 4 and again.metrics == saved[1].metrics
  np.testing.assert_array_equal(np.asarray(again.params["e"]), np.asarray(saved[1].params["e"]))
  with open(copy / "train_state" / "4" / "meta" / "metadata") as f:
    stamp = json.load(f)["checksum"]
  assert checksum.well_formed(stamp) and len(stamp["state"]) == 1


def test_bytes_flipped_inside_a_data_file_are_refused_naming_the_step(copy):
  _flip(copy / "train_state" / "4")
  with pytest.raises(
    CheckpointError,
    match=r"train_state/4: the saved state \(parameters and optimizer state\) does not match the checksum written "
    r"with it \(changed or damaged after the save\); delete that step folder",
  ):
    _fit(copy)


def test_an_edited_meta_is_refused(copy):
  _edit_meta(copy / "train_state" / "4", lambda m: m["metrics"]["loss"].__setitem__(0, 0.0))
  with pytest.raises(CheckpointError, match=r"train_state/4: its meta \(metrics, .*\) does not match the checksum"):
    _fit(copy)


def test_an_edited_checksum_is_refused(copy):
  _edit_meta(copy / "train_state" / "4", lambda m: m["checksum"]["state"].__setitem__(0, "0" * 64))
  with pytest.raises(CheckpointError, match=r"train_state/4: the saved state .* does not match the checksum"):
    _fit(copy)


@pytest.mark.parametrize(
  "edit",
  [lambda m: m.pop("checksum"), lambda m: m.__setitem__("checksum", "abc"), lambda m: m["checksum"].pop("state")],
)
def test_a_checkpoint_without_a_checksum_is_refused(copy, edit):
  """A checkpoint written before checkpoints carried a checksum: its data cannot be checked, so it is not resumed."""
  _edit_meta(copy / "train_state" / "4", edit)
  with pytest.raises(CheckpointError, match=r"train_state/4: the checkpoint has no valid checksum \(written before"):
    _fit(copy)


def test_a_damaged_best_checkpoint_is_refused_when_it_is_restored(tmp_path):
  """The best step's parameters are restored at the end of a run: they are checked like a resume's."""
  scores = iter([0.9, 0.1])
  cfg = TrainerConfig(steps=4, log_every=2, checkpoint_every=2, eval_every=2, best_metric="s")
  evaluate = lambda p: {"s": next(scores, 0.0)}  # noqa: E731
  make = lambda: Trainer(_loss, optax.adam(0.05), cfg, str(tmp_path), evaluate=evaluate)  # noqa: E731
  r = make().fit(_params(), _batch)
  assert r.history[0]["improved"] and not r.history[1]["improved"]
  _flip(tmp_path / "train_state" / "2")
  with pytest.raises(CheckpointError, match=r"train_state/2: the saved state .* does not match the checksum"):
    make().fit(_params(), _batch)


def test_the_digest_covers_every_leaf_path_dtype_and_shape():
  base = {"a": np.zeros(4, np.float32), "b": np.ones((2, 2), np.float32)}
  d = checksum.local_digest(base)
  assert d == checksum.local_digest({k: jnp.asarray(v) for k, v in base.items()})  # host or device: the same bytes
  others = [
    {"a": np.zeros(4, np.float32), "c": np.ones((2, 2), np.float32)},  # another path
    {"a": np.zeros(4, np.int32), "b": np.ones((2, 2), np.float32)},  # another dtype, the same bytes
    {"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)},  # another shape, the same bytes
    {"a": np.zeros(4, np.float32), "b": np.array([[1, 1], [1, 2]], np.float32)},  # one value
  ]
  assert len({d, *map(checksum.local_digest, others)}) == 5
  assert checksum.same_state([d], [d]) and checksum.same_state([d, d], [d]) and not checksum.same_state([d], ["0" * 64])


# ------------------------------------------------------------------ RL settings


def test_fewer_prompts_per_round_than_per_step_is_refused():
  with pytest.raises(
    ConfigError,
    match=r"^RLConfig\.prompts_per_round=1 is below RLConfig\.prompts_per_step=4: a step's first round must roll "
    r"out every group it trains on",
  ):
    RLConfig(advantage="grpo", prompts_per_step=4, prompts_per_round=1, mini_batches=1)
  with pytest.raises(ConfigError, match=r"^config\.rl\.prompts_per_round=2 is below config\.rl\.prompts_per_step=8"):
    rl_job.rl_config_from_dict({"prompts_per_round": 2})
  RLConfig(prompts_per_step=4, prompts_per_round=6, mini_batches=1)  # more per round: the extra groups refill


@pytest.mark.parametrize(
  "field, value, match",
  [
    ("clip_high", INF, r"clip_high: expected a finite number >= 0\.0, got inf"),
    ("clip_high", NAN, r"clip_high: expected a finite number >= 0\.0, got nan"),
    ("clip_high", -0.1, r"clip_high: expected a finite number >= 0\.0, got -0\.1"),
    ("aggregation", "mean", r"aggregation: expected one of 'token-mean', 'seq-mean-token-mean', got 'mean'"),
    ("dynamic_sampling", 1, r"dynamic_sampling: expected one of True, False, got 1"),
    ("dynamic_sampling", "yes", r"dynamic_sampling: expected one of True, False, got 'yes'"),
  ],
)
def test_loss_and_sampling_overrides_are_checked_in_the_rl_config(field, value, match):
  with pytest.raises(ConfigError, match=rf"^RLConfig\.{match}$"):
    RLConfig(**{field: value})
  with pytest.raises(ConfigError, match=rf"^config\.rl\.{field}: expected"):
    rl_job.rl_config_from_dict({field: value})


def test_clip_high_aggregation_and_dynamic_sampling_are_set_from_the_cli_config():
  config = rl_synthetic.get_config()
  make = lambda c: rl_job.rl_config_from_dict({**c.rl.to_dict(), "advantage": c.advantage})  # noqa: E731
  default = make(config)
  assert (default.clip_high, default.aggregation, default.dynamic_sampling) == (None, None, None)
  assert default.method == loop.RLConfig(advantage="spae").method  # the method's defaults, as before
  config.rl.clip_high, config.rl.aggregation, config.rl.dynamic_sampling = 0.3, "seq-mean-token-mean", False
  cfg = make(config)
  assert cfg.method == Method("seq-mean-token-mean", 0.3, False)
  assert cfg.loss_config().clip_high == 0.3 and cfg.loss_config().aggregation == "seq-mean-token-mean"
  assert cfg.rounds == 1


# ------------------------------------------------------------------ the RL job checks itself whole before it writes

_EVAL = SPAEJobConfig(problems=1, domains=("arithmetic",), in_domain=("arithmetic",), samples=1, max_new_tokens=8)


def _no_room_for_the_probe(lm) -> int:
  """max_new_tokens that fits the longest RL prompt in the context exactly, leaving the probe no room."""
  return lm.config.max_position_embeddings - max(map(len, loop.train_prompts(lm, _tiny_rl()).prompt_ids))


@pytest.mark.parametrize(
  "cfg, ecfg, where, match",
  [
    (dict(max_new_tokens=5000), _EVAL, "", r"^RLConfig\.max_new_tokens=5000: RL prompts of up to \d+ tokens"),
    (dict(max_new_tokens=5000), _EVAL, "config", r"^config\.rl\.max_new_tokens=5000: RL prompts of up to"),
    (dict(train_problems=1), _EVAL, "config", r"^config\.rl\.train_problems=1: the RL prompt set has 1 prompts"),
    (
      dict(advantage="spae", max_new_tokens=None),
      _EVAL,
      "",
      r"^RLConfig\.max_new_tokens: a prompt of \d+ tokens \+ max_new_tokens=\d+: SPAE probing: a context of \d+ tokens "
      r"\+ 1 \(the boundary token read again\) \+ the probe suffix",
    ),
    (
      {},
      dataclasses.replace(_EVAL, max_new_tokens=5000),
      "config",
      r"^config\.eval\.max_new_tokens: a prompt of \d+ tokens \+ max_new_tokens=5000: SPAE probing: a context of",
    ),
    (
      {},
      dataclasses.replace(_EVAL, max_new_tokens=5000),
      "",
      r"^SPAEJobConfig\.max_new_tokens: .*max_new_tokens=5000: SPAE probing",
    ),
  ],
)
def test_the_rl_job_checks_its_whole_config_before_it_creates_anything(synthetic_lm, tmp_path, cfg, ecfg, where, match):
  workdir = tmp_path / "rl"
  if cfg.get("max_new_tokens", 0) is None:
    cfg = dict(cfg, max_new_tokens=_no_room_for_the_probe(synthetic_lm))
    loop.check_run(synthetic_lm, _tiny_rl(max_new_tokens=cfg["max_new_tokens"]), ProbeConfig())  # fits without it
  with pytest.raises(ConfigError, match=match):
    rl_job.run(synthetic_lm, _tiny_rl(**cfg), ProbeConfig(), ecfg, str(workdir), where=where)
  assert not workdir.exists()


@pytest.mark.parametrize(
  "methods, seeds, match",
  [
    (("dapo",), (0, 2**32), r"^compare: seeds\[1\]: expected a seed"),
    (("dapo",), (0, -1), r"^compare: seeds\[1\]: expected a seed"),
    (("dapo", "ppo"), (0,), "ppo"),
    (("dapo",), "01", r"^compare: seeds: expected a sequence of seeds"),
  ],
)
def test_a_comparison_is_checked_whole_before_any_run(synthetic_lm, tmp_path, methods, seeds, match):
  with pytest.raises(ConfigError, match=match):
    rl_job.compare(synthetic_lm, _tiny_rl(), ProbeConfig(), _EVAL, methods, seeds, str(tmp_path / "cmp"))
  assert not (tmp_path / "cmp").exists()


def test_a_comparison_with_one_run_too_long_is_refused_before_the_first(synthetic_lm, tmp_path):
  """SPAE probes: only its run lacks room for the probe; the DAPO run before it must not start either."""
  with pytest.raises(ConfigError, match=r"^config\.rl\.max_new_tokens: a prompt .*: SPAE probing"):
    rl_job.compare(
      synthetic_lm,
      _tiny_rl(max_new_tokens=_no_room_for_the_probe(synthetic_lm)),
      ProbeConfig(),
      _EVAL,
      ("dapo", "spae"),
      (0,),
      str(tmp_path / "cmp"),
      where="config",
    )
  assert not (tmp_path / "cmp").exists()


@pytest.mark.slow  # a real RL step (rollout, update, checkpoint): ~30 s on 2 cores
def test_an_rl_checkpoint_with_flipped_bytes_is_refused(synthetic_lm, tmp_path):
  workdir = str(tmp_path / "rl")
  cfg = _tiny_rl(advantage="grpo")  # no dynamic sampling: the step always trains
  loop.train_rl(synthetic_lm, cfg, ProbeConfig(), workdir, reward=_coin_reward)
  _flip(os.path.join(workdir, "train_state", "1"))
  with pytest.raises(CheckpointError, match=r"train_state/1: the saved state .* does not match the checksum"):
    loop.train_rl(synthetic_lm, cfg, ProbeConfig(), workdir, reward=_coin_reward)
