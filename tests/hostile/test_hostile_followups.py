"""Hostile inputs, second round: sampling settings checked where TrajectoryConfig is defined, a target-LM
checkpoint resumed with another model shape, out-of-vocabulary ids named by row."""

from __future__ import annotations

import dataclasses
import os

import pytest

from reprobe_jax.jobs import reprobe_config
from reprobe_jax.errors import CheckpointError, ConfigError
from reprobe_jax.models import SamplingParams
from reprobe_jax.trajectories import TrajectoryConfig


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("samples", 0, "an int >= 1, got 0"),
    ("max_new_tokens", 2.0, "int.*got 2.0"),
    ("batch_size", 0, "got 0"),
    ("seed", -3, r"an int in \[0, 4294967295\], got -3"),
    ("few_shot", True, "int.*got True"),
  ],
)
def test_trajectory_config_checks_itself(field, value, match):
  """Built directly the class is named; built from a config mapping the dotted field is."""
  with pytest.raises(ConfigError, match=rf"^TrajectoryConfig\.{field}: expected .*{match}$"):
    TrajectoryConfig(**{field: value})
  with pytest.raises(ConfigError, match=rf"^config\.trajectories\.{field}: expected .*{match}$"):
    reprobe_config.config_from_dict({"trajectories": {field: value}})


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("temperature", float("nan"), r"a finite number >= 0\.0, got nan"),
    ("temperature", -1.0, r">= 0\.0, got -1\.0"),
    ("temperature", float("inf"), r"a finite number >= 0\.0, got inf"),
    ("temperature", True, r"got True"),
    ("top_p", 0.0, r"in \(0\.0, 1\.0\], got 0\.0"),
    ("top_p", 1.5, r"in \(0\.0, 1\.0\], got 1\.5"),
    ("top_p", float("nan"), r"got nan"),
    ("top_k", -1, "an int >= 0, got -1"),
    ("top_k", 2.0, "an int.*got 2.0"),
    ("top_k", False, "an int.*got False"),
  ],
)
def test_sampling_params_check_themselves(field, value, match):
  """The trajectories' sampling: built directly SamplingParams is named; built from a config mapping the dotted
  field is."""
  with pytest.raises(ConfigError, match=rf"^SamplingParams\.{field}: expected .*{match}$"):
    TrajectoryConfig(sampling=SamplingParams(**{field: value}))
  with pytest.raises(ConfigError, match=rf"^config\.trajectories\.sampling\.{field}: expected .*{match}$"):
    reprobe_config.config_from_dict({"trajectories": {"sampling": {field: value}}})


def test_trajectory_config_accepts_the_edges():
  cfg = TrajectoryConfig(
    samples=1, sampling=SamplingParams(temperature=0.0, top_k=0, top_p=1.0), max_new_tokens=1, batch_size=1, seed=0
  )
  assert (cfg.sampling.temperature, cfg.sampling.top_k, cfg.sampling.top_p) == (0.0, 0, 1.0)
  got = reprobe_config.config_from_dict({"trajectories": {"sampling": {"temperature": 0}}}).trajectories.sampling
  assert got == SamplingParams(temperature=0.0, top_k=50, top_p=0.95)  # the other fields keep their defaults


