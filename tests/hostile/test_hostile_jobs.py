"""Jobs, configs, the CLI and training resume under hostile input: every mistake is one typed error naming the
dotted field, the file or the checkpoint folder, found before any work starts or anything is written."""

from __future__ import annotations

import dataclasses
import functools
import glob
import math
import os
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings, strategies as st

from configs import judge_prompts
from reprobe_jax.jobs import reprobe_config
from reprobe_jax.fields import replace_fields
from reprobe_jax.errors import CheckpointError, ConfigError, DataFormatError, ReprobeError
from reprobe_jax.io import write_seal
from reprobe_jax.probe import ProbeConfig
from reprobe_jax.probe.data import Example
from reprobe_jax.probe.train import ProbeTrainConfig, train_probe
from reprobe_jax.jobs.runs import Run
from reprobe_jax.jobs import target as build
from reprobe_jax.jobs import target_config
from reprobe_jax.train.trainer import Trainer, TrainerConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# Whole-config checks: each bad value is a ConfigError naming its dotted field, before anything runs.


@pytest.mark.parametrize(
  "override, match",
  [
    ({"train": {"epochs": -1}}, r"^config\.train\.epochs: expected an int >= 1, got -1$"),
    ({"train": {"epochs": "3"}}, r"^config\.train\.epochs: expected an int, got '3'$"),
    ({"train": {"epochs": True}}, r"^config\.train\.epochs: expected an int, got True$"),
    (
      {"train": {"optimizer": {"learning_rate": float("nan")}}},
      r"^config\.train\.optimizer\.learning_rate: expected a finite number > 0",
    ),
    (
      {"train": {"optimizer": {"learning_rate": 0.0}}},
      r"^config\.train\.optimizer\.learning_rate: expected a finite number > 0",
    ),
    (
      {"train": {"optimizer": {"warmup_frac": 1.0}}},
      r"^config\.train\.optimizer\.warmup_frac: expected a finite number in \[0\.0, 1\.0\)",
    ),
    (
      {"train": {"optimizer": {"schedule": "step"}}},
      r"^config\.train\.optimizer\.schedule: expected one of 'cosine', 'linear', 'constant', got 'step'$",
    ),
    ({"train": {"optimizer": 3}}, r"^config\.train\.optimizer: expected a mapping of OptimizerConfig fields, got 3$"),
    ({"train": {"learning_rate": 1e-3}}, r"^config\.train: unknown field\(s\) \['learning_rate'\]"),
    ({"train": {"batch_size": 0}}, r"^config\.train\.batch_size: expected an int >= 1"),
    ({"train": {"patience": 0}}, r"^config\.train\.patience"),
    ({"train": 3}, r"^config\.train: expected a mapping of ProbeTrainConfig fields, got 3$"),
    ({"train": {"epochz": 3}}, r"^config\.train: unknown field\(s\) \['epochz'\]"),
    (
      {"trajectories": {"sampling": {"temperature": float("nan")}}},
      r"^config\.trajectories\.sampling\.temperature: expected a finite number >= 0\.0, got nan$",
    ),
    (
      {"trajectories": {"sampling": {"temperature": float("inf")}}},
      r"^config\.trajectories\.sampling\.temperature: expected a finite",
    ),
    (
      {"trajectories": {"sampling": {"temperature": -0.5}}},
      r"^config\.trajectories\.sampling\.temperature: .* >= 0\.0, got -0\.5$",
    ),
    (
      {"trajectories": {"sampling": {"top_p": 0.0}}},
      r"^config\.trajectories\.sampling\.top_p: expected a finite number in \(0\.0, 1\.0\]",
    ),
    ({"trajectories": {"sampling": {"top_p": 1.5}}}, r"^config\.trajectories\.sampling\.top_p"),
    ({"trajectories": {"sampling": {"top_k": -1}}}, r"^config\.trajectories\.sampling\.top_k: expected an int >= 0"),
    (
      {"trajectories": {"sampling": {"top_k": 2.5}}},
      r"^config\.trajectories\.sampling\.top_k: expected an int, got 2\.5$",
    ),
    (
      {"trajectories": {"sampling": {"top_k": True}}},
      r"^config\.trajectories\.sampling\.top_k: expected an int, got True$",
    ),
    (
      {"trajectories": {"sampling": {"temperature": "hot"}}},
      r"^config\.trajectories\.sampling\.temperature: expected a number, got 'hot'$",
    ),
    ({"trajectories": {"sampling": 0.7}}, r"^config\.trajectories\.sampling: expected a mapping of SamplingParams"),
    (
      {"trajectories": {"sampling": {"min_p": 0.1}}},
      r"^config\.trajectories\.sampling: unknown field\(s\) \['min_p'\]",
    ),
    ({"trajectories": {"temperature": 0.7}}, r"^config\.trajectories: unknown field\(s\) \['temperature'\]"),
    (
      {"judge": {"self_judge": {"sampling": {"top_p": 0.0}}}},
      r"^config\.judge\.self_judge\.sampling\.top_p: expected a finite number in \(0\.0, 1\.0\]",
    ),
    ({"trajectories": {"max_new_tokens": 0}}, r"^config\.trajectories\.max_new_tokens: expected an int >= 1"),
    ({"trajectories": {"samples": 1.0}}, r"^config\.trajectories\.samples: expected an int, got 1\.0$"),
    ({"trajectories": {"few_shot": -1}}, r"^config\.trajectories\.few_shot"),
    ({"trajectories": "hot"}, r"^config\.trajectories: expected a mapping of TrajectoryConfig fields"),
    ({"probe": {"n_heads": 3}}, r"^config\.probe\.n_heads: expected a divisor of d_model=128, got 3$"),
    ({"probe": {"n_heads": 0}}, r"^config\.probe\.n_heads: expected an int >= 1, got 0$"),
    ({"probe": {"dropout": 1.0}}, r"^config\.probe\.dropout: expected a finite number in \[0\.0, 1\.0\)"),
    ({"probe": {"d_model": -4}}, r"^config\.probe\.d_model"),
    ({"seed": {"a": 1}}, r"^config\.seed: expected an int, got \{'a': 1\}$"),
    ({"seed": -1}, r"^config\.seed: expected a seed, an int in \[0, 4294967295\]"),
    ({"mode": "prose"}, r"^config\.mode: expected one of 'line', 'thinking', got 'prose'$"),
    ({"train_domains": ()}, r"^config\.train_domains: expected a non-empty distinct tuple"),
    ({"train_domains": ("chess",)}, r"^config\.train_domains: .*got \('chess',\)$"),
    ({"train_domains": "arithmetic"}, r"^config\.train_domains: expected a sequence of \(a string\)"),
    ({"ood_domains": ("arithmetic",)}, r"^config\.ood_domains: \['arithmetic'\] also in train_domains"),
    ({"ood_domains": ("qa", "qa")}, r"^config\.ood_domains: expected a distinct tuple"),
    ({"val_problems": 0}, r"^config\.val_problems: expected an int >= 1"),
    ({"test_problems": "many"}, r"^config\.test_problems: expected an int"),
    ({"difficulties": (0,)}, r"^config\.difficulties: .*one of 1, 2, 3"),
    ({"feature_sets": ("hidden+hidden",)}, r"^config\.feature_sets: .*joined by '\+'"),
    ({"feature_sets": ("logits",)}, r"^config\.feature_sets"),
    ({"feature_sets": ()}, r"^config\.feature_sets: expected a non-empty"),
    ({"hidden_layers": ("abc",)}, r"^config\.hidden_layers: expected a sequence of \(an int\), got \('abc',\)$"),
    ({"hidden_layers": ()}, r"^config\.hidden_layers: expected a non-empty"),
    ({"hidden_layers": 3}, r"^config\.hidden_layers: expected a sequence"),
    ({"labels_path": 3}, r"^config\.labels_path: expected a string"),
    ({"judge": {"api": {"timeout": "x"}}}, r"^config\.judge\.api\.timeout: expected a number, got 'x'$"),
    ({"judge": {"per_step": "yes"}}, r"^config\.judge\.per_step: expected a bool or None"),
    ({"annotator": "oracle"}, r"config\.annotator must be one of"),
  ],
)
def test_reprobe_config_mistakes_name_the_field(override, match):
  with pytest.raises(ConfigError, match=match):
    reprobe_config.config_from_dict(override)


