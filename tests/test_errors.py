"""Bad input raises a typed error that names what is wrong, and nothing half-written is left behind."""

import json
import os
import shutil

import numpy as np
import pytest

from reprobe_jax.errors import (
  CacheFullError,
  CheckpointError,
  ConfigError,
  DataFormatError,
  ReprobeError,
  UnsupportedModelError,
)
from reprobe_jax.models import CaptureSpec, LanguageModel, ModelConfig, SamplingParams, load_pretrained
from reprobe_jax.models import language_model as language_model_module
from reprobe_jax.models.safetensors_io import SafetensorsFile, write_safetensors

_CFG = ModelConfig(
  family="llama",
  vocab_size=64,
  hidden_size=32,
  intermediate_size=64,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
  max_position_embeddings=32,
  eos_token_ids=(2,),
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A tiny Llama saved once in Hugging Face format; tests copy it before breaking it."""
  directory = str(tmp_path_factory.mktemp("errors") / "tiny")
  LanguageModel.random(_CFG, seed=0).save_pretrained(directory)
  return directory


@pytest.fixture(scope="module")
def model(saved):
  return load_pretrained(saved, tokenizer=False)


@pytest.fixture
def copy(saved, tmp_path):
  directory = str(tmp_path / "broken")
  shutil.copytree(saved, directory)
  return directory


def _edit_config(directory, **changes):
  path = os.path.join(directory, "config.json")
  with open(path) as f:
    d = json.load(f)
  for k, v in changes.items():
    if v is None:
      d.pop(k, None)
    else:
      d[k] = v
  with open(path, "w") as f:
    json.dump(d, f)


def _edit_tensors(directory, edit):
  """Rewrites model.safetensors with `edit(dict of name -> array)` applied."""
  path = os.path.join(directory, "model.safetensors")
  st = SafetensorsFile(path)
  tensors = {k: np.array(st.get(k)) for k in st.keys()}
  del st
  edit(tensors)
  write_safetensors(path, tensors, {"format": "pt"})


# ------------------------------------------------------------------------------------------------ config.json


def test_all_errors_share_one_base_class():
  for cls in (CacheFullError, CheckpointError, ConfigError, UnsupportedModelError):
    assert issubclass(cls, ReprobeError)


def test_unsupported_model_type_is_named(copy):
  _edit_config(copy, model_type="gpt2", architectures=["GPT2LMHeadModel"])
  with pytest.raises(UnsupportedModelError, match=r"config\.json: model_type 'gpt2' is not supported.*llama"):
    load_pretrained(copy, tokenizer=False)


def test_missing_model_type_is_named(copy):
  _edit_config(copy, model_type=None)
  with pytest.raises(UnsupportedModelError, match="model_type None is not supported"):
    load_pretrained(copy, tokenizer=False)


def test_unsupported_rope_type_is_named(copy):
  _edit_config(copy, rope_parameters={"rope_type": "mrope", "rope_theta": 10000.0})
  with pytest.raises(UnsupportedModelError, match=r"config\.json: rope type 'mrope' is not supported"):
    load_pretrained(copy, tokenizer=False)


def test_legacy_rope_scaling_with_unknown_type_is_named(copy):
  _edit_config(copy, rope_parameters=None, rope_scaling={"type": "xpos", "factor": 2.0})
  with pytest.raises(UnsupportedModelError, match="rope type 'xpos'"):
    load_pretrained(copy, tokenizer=False)


def test_rope_type_missing_its_required_field(copy):
  _edit_config(copy, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0})
  with pytest.raises(ConfigError, match="'yarn' needs original_max_position_embeddings"):
    load_pretrained(copy, tokenizer=False)


def test_missing_required_field_is_named(copy):
  _edit_config(copy, hidden_size=None)
  with pytest.raises(ConfigError, match="required field 'hidden_size' is missing"):
    load_pretrained(copy, tokenizer=False)


def test_unsupported_activation_is_named(copy):
  _edit_config(copy, hidden_act="gelu")
  with pytest.raises(UnsupportedModelError, match="hidden_act 'gelu'"):
    load_pretrained(copy, tokenizer=False)


def test_invalid_json_config(copy):
  with open(os.path.join(copy, "config.json"), "w") as f:
    f.write('{"model_type": "llama",')
  with pytest.raises(DataFormatError, match=r"config\.json:1: config\.json is not valid JSON"):
    load_pretrained(copy, tokenizer=False)


def test_missing_config_json(copy):
  os.remove(os.path.join(copy, "config.json"))
  with pytest.raises(CheckpointError, match="no config.json"):
    load_pretrained(copy, tokenizer=False)


def test_heads_not_a_multiple_of_kv_heads(copy):
  _edit_config(copy, num_key_value_heads=3)
  with pytest.raises(ConfigError, match="num_heads=4 is not a multiple of num_kv_heads=3"):
    load_pretrained(copy, tokenizer=False)


def test_unknown_dtype_is_named(saved):
  with pytest.raises(ConfigError, match="dtype 'float8'"):
    load_pretrained(saved, dtype="float8", tokenizer=False)


# ------------------------------------------------------------------------------------------------ tensors


def test_missing_tensor_names_the_hf_tensor(copy):
  _edit_tensors(copy, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
  with pytest.raises(
    CheckpointError,
    match=r"missing tensors \['model\.layers\.1\.mlp\.up_proj\.weight'\] "
    r"\(1 in all\)",
  ):
    load_pretrained(copy, tokenizer=False)


def test_extra_tensor_is_named(copy):
  _edit_tensors(copy, lambda t: t.update({"model.layers.0.self_attn.rel_bias.weight": np.zeros((4, 4), np.float32)}))
  with pytest.raises(
    CheckpointError,
    match=r"unexpected tensor 'model\.layers\.0\.self_attn\.rel_bias\.weight' "
    r"\[4, 4\] for a llama model",
  ):
    load_pretrained(copy, tokenizer=False)


def test_ignored_buffers_are_not_extra(copy):
  _edit_tensors(copy, lambda t: t.update({"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)}))
  load_pretrained(copy, tokenizer=False)


def test_wrong_shape_names_the_tensor_and_both_shapes(copy):
  _edit_tensors(copy, lambda t: t.update({"model.layers.0.self_attn.q_proj.weight": np.zeros((16, 32), np.float32)}))
  with pytest.raises(
    CheckpointError,
    match=r"tensor 'model\.layers\.0\.self_attn\.q_proj\.weight' has shape "
    r"\[16, 32\].*the config expects \[32, 32\]",
  ):
    load_pretrained(copy, tokenizer=False)


def test_config_with_more_layers_than_the_checkpoint(copy):
  _edit_config(copy, num_hidden_layers=3)
  with pytest.raises(
    CheckpointError,
    match=r"missing tensors \[.*'model\.layers\.2\.input_layernorm\.weight'.*"
    r"\(9 in all\)",
  ):
    load_pretrained(copy, tokenizer=False)


def test_config_with_fewer_layers_than_the_checkpoint(copy):
  _edit_config(copy, num_hidden_layers=1)
  with pytest.raises(
    CheckpointError,
    match=r"tensor 'model\.layers\.1\..*' belongs to layer 1, but the config has "
    r"1 layers",
  ):
    load_pretrained(copy, tokenizer=False)


def test_tied_embeddings_with_a_different_head(copy):
  _edit_config(copy, tie_word_embeddings=True)
  with pytest.raises(CheckpointError, match="tie_word_embeddings=True but lm_head.weight differs"):
    load_pretrained(copy, tokenizer=False)


def test_garbage_safetensors_file(copy):
  with open(os.path.join(copy, "model.safetensors"), "wb") as f:
    f.write(b"\xff" * 8 + b"not a safetensors file at all")
  with pytest.raises(CheckpointError, match=r"model\.safetensors: not a valid safetensors file"):
    load_pretrained(copy, tokenizer=False)


def test_tiny_garbage_safetensors_file(copy):
  with open(os.path.join(copy, "model.safetensors"), "wb") as f:
    f.write(b"abc")
  with pytest.raises(CheckpointError, match=r"model\.safetensors: not a valid safetensors file"):
    load_pretrained(copy, tokenizer=False)


def test_safetensors_truncated_inside_the_header(copy):
  path = os.path.join(copy, "model.safetensors")
  with open(path, "rb") as f:
    head = f.read(40)
  with open(path, "wb") as f:
    f.write(head)
  with pytest.raises(CheckpointError, match=r"model\.safetensors: not a valid safetensors file"):
    load_pretrained(copy, tokenizer=False)


def test_safetensors_truncated_inside_the_data(copy):
  path = os.path.join(copy, "model.safetensors")
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    f.truncate(size // 2)
  with pytest.raises(CheckpointError, match=r"model\.safetensors.*truncated"):
    load_pretrained(copy, tokenizer=False)


def test_directory_without_safetensors(copy):
  os.remove(os.path.join(copy, "model.safetensors"))
  with pytest.raises(CheckpointError, match=r"no \*\.safetensors files"):
    load_pretrained(copy, tokenizer=False)


def test_index_naming_a_missing_shard(copy):
  with open(os.path.join(copy, "model.safetensors.index.json"), "w") as f:
    json.dump({"weight_map": {"model.embed_tokens.weight": "model-00002-of-00002.safetensors"}}, f)
  with pytest.raises(CheckpointError, match=r"model-00002-of-00002\.safetensors: listed in the index but missing"):
    load_pretrained(copy, tokenizer=False)


def test_a_file_that_is_not_gguf(copy):
  with pytest.raises(ConfigError, match=r"config\.json: a file must be a \.gguf checkpoint"):
    load_pretrained(os.path.join(copy, "config.json"), tokenizer=False)


def test_missing_local_path_that_is_not_a_hub_id(tmp_path):
  for path in (str(tmp_path / "no" / "such" / "model"), "./missing-model", "just-a-name", "a/b/c"):
    with pytest.raises(ConfigError, match=r"no such file or directory, and not a hub id of the form 'org/name'"):
      load_pretrained(path, tokenizer=False)


# ------------------------------------------------------------------------------------------------ forward / generate


def test_forward_longer_than_max_position_embeddings(model):
  ids = np.ones((1, 33), np.int32)
  with pytest.raises(CacheFullError, match="sequence of 33 tokens exceeds the model's max_position_embeddings=32"):
    model.forward(ids)


def test_generate_past_max_position_embeddings(model):
  with pytest.raises(
    CacheFullError,
    match=r"prompt of 30 tokens \+ max_new_tokens=5 exceeds "
    r"max_position_embeddings=32",
  ):
    model.generate([[1] * 30], SamplingParams(temperature=0.0), max_new_tokens=5)


def test_generate_that_just_fits_runs(model):
  prompt = [int(x) for x in np.random.default_rng(0).integers(3, 64, 28)]
  out = model.generate([prompt], SamplingParams(temperature=0.0), max_new_tokens=4)
  seq = list(prompt)
  for _ in range(out.lengths[0]):  # greedy by full forwards, 28 + 4 = 32 positions at most
    seq.append(int(np.argmax(np.asarray(model.forward(np.array([seq], np.int32)).logits)[0, -1])))
  assert out.token_ids(0) == seq[len(prompt) :]


def test_extend_past_the_cache(model):
  cache = model.new_cache(1, 8)
  with pytest.raises(CacheFullError, match="cache of 8 slots holds 0; cannot append 9 more"):
    model.extend(cache, np.ones((1, 9), np.int32))
  with pytest.raises(CacheFullError, match="max_position_embeddings=32"):
    model.new_cache(1, 64)


def test_token_id_outside_the_vocabulary(model):
  with pytest.raises(ConfigError, match=r"token id 64 is outside the vocabulary \[0, 64\)"):
    model.forward(np.array([[1, 64, 3]], np.int32))
  with pytest.raises(ConfigError, match=r"token id -1 is outside the vocabulary"):
    model.forward(np.array([[1, -1, 3]], np.int32))
  with pytest.raises(ConfigError, match=r"token id 100 is outside the vocabulary"):
    model.generate([[1, 2], [100]], SamplingParams(temperature=0.0), max_new_tokens=2)


def test_forward_shape_errors(model):
  with pytest.raises(ConfigError, match=r"input_ids must be \[batch, seq\], got shape \(3,\)"):
    model.forward(np.array([1, 2, 3], np.int32))
  with pytest.raises(ConfigError, match=r"attention_mask shape \(1, 2\) differs from input_ids shape \(1, 3\)"):
    model.forward(np.array([[1, 2, 3]], np.int32), np.ones((1, 2), np.int32))


def test_empty_prompts(model):
  with pytest.raises(ConfigError, match="generate: prompt 1 is empty"):
    model.generate([[1, 2], []], max_new_tokens=2)
  with pytest.raises(ConfigError, match="generate: no prompts given"):
    model.generate([], max_new_tokens=2)


def test_text_prompts_without_a_tokenizer(model):
  with pytest.raises(ConfigError, match="text prompts need a tokenizer"):
    model.generate(["hello"], max_new_tokens=2)
  with pytest.raises(ConfigError, match="stop_strings need a tokenizer"):
    model.generate([[1, 2]], max_new_tokens=2, stop_strings=("\n",))


def test_generate_argument_errors(model):
  with pytest.raises(ConfigError, match="max_new_tokens must be >= 1, got 0"):
    model.generate([[1]], max_new_tokens=0)
  with pytest.raises(ConfigError, match="n must be >= 1, got 0"):
    model.generate([[1]], max_new_tokens=1, n=0)


def test_bad_capture_layer_index(model):
  ids = np.array([[1, 2, 3]], np.int32)
  with pytest.raises(ConfigError, match=r"CaptureSpec\.hidden_layers: index 3 is outside \[-3, 2\]"):
    model.forward(ids, capture=CaptureSpec(hidden_layers=(3,)))
  with pytest.raises(ConfigError, match=r"CaptureSpec\.hidden_layers: index -4 is outside \[-3, 2\]"):
    model.generate([[1, 2]], max_new_tokens=1, capture=CaptureSpec(hidden_layers=(-4,)))
  with pytest.raises(ConfigError, match="attn_window and top_k_probs must be >= 0"):
    CaptureSpec(attn_window=-1)
  with pytest.raises(ConfigError, match="attn_window and top_k_probs must be >= 0"):
    CaptureSpec(top_k_probs=-2)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(temperature=-0.5), r"^SamplingParams\.temperature: expected a finite number >= 0\.0, got -0\.5$"),
    (dict(top_p=0.0), r"^SamplingParams\.top_p: expected a finite number in \(0\.0, 1\.0\], got 0\.0$"),
    (dict(top_p=1.5), r"^SamplingParams\.top_p: expected a finite number in \(0\.0, 1\.0\], got 1\.5$"),
    (dict(top_k=-1), r"^SamplingParams\.top_k: expected an int >= 0, got -1$"),
  ],
)
def test_bad_sampling_params(kwargs, match):
  with pytest.raises(ConfigError, match=match):
    SamplingParams(**kwargs)


# ------------------------------------------------------------------------------------------------ atomic save


def _failing_write(calls):

  def write(path, tensors, metadata=None):
    calls.append(path)
    with open(path, "wb") as f:  # half a file, then the disk "fills up"
      f.write(b"\x00" * 100)
    raise OSError("No space left on device (simulated)")

  return write


def test_save_pretrained_is_atomic_for_a_new_directory(model, tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(language_model_module, "write_safetensors", _failing_write(calls))
  parent = tmp_path / "out"
  parent.mkdir()
  target = parent / "model"
  with pytest.raises(OSError, match="No space left on device"):
    model.save_pretrained(str(target))
  assert calls, "save_pretrained did not call write_safetensors"
  assert not target.exists()
  assert os.listdir(parent) == []


def test_save_pretrained_failure_keeps_the_previous_save(model, tmp_path, monkeypatch):
  target = tmp_path / "model"
  model.save_pretrained(str(target))
  before = {name: (target / name).read_bytes() for name in os.listdir(target)}
  monkeypatch.setattr(language_model_module, "write_safetensors", _failing_write([]))
  with pytest.raises(OSError, match="No space left on device"):
    model.save_pretrained(str(target))
  assert os.listdir(tmp_path) == ["model"]
  assert {name: (target / name).read_bytes() for name in os.listdir(target)} == before
  monkeypatch.undo()
  reloaded = load_pretrained(str(target), tokenizer=False)
  ids = np.array([[1, 5, 7]], np.int32)
  np.testing.assert_allclose(np.asarray(reloaded.forward(ids).logits), np.asarray(model.forward(ids).logits), atol=1e-6)


def test_save_pretrained_interrupted_by_keyboard(model, tmp_path, monkeypatch):
  def interrupted(path, tensors, metadata=None):
    raise KeyboardInterrupt

  monkeypatch.setattr(language_model_module, "write_safetensors", interrupted)
  with pytest.raises(KeyboardInterrupt):
    model.save_pretrained(str(tmp_path / "model"))
  assert os.listdir(tmp_path) == []


def test_write_safetensors_leaves_no_temp_file_on_failure(tmp_path, monkeypatch):
  def failing_replace(src, dst):
    raise OSError("rename failed (simulated)")

  monkeypatch.setattr(os, "replace", failing_replace)
  with pytest.raises(OSError, match="rename failed"):
    write_safetensors(str(tmp_path / "x.safetensors"), {"a": np.zeros(2, np.float32)})
  monkeypatch.undo()
  assert os.listdir(tmp_path) == []