def test_target_lm_resume_with_another_model_shape_is_refused(tmp_path):
  """Same parameter shapes (4 heads of 8 instead of 2 of 16, kv 2 x 8 instead of 1 x 16), other model: the stored
  signature names the field, before any step runs."""
  from reprobe_jax.models import ModelConfig
  from reprobe_jax.synthetic.tokenizer import build_tokenizer
  from reprobe_jax.synthetic.train_lm import TrainLMConfig, encode_examples, train_lm

  pairs = [(f"q{i}", f"a {i % 7}") for i in range(16)]
  tok = build_tokenizer([q + a for q, a in pairs], 300)
  data = encode_examples(tok, pairs, (16,))
  shape = dict(
    family="llama", vocab_size=len(tok), hidden_size=32, intermediate_size=32, num_layers=1, tie_word_embeddings=True
  )
  tcfg = TrainLMConfig(steps=2, batch_size=4, checkpoint_every=1)
  train_lm(ModelConfig(num_heads=2, num_kv_heads=1, head_dim=16, **shape), data, tcfg, str(tmp_path))
  steps = []
  with pytest.raises(CheckpointError, match=r"train_state.*made with model\.head_dim=16 \(this run: 8\)"):
    train_lm(
      ModelConfig(num_heads=4, num_kv_heads=2, head_dim=8, **shape),
      data,
      tcfg,
      str(tmp_path),
      on_step=lambda i, loss: steps.append(i),
    )
  assert steps == []
  with pytest.raises(CheckpointError, match=r"made with train\.optimizer\.learning_rate=0\.003 \(this run: 0\.01\)"):
    train_lm(
      ModelConfig(num_heads=2, num_kv_heads=1, head_dim=16, **shape),
      data,
      dataclasses.replace(tcfg, optimizer=dataclasses.replace(tcfg.optimizer, learning_rate=0.01)),
      str(tmp_path),
    )


def test_the_built_in_target_keeps_its_build_key():
  """The checkpoint signature lives in the training state only, so it does not enter the build key: the README's
  seed-0 targets (worlds v3 and v2) are still found. A change of this key must be deliberate (it rebuilds)."""
  import importlib.util

  from reprobe_jax.jobs.target_config import config_from_dict

  path = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "target_synthetic.py")
  spec = importlib.util.spec_from_file_location("target_synthetic", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  assert config_from_dict(module.get_config("v2")).key() == "dfe89da969c8"  # world v2 kept its key
  assert config_from_dict(module.get_config()).key() == "02c98185cbdd"  # world v3, the default


def test_out_of_vocabulary_ids_are_named_by_row_and_position():
  """forward ([B, T] array), generate (ragged prompts), force (one list per row), one sequence: the message names
  where the id is, the id and the vocabulary size."""
  import numpy as np

  from reprobe_jax.models import LanguageModel, ModelConfig, SamplingParams

  lm = LanguageModel.random(
    ModelConfig(
      family="llama",
      vocab_size=64,
      hidden_size=16,
      intermediate_size=16,
      num_layers=1,
      num_heads=2,
      num_kv_heads=1,
      head_dim=8,
      max_position_embeddings=64,
      eos_token_ids=(0,),
      pad_token_id=0,
    ),
    seed=0,
  )
  with pytest.raises(ConfigError, match=r"^input_ids\[1, 2\]: token id 64 is outside the vocabulary \[0, 64\)$"):
    lm.forward(np.array([[1, 2, 3], [4, 5, 64]], np.int32))
  with pytest.raises(ConfigError, match=r"^input_ids\[0, 0\]: token id -1 is outside"):
    lm.forward(np.array([[-1, 2, 3], [4, 5, 99]], np.int32))
  with pytest.raises(ConfigError, match=r"^prompt\[2\]\[1\]: token id 100 is outside the vocabulary \[0, 64\)$"):
    lm.generate([[1, 2], [3], [4, 100, 5]], SamplingParams(temperature=0.0), max_new_tokens=2)
  smp = lm.sampler(SamplingParams(temperature=0.0))
  state = smp.prefill([[1, 2], [3]], max_new_tokens=2, extra_slots=4)
  with pytest.raises(ConfigError, match=r"^forced\[1\]\[0\]: token id 70 is outside the vocabulary \[0, 64\)$"):
    smp.force(state, [[5], [70, 6]])
  with pytest.raises(ConfigError, match=r"^response_ids\[3\]: token id 64 is outside"):
    lm.check_ids([1, 2, 3, 64], "response_ids")
  lm.check_ids([[1, 2], [], [63]], "prompt")  # every id in range: nothing raised