def test_accepted_values_are_converted_as_documented():
  cfg = reprobe_config.config_from_dict(
    {
      "hidden_layers": [-1, 2],
      "train": {"optimizer": {"learning_rate": 1}},
      "trajectories": {"sampling": {"temperature": 0, "top_k": 0, "top_p": 1}},
    }
  )
  assert cfg.hidden_layers == (-1, 2)  # a list for a tuple field is a tuple
  lr = cfg.train.optimizer.learning_rate
  assert lr == 1.0 and isinstance(lr, float)  # an int for a float
  assert cfg.trajectories.sampling.temperature == 0.0 and cfg.trajectories.sampling.greedy  # the documented greedy
  top_p = cfg.trajectories.sampling.top_p
  assert top_p == 1.0 and isinstance(top_p, float)


def test_direct_construction_names_the_class():
  with pytest.raises(ConfigError, match=r"^ProbeTrainConfig\.epochs: expected an int >= 1, got 0$"):
    ProbeTrainConfig(epochs=0)
  with pytest.raises(ConfigError, match=r"^ProbeConfig\.n_heads: expected a divisor of d_model=16, got 3$"):
    ProbeConfig(feature_dim=4, d_model=16, n_heads=3)
  with pytest.raises(ConfigError, match=r"^ProbeConfig\.feature_dim: expected an int >= 1, got 0$"):
    ProbeConfig(feature_dim=0)
  with pytest.raises(ConfigError, match=r"^ReprobeConfig\.train: expected a ProbeTrainConfig, got \{\}$"):
    reprobe_config.ReprobeConfig(train={})


@dataclasses.dataclass(frozen=True)
class Inner:
  x: int = 1


@dataclasses.dataclass(frozen=True)
class Outer:
  inner: Inner = Inner()
  pairs: tuple[tuple[str, float], ...] = ()
  name: str | None = None


def test_replace_fields_type_mismatches():
  with pytest.raises(ConfigError, match=r"^config\.inner: expected a mapping of Inner fields, got 5$"):
    replace_fields(Outer(), {"inner": 5})
  with pytest.raises(ConfigError, match=r"^config\.inner\.x: expected an int, got \{'y': 1\}$"):
    replace_fields(Outer(), {"inner": {"x": {"y": 1}}})
  with pytest.raises(ConfigError, match=r"^config\.name: expected a string or None, got 3$"):
    replace_fields(Outer(), {"name": 3})
  with pytest.raises(ConfigError, match=r"^config\.pairs: expected a sequence of \(a sequence of 2"):
    replace_fields(Outer(), {"pairs": [("a", 1.0, 2.0)]})
  with pytest.raises(ConfigError, match=r"^config: expected a mapping of Outer fields, got \[1\]$"):
    replace_fields(Outer(), [1])
  assert replace_fields(Outer(), {"pairs": [["a", 2]], "inner": {"x": 4}}) == Outer(Inner(4), (("a", 2.0),))


@pytest.mark.parametrize(
  "override, match",
  [
    ({"train": {"steps": 0}}, r"^config\.train\.steps: expected an int >= 1, got 0$"),
    ({"train": {"optimizer": {"learning_rate": float("nan")}}}, r"^config\.train\.optimizer\.learning_rate"),
    ({"train": "x"}, r"^config\.train: expected a mapping of TrainLMConfig fields, got 'x'$"),
    ({"model": {"num_heads": 5}}, r"^config\.model\.num_heads: expected a divisor of hidden_size=192"),
    ({"model": {"num_kv_heads": 3}}, r"^config\.model\.num_kv_heads: expected a divisor of num_heads=4"),
    ({"model": {"num_layers": 0}}, r"^config\.model\.num_layers: expected an int >= 1"),
    ({"family_weights": {"chess": 1.0}}, r"^config\.family_weights: expected a mapping of"),
    ({"family_weights": {"qa": -1.0}}, r"^config\.family_weights"),
    ({"family_weights": 3}, r"^config\.family_weights: cannot read 3"),
    ({"max_new_tokens": {"line": 3}}, r"^config\.max_new_tokens: .*with every key of \['line', 'thinking'\]"),
    ({"noise": {"p_skip": "a"}}, r"^config\.noise\.p_skip: expected a number, got 'a'$"),
    ({"thinking_fraction": 0.0}, r"^config\.thinking_fraction: expected a finite number in \(0\.0, 1\.0\]"),
    ({"eval_temperature": float("nan")}, r"^config\.eval_temperature"),
    ({"buckets": (128, -1)}, r"^config\.buckets: .*an int >= 1"),
    ({"vocab_size": "big"}, r"^config\.vocab_size: expected an int, got 'big'$"),
  ],
)
def test_synthetic_build_config_mistakes_name_the_field(override, match):
  with pytest.raises(ConfigError, match=match):
    target_config.config_from_dict(override)


def test_nested_build_config_names_its_root():
  with pytest.raises(ConfigError, match=r"^config\.target\.model\.num_heads: expected a divisor"):
    target_config.config_from_dict({"model": {"num_heads": 5}}, "config.target")
  assert target_config.config_from_dict({"seed": 4}).train.seed == 4  # the training seed still follows the build's


@pytest.mark.parametrize(
  "override, shape, match",
  [
    ({"hidden_layers": (99,)}, {}, r"^config\.hidden_layers=\(99,\): the target has 4 layers"),
    ({"hidden_layers": (-6,)}, {}, r"^config\.hidden_layers=\(-6,\): the target has 4 layers"),
    ({"trajectories": {"max_new_tokens": 1024}}, {}, r"^config\.trajectories\.max_new_tokens=1024 leaves no room"),
    (
      {"trajectories": {"sampling": {"top_k": 2000}}},
      {},
      r"^config\.trajectories\.sampling\.top_k=2000 is above the target's vocabulary",
    ),
    (
      {"annotator": "self", "judge": judge_prompts.get_config().to_dict()},
      {"context": 512},
      r"^config\.judge\.self_judge\.max_new_tokens=1024 leaves no room",
    ),
  ],
)
def test_model_dependent_checks_need_no_model(override, shape, match):
  """What depends on the target's shape is checked from its numbers (as the CLI does before building the
  built-in target), so it fails before anything is sampled."""
  with pytest.raises(ConfigError, match=match):
    cfg = reprobe_config.config_from_dict(override)
    reprobe_config.check_model(cfg, **{"num_layers": 4, "context": 1024, "vocab_size": 1024, **shape})


def test_model_dependent_checks_accept_what_fits():
  cfg = reprobe_config.config_from_dict({"hidden_layers": (-5, 0, 4), "trajectories": {"sampling": {"top_k": 1024}}})
  reprobe_config.check_model(cfg, num_layers=4, context=1024, vocab_size=1024)


_VALUES = st.one_of(
  st.integers(-3, 300),
  st.floats(allow_nan=True, allow_infinity=True),
  st.booleans(),
  st.text(max_size=4),
  st.none(),
  st.lists(st.integers(-6, 6), max_size=3),
  st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)


def _int(v, low):
  return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _real(v):
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# field (its path in the config) -> whether a value is valid there, written independently of the library's rules
_EXPECTED = {
  ("train", "epochs"): lambda v: _int(v, 1),
  ("train", "optimizer", "learning_rate"): lambda v: _real(v) and v > 0,
  ("train", "optimizer", "warmup_frac"): lambda v: v is None or (_real(v) and 0 <= v < 1),
  ("train", "optimizer", "warmup_steps"): lambda v: v is None or _int(v, 0),
  ("train", "optimizer", "b2"): lambda v: _real(v) and 0 <= v < 1,
  ("train", "optimizer", "grad_clip"): lambda v: _real(v) and v >= 0,
  ("trajectories", "sampling", "temperature"): lambda v: _real(v) and v >= 0,
  ("trajectories", "sampling", "top_p"): lambda v: _real(v) and 0 < v <= 1,
  ("trajectories", "sampling", "top_k"): lambda v: _int(v, 0),
  ("probe", "n_heads"): lambda v: _int(v, 1) and 128 % v == 0,
  ("probe", "dropout"): lambda v: _real(v) and 0 <= v < 1,
  ("hidden_layers",): lambda v: isinstance(v, list) and len(v) > 0,
  ("val_problems",): lambda v: _int(v, 1),
}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(_EXPECTED, key=str)), _VALUES)
def test_fuzz_config_fields_accept_exactly_the_valid_values(field, value):
  override = value
  for part in reversed(field):
    override = {part: override}
  try:
    cfg = reprobe_config.config_from_dict(override)
  except ConfigError as e:
    assert not _EXPECTED[field](value), (field, value, e)
    assert str(e).startswith(f"config.{'.'.join(field)}")
    return
  except ReprobeError as e:  # any other typed error would be a wrong kind
    raise AssertionError(f"{field}={value!r}: {type(e).__name__}: {e}")
  assert _EXPECTED[field](value), (field, value)
  got = functools.reduce(getattr, field, cfg)
  assert got == (tuple(value) if isinstance(value, list) else value) and type(got) is not list


# Stored run artifacts: a damaged one is a DataFormatError naming it.


@pytest.mark.parametrize(
  "text, match",
  [
    ("{", r"timings\.json:1: stage timings is not valid JSON"),
    ("[1]", r"timings\.json: stage timings must hold a JSON object"),
    ('{"sample_train": "slow"}', r"timings\.json: stage timings must be numbers of seconds, found 'sample_train'"),
    (b"\xff\xfe", r"timings\.json:1: stage timings is not UTF-8"),
  ],
)
def test_damaged_timings_are_named(tmp_path, text, match):
  run = Run(str(tmp_path))
  path = tmp_path / Run.TIMINGS
  path.write_bytes(text if isinstance(text, bytes) else text.encode())
  with pytest.raises(DataFormatError, match=match):
    run.timings()
  with pytest.raises(DataFormatError, match=match):
    run.add_time("x", 1.0)


@pytest.mark.parametrize(
  "text, match",
  [
    ("", r"report\.json:1: target report is not valid JSON"),
    ('{"groups": []}', r"report\.json: target report needs a 'groups' object of objects"),
    ('{"groups": {}, "model_parameters": "1M"}', r"report\.json: target report needs an integer"),
  ],
)
def test_damaged_target_report_is_named(tmp_path, text, match):
  """Sealed (as if the build had written it) so the content checks are reached; unsealed it is refused first."""
  (tmp_path / "report.json").write_text(text)
  with pytest.raises(DataFormatError, match=r"report\.json: target report has no seal"):
    build.load_report(str(tmp_path))
  write_seal(tmp_path / "report.json")
  with pytest.raises(DataFormatError, match=match):
    build.load_report(str(tmp_path))


# Checkpoints: damage and mismatches on resume are a CheckpointError naming the step folder.


def _batch(i: int) -> dict:
  x = np.random.default_rng([7, i]).normal(size=(8, 3)).astype(np.float32)
  return {"x": jnp.asarray(x), "y": jnp.asarray(x @ np.array([1.5, -2.0, 0.5], np.float32))}


def _loss(params, batch, rng, frozen):
  return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)


def _params(n=3, dtype=jnp.float32):
  return {"w": jnp.zeros(n, dtype), "b": jnp.zeros((), jnp.float32)}


CFG = TrainerConfig(steps=4, log_every=4, checkpoint_every=4)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A finished 4-step run; each test damages a copy of it and resumes."""
  workdir = str(tmp_path_factory.mktemp("trained"))
  Trainer(_loss, optax.sgd(0.05), CFG, workdir).fit(_params(), _batch)
  return workdir


def _files(step_dir, pattern):
  return [p for p in glob.glob(os.path.join(step_dir, pattern), recursive=True) if os.path.isfile(p)]


def _truncate_data(d):
  for p in _files(d, "state/**/d/*"):
    with open(p, "r+b") as f:
      f.truncate(os.path.getsize(p) // 2)


def _garble(pattern):
  def damage(d):
    for p in _files(d, pattern):
      with open(p, "w") as f:
        f.write("{garbage")

  return damage


@pytest.mark.parametrize(
  "damage, match",
  [
    (_truncate_data, r"train_state/4: the checkpoint cannot be read"),
    (lambda d: [os.remove(p) for p in _files(d, "state/**/*")], r"train_state/4: the checkpoint cannot be read"),
    (lambda d: shutil.rmtree(os.path.join(d, "state")), r"train_state/4: the checkpoint cannot be read"),
    (lambda d: shutil.rmtree(os.path.join(d, "meta")), r"train_state/4: the checkpoint cannot be read"),
    (_garble("meta/metadata"), r"train_state/4: the checkpoint cannot be read \(JSONDecodeError"),
    (_garble("state/_METADATA"), r"train_state/4: the checkpoint cannot be read"),
    (lambda d: (shutil.rmtree(d), os.makedirs(d)), r"train_state/4: the checkpoint cannot be read"),
    (
      lambda d: open(os.path.join(d, "meta", "metadata"), "w").write('{"step": "four"}'),
      r"train_state/4: the checkpoint cannot be read \(ValueError: training state without a valid 'step'",
    ),
    (
      lambda d: open(os.path.join(d, "meta", "metadata"), "w").write(
        '{"step": 4, "metrics": {}, "history": [], "bad_evals": 0, "best_score": null}'
      ),
      r"train_state/4: the checkpoint cannot be read \(ValueError: training state without a valid 'best_step'",
    ),
  ],
)
def test_damaged_checkpoint_is_named(saved, tmp_path, damage, match):
  workdir = str(tmp_path / "copy")
  shutil.copytree(saved, workdir)
  damage(os.path.join(workdir, "train_state", "4"))
  with pytest.raises(CheckpointError, match=match):
    Trainer(_loss, optax.sgd(0.05), CFG, workdir).fit(_params(), _batch)


@pytest.mark.parametrize(
  "params, cfg, match",
  [
    (
      _params(5),
      CFG,
      r"train_state/4: the checkpoint was made with \['params'\]\['w'\]=\[\[3\], 'float32'\] "
      r"\(this run: \[\[5\], 'float32'\]\)",
    ),
    (_params(3, jnp.bfloat16), CFG, r"\['params'\]\['w'\]=\[\[3\], 'float32'\] \(this run: \[\[3\], 'bfloat16'\]\)"),
    ({"w": jnp.zeros(3)}, CFG, r"\['params'\]\['b'\]=\[\[\], 'float32'\] \(this run: nothing\)"),
    (_params(), TrainerConfig(steps=8, log_every=4, checkpoint_every=4), r"with trainer\.steps=4 \(this run: 8\)"),
  ],
)
def test_resume_with_other_shapes_or_config_is_refused(saved, tmp_path, params, cfg, match):
  workdir = str(tmp_path / "copy")
  shutil.copytree(saved, workdir)
  with pytest.raises(CheckpointError, match=match):
    Trainer(_loss, optax.sgd(0.05), cfg, workdir).fit(params, _batch)


def test_undamaged_checkpoint_resumes_to_the_same_state(saved, tmp_path):
  workdir = str(tmp_path / "copy")
  shutil.copytree(saved, workdir)
  first = Trainer(_loss, optax.sgd(0.05), CFG, saved).fit(_params(), _batch)
  again = Trainer(_loss, optax.sgd(0.05), CFG, workdir).fit(_params(), _batch)
  assert again.step == 4 and again.metrics == first.metrics
  np.testing.assert_array_equal(np.asarray(again.params["w"]), np.asarray(first.params["w"]))


def test_probe_resume_with_another_shape_names_the_field(tmp_path, monkeypatch):
  """A probe folder whose checkpoint was made for another probe shape: train_probe names the stored field instead
  of orbax's shape error. The folder is made by the real Trainer with the settings train_probe gives it for the
  old shape (a cheap loss in place of the probe's, so nothing compiles), then train_probe resumes it."""
  import reprobe_jax.probe.train as probe_train

  rng = np.random.default_rng(0)
  exs = [
    Example(
      f"x{i}",
      "arithmetic",
      rng.normal(size=(2, 3)).astype(np.float32),
      np.array([[0, 2]], np.int32),
      np.array([i % 2], np.float32),
    )
    for i in range(2)
  ]
  tcfg = ProbeTrainConfig(batch_size=2, epochs=1)
  made = {}

  class Recorded(Trainer):
    def fit(self, params, batches, *, frozen=None):
      made.update(cfg=self.cfg, signature=self.signature)
      raise RuntimeError("recorded")

  monkeypatch.setattr(probe_train, "Trainer", Recorded)
  with pytest.raises(RuntimeError, match="recorded"):
    train_probe(ProbeConfig(feature_dim=3, d_model=4, n_heads=1, ff_dim=4), exs, exs, tcfg, str(tmp_path))
  monkeypatch.undo()
  signature = {k: v for k, v in made["signature"].items() if k != "trainer"}
  Trainer(
    _loss, optax.sgd(0.05), made["cfg"], str(tmp_path), evaluate=lambda p: {"pr_auc": 0.5}, signature=signature
  ).fit(_params(), _batch)
  with pytest.raises(
    CheckpointError,
    match=r"train_state/1: the checkpoint was made with probe\.d_model=4 "
    r"\(this run: 8\)",
  ):
    train_probe(ProbeConfig(feature_dim=3, d_model=8, n_heads=1, ff_dim=4), exs, exs, tcfg, str(tmp_path))


# The CLI: one line on stderr, a non-zero exit, no workdir. The runs start together (each imports JAX).

_CLI_CASES = [
  (
    "eval.py",
    ["--config.trajectories.sampling.temperature=nan"],
    r"config\.trajectories\.sampling\.temperature: expected a finite",
  ),
  ("eval.py", ["--config.train.epochs=-1"], r"config\.train\.epochs: expected an int >= 1, got -1"),
  ("train.py", ["--config.x=1"], r"--config\.x: configs/reprobe_synthetic\.py has no field 'x'"),
  ("train.py", ["--config.train.epochs=abc"], r"--config\.train\.epochs=abc: invalid literal for int"),
  ("eval.py", ["--config=configs/nope.py"], r"--config=configs/nope\.py: cannot load the config .*No such file"),
  ("eval.py", ["--config.hidden_layers=(99,)"], r"config\.hidden_layers=\(99,\): the target has 4 layers"),
]


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("cli")
  procs = []
  for i, (script, args, _) in enumerate(_CLI_CASES):
    workdir = root / f"w{i}"
    argv = [
      sys.executable,
      script,
      "--config=configs/reprobe_synthetic.py",
      f"--config.workdir={workdir}",
      f"--config.target.workdir={workdir}/target",
      *args,
    ]
    procs.append(
      (
        workdir,
        subprocess.Popen(
          argv,
          cwd=ROOT,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
          env={**os.environ, "JAX_PLATFORMS": "cpu"},
        ),
      )
    )
  out = []
  for workdir, p in procs:
    stdout, stderr = p.communicate(timeout=240)
    out.append((workdir, p.returncode, stdout, stderr))
  return out


@pytest.mark.parametrize("case", range(len(_CLI_CASES)), ids=[" ".join(c[1]) for c in _CLI_CASES])
def test_cli_error_is_one_line_and_nothing_is_written(cli_runs, case):
  import re

  workdir, code, stdout, stderr = cli_runs[case]
  lines = stderr.strip().splitlines()
  assert code != 0 and len(lines) == 1 and lines[0].startswith("error: "), (code, stderr)
  assert re.search(_CLI_CASES[case][2], lines[0]), lines[0]
  assert not os.path.exists(workdir)
