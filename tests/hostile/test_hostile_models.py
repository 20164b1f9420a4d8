"""Hostile model files: damaged safetensors headers, mixed model folders, config.json fields of the wrong type or
range, truncated or corrupt GGUF files and broken tokenizers each raise one typed error naming the file and the
tensor or field; fuzzers of the safetensors and GGUF parsers find nothing but ReprobeErrors, and what they accept is
what the reference readers (the `safetensors` package, `gguf.GGUFReader`) read."""

import json
import math
import os
import re
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from reprobe_jax.errors import CheckpointError, ConfigError, DataFormatError, ReprobeError, UnsupportedModelError
from reprobe_jax.models import LanguageModel, ModelConfig, load_pretrained, load_tokenizer
from reprobe_jax.models import gguf_file, gguf_io
from reprobe_jax.models.checkpoint import export_tensors
from reprobe_jax.models.safetensors_io import SafetensorsFile, write_safetensors

from test_errors import _CFG, _edit_config, copy, saved  # noqa: F401 (fixtures: a tiny Llama saved once)

# FUZZ_EXAMPLES=3000 for a deeper run (about 4 minutes); the default keeps this file under a minute.
FUZZ = settings(
  max_examples=int(os.environ.get("FUZZ_EXAMPLES", 200)),
  deadline=None,
  suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _raw_safetensors(path, header, data=b"", length=None):
  """A safetensors file with exactly this header (a dict, or raw bytes) and data bytes."""
  blob = header if isinstance(header, bytes) else json.dumps(header).encode()
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob) if length is None else length) + blob + data)
  return str(path)


def _entry(dtype="F32", shape=(2,), offsets=(0, 8)):
  return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


# ------------------------------------------------------------------------------------------------ safetensors headers

_BAD_HEADERS = {
  "negative begin": ({"w": _entry(offsets=(-8, 0))}, r"tensor 'w': data_offsets \[-8, 0\] must satisfy 0 <= begin"),
  "end before begin": ({"w": _entry(offsets=(8, 0))}, r"tensor 'w': data_offsets \[8, 0\] must satisfy"),
  "span vs shape": (
    {"w": _entry(offsets=(0, 4))},
    r"tensor 'w': data_offsets \[0, 4\] span 4 bytes, but shape "
    r"\[2\] of F32 needs 8",
  ),
  "overlap": ({"a": _entry(), "b": _entry(offsets=(4, 12))}, r"tensor 'b' \(bytes 4\.\.12\) overlaps tensor 'a'"),
  "same bytes": ({"a": _entry(), "b": _entry()}, r"tensor '[ab]' \(bytes 0\.\.8\) overlaps tensor '[ab]'"),
  "gap": ({"w": _entry(offsets=(8, 16))}, r"tensor 'w' starts at byte 8 of the data, leaving bytes 0\.\.8"),
  "past the end": (
    {"w": _entry(shape=(4,), offsets=(0, 16))},
    r"truncated: its tensors need 16 bytes of data, "
    r"the file has 8",
  ),
  "trailing bytes": ({"w": _entry(shape=(1,), offsets=(0, 4))}, r"4 bytes after the last tensor"),
  "unknown dtype": ({"w": _entry(dtype="F7")}, r"tensor 'w': unsupported dtype 'F7'"),
  "dtype not a string": ({"w": _entry(dtype=4)}, r"tensor 'w': unsupported dtype 4"),
  "huge empty shape": (
    {"w": _entry(shape=(0, 2**63), offsets=(0, 0))},
    r"tensor 'w': shape \[0, 9223372036854775808\] is too large",
  ),
  "negative dim": ({"w": _entry(shape=(-2,))}, r"tensor 'w': shape must be a list of non-negative integers"),
  "float dim": ({"w": _entry(shape=(2.0,))}, r"tensor 'w': shape must be a list of non-negative integers"),
  "bool dim": ({"w": {"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]}}, r"'w': shape must be a list"),
  "shape a number": ({"w": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}}, r"'w': shape must be a list"),
  "three offsets": ({"w": _entry(offsets=(0, 4, 8))}, r"tensor 'w': data_offsets must be two integers"),
  "string offsets": ({"w": _entry(offsets=("0", "8"))}, r"tensor 'w': data_offsets must be two integers"),
  "missing key": ({"w": {"dtype": "F32", "shape": [2]}}, r"tensor 'w': entry must have exactly the keys"),
  "extra key": ({"w": dict(_entry(), crc=1)}, r"tensor 'w': entry must have exactly the keys"),
  "entry a list": ({"w": [1, 2]}, r"tensor 'w': entry must have exactly the keys.*got list"),
  "metadata not strings": ({"__metadata__": {"format": 1}, "w": _entry()}, r"__metadata__ must map strings"),
  "metadata a list": ({"__metadata__": ["pt"], "w": _entry()}, r"__metadata__ must map strings"),
}


@pytest.mark.parametrize("case", sorted(_BAD_HEADERS))
def test_bad_safetensors_header_names_file_and_tensor(tmp_path, case):
  header, match = _BAD_HEADERS[case]
  path = _raw_safetensors(tmp_path / "m.safetensors", header, np.arange(2, dtype=np.float32).tobytes())
  with pytest.raises(CheckpointError, match=match) as e:
    SafetensorsFile(path)
  assert path in str(e.value)


@pytest.mark.parametrize(
  "blob, match",
  [
    (b'{"w": ', r"header is not valid JSON"),
    (b"[1, 2]", r"header is not a JSON object"),
    (b'{"w": {"dtype": "F32"}, "w": {"dtype": "F32"}}', r"key 'w' appears twice"),
    (b'{"\xff": 1}', r"header is not UTF-8: byte 0xff at offset 10"),
    (b'{"w": ' + b"9" * 5000 + b"}", r"header is not valid JSON"),
    (b"", r"header is not valid JSON"),
  ],
)
def test_malformed_safetensors_header_bytes(tmp_path, blob, match):
  path = _raw_safetensors(tmp_path / "m.safetensors", blob)
  with pytest.raises(CheckpointError, match=match):
    SafetensorsFile(path)


def test_safetensors_header_length_is_bounded_by_the_file(tmp_path):
  for length in (1 << 40, 1 << 63, 100):
    path = _raw_safetensors(tmp_path / "m.safetensors", {"w": _entry()}, b"\0" * 8, length=length)
    with pytest.raises(
      CheckpointError,
      match=rf"m\.safetensors: not a valid safetensors file \(header length "
      rf"{length} exceeds",
    ):
      SafetensorsFile(path)
  (tmp_path / "short.safetensors").write_bytes(b"\x02\0\0")
  with pytest.raises(CheckpointError, match=r"short\.safetensors: .*it has 3 bytes, fewer than the 8"):
    SafetensorsFile(str(tmp_path / "short.safetensors"))


def test_a_valid_header_reads_exactly(tmp_path):
  arrays = {
    "a": np.arange(6, dtype=np.float32).reshape(2, 3),
    "empty": np.zeros((0, 4), np.float16),
    "i": np.array([-1, 7], np.int64),
    "b": np.array([True, False]),
  }
  write_safetensors(str(tmp_path / "m.safetensors"), arrays, {"format": "pt"})
  st_file = SafetensorsFile(str(tmp_path / "m.safetensors"))
  assert st_file.metadata == {"format": "pt"} and sorted(st_file.keys()) == sorted(arrays)
  for k, v in arrays.items():
    assert st_file.get(k).dtype == v.dtype
    np.testing.assert_array_equal(st_file.get(k), v)


def test_negative_offsets_never_serve_header_bytes_as_weights(copy):
  """The issue's case: an offset pointing back into the header of a real model file is refused at load time."""
  path = os.path.join(copy, "model.safetensors")
  st_file = SafetensorsFile(path)
  header = {k: dict(st_file.header[k]) for k in st_file.keys()}
  data = open(path, "rb").read()[st_file._offset :]
  del st_file
  name = "model.norm.weight"
  b, e = header[name]["data_offsets"]
  header[name]["data_offsets"] = [b - 64, e - 64]
  _raw_safetensors(path, header, data)
  with pytest.raises(
    CheckpointError,
    match=rf"model\.safetensors: tensor '{name}': data_offsets .* must satisfy|"
    rf"model\.safetensors: tensor .* overlaps tensor",
  ):
    load_pretrained(copy, tokenizer=False)


# ------------------------------------------------------------------------------------------------ model folders


def _split(directory, index: bool):
  """Rewrites the folder's model.safetensors as two files (layer 0 and the rest), with or without an index."""
  path = os.path.join(directory, "model.safetensors")
  st_file = SafetensorsFile(path)
  tensors = {k: np.array(st_file.get(k)) for k in st_file.keys()}
  del st_file
  os.remove(path)
  first = {k: v for k, v in tensors.items() if ".layers.0." in k}
  rest = {k: v for k, v in tensors.items() if k not in first}
  write_safetensors(os.path.join(directory, "model-00001-of-00002.safetensors"), first)
  write_safetensors(os.path.join(directory, "model-00002-of-00002.safetensors"), rest)
  weight_map = {k: "model-00001-of-00002.safetensors" for k in first}
  weight_map.update({k: "model-00002-of-00002.safetensors" for k in rest})
  if index:
    _write_index(directory, weight_map)
  return tensors, weight_map


def _write_index(directory, weight_map):
  with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)


def _logits(model):
  return np.asarray(model.forward(np.array([[1, 5, 7, 3]], np.int32)).logits)


@pytest.mark.parametrize("index", [False, True])
def test_split_checkpoint_loads_like_the_single_file(saved, copy, index):
  _split(copy, index)
  np.testing.assert_array_equal(
    _logits(load_pretrained(copy, tokenizer=False)), _logits(load_pretrained(saved, tokenizer=False))
  )


@pytest.mark.parametrize("index", [False, True])
def test_two_checkpoints_in_one_folder_are_refused(copy, index):
  """The issue's case 1: a second model's file with the same tensor names is never loaded silently."""
  other = LanguageModel.random(_CFG, seed=1)
  write_safetensors(os.path.join(copy, "other.safetensors"), export_tensors(_CFG, other.params))
  if index:
    st_file = SafetensorsFile(os.path.join(copy, "model.safetensors"))
    _write_index(copy, {k: "model.safetensors" for k in st_file.keys()})
  with pytest.raises(
    CheckpointError,
    match=r"tensor '.*' is in both .*(model|other)\.safetensors and "
    r".*(other|model)\.safetensors",
  ):
    load_pretrained(copy, tokenizer=False)


@pytest.mark.parametrize(
  "name",
  [
    "../model.safetensors",
    "/etc/passwd",
    "sub/../../x.safetensors",
    "..\\model.safetensors",
    "C:model.safetensors",
    "",
  ],
)
def test_index_paths_stay_inside_the_folder(copy, name):
  _, weight_map = _split(copy, index=True)
  key = next(iter(weight_map))
  weight_map[key] = name
  _write_index(copy, weight_map)
  with pytest.raises(
    CheckpointError,
    match=r"model\.safetensors\.index\.json: weight_map\[.*\] (= .* points "
    r"outside the model folder|must be a file name)",
  ):
    load_pretrained(copy, tokenizer=False)


def test_index_naming_a_tensor_absent_from_its_file(copy):
  _, weight_map = _split(copy, index=True)
  weight_map["model.layers.0.self_attn.extra.weight"] = "model-00001-of-00002.safetensors"
  _write_index(copy, weight_map)
  with pytest.raises(
    CheckpointError,
    match=r"index\.json: tensors \['model\.layers\.0\.self_attn\.extra\.weight'\] "
    r"are assigned to model-00001-of-00002\.safetensors, which does not",
  ):
    load_pretrained(copy, tokenizer=False)


def test_file_holding_tensors_the_index_puts_elsewhere(copy):
  _, weight_map = _split(copy, index=True)
  key = next(k for k, v in weight_map.items() if v.startswith("model-00001"))
  weight_map[key] = "model-00002-of-00002.safetensors"
  _write_index(copy, weight_map)
  with pytest.raises(CheckpointError, match=r"(does not hold them|assigns elsewhere)"):
    load_pretrained(copy, tokenizer=False)


@pytest.mark.parametrize(
  "content, error, match",
  [
    ('{"weight_map": {}}', CheckpointError, r"weight_map must be a non-empty object"),
    ('{"weight_map": ["a"]}', CheckpointError, r"weight_map must be a non-empty object"),
    (
      '{"weight_map": {"model.norm.weight": 3}}',
      CheckpointError,
      r"weight_map\['model\.norm\.weight'\] must be a file",
    ),
    ('{"weight_map": ', DataFormatError, r"index\.json:1: safetensors index is not valid JSON"),
    ("[]", DataFormatError, r"index\.json: safetensors index must hold a JSON object"),
  ],
)
def test_malformed_index(copy, content, error, match):
  with open(os.path.join(copy, "model.safetensors.index.json"), "w") as f:
    f.write(content)
  with pytest.raises(error, match=match):
    load_pretrained(copy, tokenizer=False)


# ------------------------------------------------------------------------------------------------ config.json

_FAMILY_CONFIGS = {
  "llama": _CFG,
  "mistral": _CFG.replace(family="mistral", sliding_windows=(4, 4)),
  "qwen2": _CFG.replace(family="qwen2", attention_bias=True),
  "qwen3": _CFG.replace(family="qwen3", qk_norm=True, tie_word_embeddings=True),
  "phi3": _CFG.replace(family="phi3"),
}

# (field, bad value, error, what the message must say). Each is applied to every family's config.json.
_BAD_FIELDS = [
  ("tie_word_embeddings", "false", ConfigError, r"'tie_word_embeddings' must be a JSON boolean.*got 'false'"),
  ("tie_word_embeddings", 0, ConfigError, r"'tie_word_embeddings' must be a JSON boolean"),
  ("attention_bias", "true", ConfigError, r"'attention_bias' must be a JSON boolean"),
  ("mlp_bias", "no", ConfigError, r"'mlp_bias' must be a JSON boolean"),
  ("num_attention_heads", 0, ConfigError, r"'num_attention_heads' must be an integer >= 1, got 0"),
  ("num_attention_heads", 4.0, ConfigError, r"'num_attention_heads' must be an integer >= 1, got 4\.0"),
  ("num_attention_heads", True, ConfigError, r"'num_attention_heads' must be an integer >= 1, got True"),
  ("num_key_value_heads", 0, ConfigError, r"'num_key_value_heads' must be an integer >= 1, got 0"),
  ("num_key_value_heads", 3, ConfigError, r"num_heads=4 is not a multiple of num_kv_heads=3"),
  ("num_hidden_layers", -1, ConfigError, r"'num_hidden_layers' must be an integer >= 1, got -1"),
  ("hidden_size", "32", ConfigError, r"'hidden_size' must be an integer >= 1, got '32'"),
  ("intermediate_size", 0, ConfigError, r"'intermediate_size' must be an integer >= 1"),
  ("vocab_size", 64.5, ConfigError, r"'vocab_size' must be an integer >= 1"),
  ("head_dim", 0, ConfigError, r"'head_dim' must be an integer >= 1, got 0"),
  ("head_dim", 7, ConfigError, r"gives 7 rotary dimensions; RoPE needs an even number"),
  ("max_position_embeddings", 0, ConfigError, r"'max_position_embeddings' must be an integer >= 1"),
  ("rms_norm_eps", float("nan"), ConfigError, r"'rms_norm_eps' must be a finite number, got nan"),
  ("rms_norm_eps", 0.0, ConfigError, r"rms_norm_eps must be a finite number > 0, got 0\.0"),
  ("rms_norm_eps", "1e-6", ConfigError, r"'rms_norm_eps' must be a finite number"),
  ("rope_theta", float("inf"), ConfigError, r"'rope_theta' must be a finite number"),
  ("partial_rotary_factor", 1.5, ConfigError, r"partial_rotary_factor must be in \(0, 1\], got 1\.5"),
  ("eos_token_id", "2", ConfigError, r"'eos_token_id' must be an integer >= 0, got '2'"),
  ("eos_token_id", 64, ConfigError, r"eos_token_ids: 64 is not a token id in \[0, vocab_size=64\)"),
  ("eos_token_id", [2, -1], ConfigError, r"'eos_token_id' must be a list of non-negative integers"),
  ("bos_token_id", 1.5, ConfigError, r"'bos_token_id' must be an integer >= 0"),
  ("pad_token_id", -1, ConfigError, r"'pad_token_id' must be an integer >= 0, got -1"),
  ("hidden_act", 5, ConfigError, r"'hidden_act' must be a string, got 5"),
  ("model_type", 5, UnsupportedModelError, r"model_type 5 is not supported"),
  ("rope_parameters", "linear", ConfigError, r"'rope_parameters' must be an object, got 'linear'"),
  ("rope_parameters", {"rope_type": "linear", "rope_theta": 1e4}, ConfigError, r"rope type 'linear' needs factor"),
  (
    "rope_parameters",
    {"rope_type": "linear", "factor": 0.0},
    ConfigError,
    r"rope factor must be a finite number "
    r"> 0, got 0\.0",
  ),
  ("rope_parameters", {"rope_type": "linear", "factor": -2}, ConfigError, r"rope factor must be .* got -2"),
  (
    "rope_parameters",
    {"rope_type": "linear", "factor": "2"},
    ConfigError,
    r"'rope_parameters\.factor' must be a "
    r"finite number",
  ),
  ("rope_parameters", {"rope_type": "dynamic"}, ConfigError, r"rope type 'dynamic' needs factor"),
  ("rope_parameters", {"rope_type": "ntk"}, UnsupportedModelError, r"rope type 'ntk' is not supported"),
  ("rope_parameters", {"rope_type": 3}, ConfigError, r"'rope_parameters\.rope_type' must be a string"),
  (
    "rope_parameters",
    {
      "rope_type": "llama3",
      "factor": 8.0,
      "low_freq_factor": 4.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 16,
    },
    ConfigError,
    r"high_freq_factor > low_freq_factor",
  ),
  (
    "rope_parameters",
    {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16},
    ConfigError,
    r"rope type 'llama3' needs low_freq_factor",
  ),
  (
    "rope_parameters",
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 0},
    ConfigError,
    r"'rope_parameters\.original_max_position_embeddings' must be an integer >= 1, got 0",
  ),
  (
    "rope_parameters",
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16, "truncate": "yes"},
    ConfigError,
    r"'rope_parameters\.truncate' must be a JSON boolean",
  ),
  (
    "rope_parameters",
    {
      "rope_type": "longrope",
      "short_factor": [1.0] * 3,
      "long_factor": [1.0] * 4,
      "original_max_position_embeddings": 16,
    },
    ConfigError,
    r"needs short_factor with rotary_dim / 2 = 4 entries, got 3",
  ),
  (
    "rope_parameters",
    {
      "rope_type": "longrope",
      "short_factor": [1.0, "x", 1, 1],
      "long_factor": [1.0] * 4,
      "original_max_position_embeddings": 16,
    },
    ConfigError,
    r"'rope_parameters\.short_factor' must be a list of finite numbers",
  ),
  ("rope_scaling", {"type": "linear"}, ConfigError, r"rope type 'linear' needs factor"),
]


@pytest.mark.parametrize("family", sorted(_FAMILY_CONFIGS))
@pytest.mark.parametrize("field, value, error, match", _BAD_FIELDS, ids=[f"{f}={v!r}" for f, v, _, _ in _BAD_FIELDS])
def test_bad_config_field_is_named(family, field, value, error, match):
  d = _FAMILY_CONFIGS[family].to_hf_dict()
  d[field] = value
  if field == "rope_scaling":
    d.pop("rope_parameters")
  with pytest.raises(error, match=match) as e:
    ModelConfig.from_hf_dict(d, source="/m/config.json")
  assert str(e.value).startswith("/m/config.json: ")


@pytest.mark.parametrize("family", sorted(_FAMILY_CONFIGS))
def test_valid_config_round_trips(family):
  cfg = _FAMILY_CONFIGS[family]
  assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_sliding_window_fields(family):
  d = _FAMILY_CONFIGS[family].to_hf_dict()
  d.update(use_sliding_window=True, sliding_window=4, layer_types=["full_attention"])
  with pytest.raises(ConfigError, match=r"layer_types must list .* for each of the 2 layers, got 1 entries"):
    ModelConfig.from_hf_dict(d)
  d.update(layer_types=None, max_window_layers=-1)
  with pytest.raises(ConfigError, match=r"'max_window_layers' must be an integer >= 0"):
    ModelConfig.from_hf_dict(d)
  d.update(max_window_layers=1)
  assert ModelConfig.from_hf_dict(d).sliding_windows == (None, 4)
  d.update(use_sliding_window="true")
  with pytest.raises(ConfigError, match=r"'use_sliding_window' must be a JSON boolean"):
    ModelConfig.from_hf_dict(d)


def test_mistral_sliding_window_range():
  d = _FAMILY_CONFIGS["mistral"].to_hf_dict()
  for bad in (0, -4, "4"):
    d["sliding_window"] = bad
    with pytest.raises(ConfigError, match=r"'sliding_window' must be an integer >= 1"):
      ModelConfig.from_hf_dict(d)


def test_string_false_for_tied_embeddings_fails_the_load(copy):
  """The issue's case 7: "false" (a string) is not read as true."""
  _edit_config(copy, tie_word_embeddings="false")
  with pytest.raises(ConfigError, match=r"config\.json: field 'tie_word_embeddings' must be a JSON boolean"):
    load_pretrained(copy, tokenizer=False)


def test_linear_rope_without_factor_fails_the_load(copy):
  """The issue's case 7: linear RoPE without a factor gave NaN logits; now it is refused before loading."""
  _edit_config(copy, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0})
  with pytest.raises(ConfigError, match=r"config\.json: rope type 'linear' needs factor"):
    load_pretrained(copy, tokenizer=False)


def test_zero_heads_fails_the_load(copy):
  _edit_config(copy, num_attention_heads=0)
  with pytest.raises(ConfigError, match=r"config\.json: field 'num_attention_heads' must be an integer >= 1, got 0"):
    load_pretrained(copy, tokenizer=False)


@pytest.mark.parametrize(
  "content, match",
  [
    (b"[1]", r"config\.json: config\.json must hold a JSON object"),
    (b'{"a": "\xff"}', r"config\.json:1: config\.json is not UTF-8"),
  ],
)
def test_config_json_that_is_not_an_object_or_not_text(copy, content, match):
  with open(os.path.join(copy, "config.json"), "wb") as f:
    f.write(content)
  with pytest.raises(DataFormatError, match=match):
    load_pretrained(copy, tokenizer=False)


def test_direct_construction_is_checked_too():
  with pytest.raises(ConfigError, match=r"num_heads must be an integer >= 1, got 0"):
    _CFG.replace(num_heads=0)
  with pytest.raises(ConfigError, match=r"tie_word_embeddings must be a boolean, got 'false'"):
    _CFG.replace(tie_word_embeddings="false")
  with pytest.raises(ConfigError, match=r"rope type 'linear' needs factor"):
    _CFG.replace(rope=_CFG.rope.__class__(rope_type="linear"))


# ------------------------------------------------------------------------------------------------ GGUF

_HF_TO_GGUF = {v: k for k, v in gguf_io._GLOBAL.items()}


def _write_gguf(path, model, *, metadata=None, tokenizer=False, skip=()):
  """A llama-architecture F32 GGUF of `model`, q/k rows permuted the way llama.cpp's converter does; `metadata`
  {key: (value, GGUFValueType)} replaces or adds keys, `skip` drops standard ones."""
  import gguf

  cfg = model.config
  writer = gguf.GGUFWriter(str(path), "llama")
  std = {
    "llama.block_count": (cfg.num_layers, gguf.GGUFValueType.UINT32),
    "llama.context_length": (cfg.max_position_embeddings, gguf.GGUFValueType.UINT32),
    "llama.embedding_length": (cfg.hidden_size, gguf.GGUFValueType.UINT32),
    "llama.feed_forward_length": (cfg.intermediate_size, gguf.GGUFValueType.UINT32),
    "llama.attention.head_count": (cfg.num_heads, gguf.GGUFValueType.UINT32),
    "llama.attention.head_count_kv": (cfg.num_kv_heads, gguf.GGUFValueType.UINT32),
    "llama.rope.dimension_count": (cfg.head_dim, gguf.GGUFValueType.UINT32),
    "llama.attention.layer_norm_rms_epsilon": (cfg.rms_norm_eps, gguf.GGUFValueType.FLOAT32),
    "llama.rope.freq_base": (cfg.rope.theta, gguf.GGUFValueType.FLOAT32),
    "tokenizer.ggml.eos_token_id": (cfg.eos_token_ids[0], gguf.GGUFValueType.UINT32),
  }
  std.update(metadata or {})
  for key, (value, vtype) in std.items():
    if key not in skip:
      writer.add_key_value(key, value, vtype, gguf.GGUFValueType.STRING if vtype == gguf.GGUFValueType.ARRAY else None)
  tokens = [f"t{i}" for i in range(cfg.vocab_size)]
  writer.add_token_list(tokens)
  writer.add_token_scores([-float(i) for i in range(cfg.vocab_size)])
  if tokenizer:
    writer.add_tokenizer_model("gpt2")
    writer.add_token_merges([])
  for name, arr in export_tensors(cfg, model.params).items():
    if name.startswith("model.layers."):
      layer, rest = name[len("model.layers.") :].split(".", 1)
      part = rest.rsplit(".", 1)
      block = {v: k for k, v in gguf_io._BLOCK.items()}[part[0]]
      gname = f"blk.{layer}.{block}.{part[1]}"
      if block in ("attn_q", "attn_k"):
        arr = gguf_io.llama_cpp_permute(arr, cfg.num_heads if block == "attn_q" else cfg.num_kv_heads)
    else:
      gname = _HF_TO_GGUF[name]
    writer.add_tensor(gname, np.ascontiguousarray(arr, np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return str(path)


@pytest.fixture(scope="module")
def tiny():
  return LanguageModel.random(_CFG, seed=3)


@pytest.fixture(scope="module")
def tiny_gguf(tiny, tmp_path_factory):
  return _write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tiny)


def _same_params(a, b):
  import jax

  la, lb = jax.tree.leaves(a.params), jax.tree.leaves(b.params)
  return len(la) == len(lb) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb))


def test_tiny_gguf_loads_exactly(tiny, tiny_gguf):
  loaded = load_pretrained(tiny_gguf)  # no tokenizer metadata: no tokenizer, no warning, no error
  assert loaded.tokenizer is None
  assert loaded.config == _CFG.replace(
    rms_norm_eps=float(np.float32(_CFG.rms_norm_eps)), bos_token_id=None, pad_token_id=None
  )
  assert _same_params(loaded, tiny)


def _field_offset(data: bytes, key: str) -> int:
  """Byte offset of the value type that follows metadata key `key`."""
  at = data.index(struct.pack("<Q", len(key)) + key.encode())
  return at + 8 + len(key)


def _tensor_info_offset(data: bytes, name: str) -> int:
  """Byte offset of the n_dims field of tensor `name`'s header entry."""
  at = data.index(struct.pack("<Q", len(name)) + name.encode())
  return at + 8 + len(name)


def _patched(tmp_path, source, patches, name="bad.gguf"):
  data = bytearray(open(source, "rb").read())
  for at, blob in patches:
    data[at : at + len(blob)] = blob
  path = tmp_path / name
  path.write_bytes(bytes(data))
  return str(path)


@pytest.mark.parametrize("cut", [0, 3, 8, 23, 40, 100, 600, -1000, -4])
def test_truncated_gguf_names_the_file(tiny_gguf, tmp_path, cut):
  data = open(tiny_gguf, "rb").read()
  path = tmp_path / "cut.gguf"
  path.write_bytes(data[:cut] if cut >= 0 else data[: len(data) + cut])
  with pytest.raises(CheckpointError, match=r"cut\.gguf: (truncated GGUF file|not a readable GGUF file|corrupt)"):
    load_pretrained(str(path), tokenizer=False)


def test_gguf_counts_and_lengths_are_bounded_by_the_file(tiny_gguf, tmp_path):
  data = open(tiny_gguf, "rb").read()
  tokens = _field_offset(data, "tokenizer.ggml.tokens")
  name_at = data.index(b"tokenizer.ggml.tokens") - 8
  scores = _field_offset(data, "tokenizer.ggml.scores")
  cases = {
    "array count": (
      [(tokens + 8, struct.pack("<Q", 1 << 62))],
      r"length of array 'tokenizer\.ggml\.tokens' is "
      r"4611686018427387904, but",
    ),
    # gguf.GGUFReader loops without end on this one (a float array's count past the file).
    "float array count": (
      [(scores + 8, struct.pack("<Q", 1 << 62))],
      r"length of array 'tokenizer\.ggml\.scores' "
      r"is 4611686018427387904, but",
    ),
    "string length": (
      [(name_at, struct.pack("<Q", 1 << 60))],
      r"truncated GGUF file: metadata key at byte \d+ "
      r"needs 1152921504606846976 bytes",
    ),
    "tensor count": ([(8, struct.pack("<Q", 1 << 40))], r"tensor count is 1099511627776, but"),
    "metadata count": ([(16, struct.pack("<Q", 1 << 50))], r"metadata count is 1125899906842624, but"),
    "value type": ([(tokens, struct.pack("<I", 77))], r"'tokenizer\.ggml\.tokens' has unknown value type 77"),
    "array item type": ([(tokens + 4, struct.pack("<I", 9))], r"arrays of type 9 are not supported"),
    "version": ([(4, struct.pack("<I", 1))], r"GGUF version 1 is not supported"),
  }
  for case, (patches, match) in cases.items():
    error = UnsupportedModelError if case == "version" else CheckpointError
    with pytest.raises(error, match=match):
      gguf_file.open_gguf(_patched(tmp_path, tiny_gguf, patches, f"{case.replace(' ', '_')}.gguf"))


def test_gguf_tensor_table_is_checked(tiny_gguf, tmp_path):
  data = open(tiny_gguf, "rb").read()
  norm = _tensor_info_offset(data, "output_norm.weight")  # n_dims u32, dims u64 x 1, type u32, offset u64
  embd = _tensor_info_offset(data, "token_embd.weight")  # 2 dims
  embd_offset = struct.unpack_from("<Q", data, embd + 4 + 16 + 4)[0]
  other = _tensor_info_offset(data, "output.weight")
  k_name = data.index(b"blk.0.attn_k.weight")
  cases = {
    "offset past the end": (
      [(norm + 16, struct.pack("<Q", 1 << 40))],
      r"truncated GGUF file: tensor "
      r"'output_norm\.weight' needs bytes",
    ),
    "unaligned offset": (
      [(norm + 16, struct.pack("<Q", 4))],
      r"'output_norm\.weight' offset 4 is not a multiple "
      r"of the alignment 32",
    ),
    "overlap": ([(other + 4 + 16 + 4, struct.pack("<Q", embd_offset))], r"overlaps tensor"),
    "unknown type": ([(norm + 12, struct.pack("<I", 200))], r"'output_norm\.weight' has unknown ggml type 200"),
    "zero dims": ([(norm, struct.pack("<I", 0))], r"'output_norm\.weight' has 0 dimensions"),
    "nine dims": ([(norm, struct.pack("<I", 9))], r"'output_norm\.weight' has 9 dimensions"),
    "zero size": ([(norm + 4, struct.pack("<Q", 0))], r"'output_norm\.weight' has shape \[0\]"),
    "same name": ([(k_name, b"blk.0.attn_q.weight")], r"tensor 'blk\.0\.attn_q\.weight' appears twice"),
  }
  for case, (patches, match) in cases.items():
    with pytest.raises(CheckpointError, match=match) as e:
      gguf_file.open_gguf(_patched(tmp_path, tiny_gguf, patches, f"{case.replace(' ', '_')}.gguf"))
    assert f"{case.replace(' ', '_')}.gguf" in str(e.value)


def test_gguf_repeated_metadata_key(tmp_path):
  import gguf

  writer = gguf.GGUFWriter(str(tmp_path / "one.gguf"), "llama")
  writer.add_uint32("llama.block_count", 2)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.close()
  raw = bytearray(open(tmp_path / "one.gguf", "rb").read())
  field = raw[raw.index(b"llama.block_count") - 8 :]  # the last field: key, type, value
  raw[16:24] = struct.pack("<Q", 3)  # general.architecture, llama.block_count, and the same again
  (tmp_path / "dup.gguf").write_bytes(bytes(raw) + bytes(field))
  with pytest.raises(CheckpointError, match=r"dup\.gguf: GGUF metadata key 'llama\.block_count' appears twice"):
    gguf_file.open_gguf(tmp_path / "dup.gguf")


_U32, _F32, _STR, _BOOLT, _I32 = 4, 6, 8, 7, 5
_BAD_GGUF_META = [
  ({"llama.block_count": ("2", _STR)}, r"'llama\.block_count' must be an integer, got a string"),
  ({"llama.attention.head_count": (0, _U32)}, r"'llama\.attention\.head_count' must be >= 1, got 0"),
  ({"llama.attention.head_count_kv": (3, _U32)}, r"num_heads=4 is not a multiple of num_kv_heads=3"),
  ({"llama.embedding_length": (-32, _I32)}, r"'llama\.embedding_length' must be >= 1, got -32"),
  ({"llama.context_length": (True, _BOOLT)}, r"'llama\.context_length' must be an integer, got a bool"),
  ({"llama.rope.freq_base": (float("nan"), _F32)}, r"'llama\.rope\.freq_base' must be a finite number > 0, got nan"),
  ({"llama.attention.layer_norm_rms_epsilon": (0.0, _F32)}, r"layer_norm_rms_epsilon' must be a finite number > 0"),
  ({"tokenizer.ggml.eos_token_id": (2.0, _F32)}, r"'tokenizer\.ggml\.eos_token_id' must be an integer, got a float32"),
  ({"tokenizer.ggml.eos_token_id": (64, _U32)}, r"eos_token_ids: 64 is not a token id in \[0, vocab_size=64\)"),
  ({"llama.rope.scaling.type": ("linear", _STR)}, r"GGUF metadata key 'llama\.rope\.scaling\.factor' is missing"),
  (
    {"llama.rope.scaling.type": ("linear", _STR), "llama.rope.scaling.factor": (-1.0, _F32)},
    r"'llama\.rope\.scaling\.factor' must be a finite number > 0",
  ),
  ({"llama.rope.scaling.type": (3, _U32)}, r"'llama\.rope\.scaling\.type' must be a string"),
  ({"general.alignment": (3, _U32)}, r"general\.alignment must be a uint32 power of two, got 3"),
  ({"llama.rope.dimension_count": (7, _U32)}, r"gives 7 rotary dimensions"),
]


@pytest.mark.parametrize("metadata, match", _BAD_GGUF_META, ids=[next(iter(m)) for m, _ in _BAD_GGUF_META])
def test_bad_gguf_metadata_is_named(tiny, tmp_path, metadata, match):
  path = _write_gguf(tmp_path / "meta.gguf", tiny, metadata=metadata)
  with pytest.raises(ReprobeError, match=match) as e:
    load_pretrained(path, tokenizer=False)
  assert isinstance(e.value, (ConfigError, CheckpointError)) and "meta.gguf" in str(e.value)


def test_gguf_missing_required_key(tiny, tmp_path):
  path = _write_gguf(tmp_path / "nokey.gguf", tiny, skip=("llama.feed_forward_length",))
  with pytest.raises(ConfigError, match=r"nokey\.gguf: GGUF metadata key 'llama\.feed_forward_length' is missing"):
    load_pretrained(path, tokenizer=False)


# ------------------------------------------------------------------------------------------------ tokenizers


@pytest.fixture
def tok_dir(tmp_path, word_tokenizer):
  directory = tmp_path / "tok"
  word_tokenizer.save_pretrained(str(directory))
  return str(directory)


@pytest.mark.parametrize(
  "name, content, match",
  [
    ("tokenizer.json", '{"version": ', r"tokenizer\.json:1: tokenizer\.json is not valid JSON"),
    ("tokenizer.json", "[1, 2]", r"tokenizer\.json: tokenizer\.json must hold a JSON object"),
    ("tokenizer.json", "{}", r"tokenizer\.json: the tokenizer does not load \(KeyError"),
    ("tokenizer.json", None, r"tokenizer\.json: the tokenizer does not load \(Exception: data did not match"),
    ("tokenizer.json", b"\xff\xfe", r"tokenizer\.json:1: tokenizer\.json is not UTF-8"),
    ("tokenizer_config.json", "{", r"tokenizer_config\.json:1: tokenizer_config\.json is not valid JSON"),
  ],
)
def test_corrupt_tokenizer_is_a_data_format_error(tok_dir, name, content, match):
  path = os.path.join(tok_dir, name)
  if content is None:  # valid JSON that the tokenizers library rejects
    d = json.load(open(path))
    d["model"] = {"type": "NoSuchModel"}
    content = json.dumps(d)
  with open(path, "wb") as f:
    f.write(content if isinstance(content, bytes) else content.encode())
  with pytest.raises(DataFormatError, match=match):
    load_tokenizer(tok_dir)


def test_a_valid_tokenizer_loads_and_no_files_means_none(tok_dir, word_tokenizer, tmp_path):
  tok = load_tokenizer(tok_dir)
  assert tok("w1 w2 w3")["input_ids"] == word_tokenizer("w1 w2 w3")["input_ids"]
  assert load_tokenizer(str(tmp_path)) is None


def test_corrupt_tokenizer_fails_load_pretrained_at_load_time(copy, word_tokenizer):
  word_tokenizer.save_pretrained(copy)
  with open(os.path.join(copy, "tokenizer.json"), "w") as f:
    f.write("{}")
  with pytest.raises(DataFormatError, match=r"tokenizer\.json: the tokenizer does not load"):
    load_pretrained(copy)


def test_gguf_with_a_broken_tokenizer_is_named(tiny, tmp_path):
  path = _write_gguf(tmp_path / "badtok.gguf", tiny, metadata={"tokenizer.ggml.model": ("no-such-model", _STR)})
  with pytest.raises(DataFormatError, match=r"badtok\.gguf: the tokenizer does not load"):
    load_pretrained(path)


# ------------------------------------------------------------------------------------------------ fuzzers


def _small_safetensors():
  arrays = {
    "a": np.arange(6, dtype=np.float32).reshape(2, 3),
    "b": np.array([1, -2, 3], np.int8),
    "c": np.zeros((0, 2), np.float16),
    "d": np.array([7], np.int64),
  }
  header = {"__metadata__": {"format": "pt"}}
  offset, data = 0, b""
  for k, v in arrays.items():
    header[k] = {
      "dtype": {"float32": "F32", "int8": "I8", "float16": "F16", "int64": "I64"}[str(v.dtype)],
      "shape": list(v.shape),
      "data_offsets": [offset, offset + v.nbytes],
    }
    offset += v.nbytes
    data += v.tobytes()
  blob = json.dumps(header).encode()
  return arrays, struct.pack("<Q", len(blob)) + blob + data


_ST_ARRAYS, _ST_BYTES = _small_safetensors()


def _reference_safetensors(path):
  """What the `safetensors` package (the Rust reference reader) reads, or None if it refuses the file."""
  from safetensors import safe_open

  try:
    with safe_open(path, framework="np") as f:
      return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
  except Exception:  # it refuses with several exception types; only "refused or not" matters here
    return None


def _check_safetensors(path, data):
  ref = _reference_safetensors(path)
  try:
    st_file = SafetensorsFile(path)
    ours = {k: np.array(st_file.get(k)) for k in st_file.keys()}
  except CheckpointError as e:
    event("refused: " + re.sub(r"\d+", "N", str(e)[len(path) + 2 :])[:40])
    assert path in str(e)
    # We refuse what the reference refuses; the one exception is a header key written twice (it keeps one).
    if ref is not None:
      assert "appears twice" in str(e), f"the reference reads this file, we refuse it: {e}"
    return
  event("accepted")
  assert ref is not None, "we accepted a file the reference refuses"
  tensors, meta = ref
  assert sorted(ours) == sorted(tensors) and (meta or {}) == st_file.metadata
  for k, v in tensors.items():
    assert ours[k].dtype == v.dtype and ours[k].shape == v.shape and ours[k].tobytes() == v.tobytes()


_ST_DIGITS = [
  i for i, c in enumerate(_ST_BYTES[: 8 + struct.unpack_from("<Q", _ST_BYTES)[0]]) if i >= 8 and chr(c).isdigit()
]


@FUZZ
@given(
  st.lists(st.tuples(st.integers(0, len(_ST_BYTES) - 1), st.integers(0, 255)), max_size=3),
  st.lists(st.tuples(st.sampled_from(_ST_DIGITS), st.sampled_from(b"0123456789-")), max_size=3),
  st.integers(0, len(_ST_BYTES)),
)
def test_fuzz_safetensors_byte_mutations(tmp_path_factory, edits, digit_edits, cut):
  """Random bytes anywhere, digits of the header's shapes and offsets changed (the JSON stays valid), truncation."""
  data = bytearray(_ST_BYTES)
  for at, value in edits + digit_edits:
    data[at] = value
  data = bytes(data[:cut]) if cut < len(data) and edits else bytes(data)
  path = str(tmp_path_factory.mktemp("st") / "f.safetensors")
  open(path, "wb").write(data)
  _check_safetensors(path, data)
  if data == _ST_BYTES:  # the unmutated file reads exactly what was written
    st_file = SafetensorsFile(path)
    for k, v in _ST_ARRAYS.items():
      np.testing.assert_array_equal(st_file.get(k), v)


_DTYPES = st.sampled_from(["F32", "F16", "I8", "U8", "I64", "BOOL", "I32", "F64", "X9", ""])
_INTS = st.one_of(st.integers(-4, 40), st.sampled_from([2**63, 2**64 + 1, -(2**63)]), st.just(1.0), st.just(True))
_ENTRY = st.fixed_dictionaries(
  {"dtype": _DTYPES, "shape": st.lists(_INTS, max_size=3), "data_offsets": st.lists(_INTS, min_size=1, max_size=3)}
)


_METADATA = st.one_of(
  st.none(),
  st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
  st.dictionaries(st.text(max_size=3), st.integers(), min_size=1, max_size=2),
  st.lists(st.text(max_size=2), max_size=2),
)


@FUZZ
@given(
  st.dictionaries(st.sampled_from(["a", "b", "c", "a" * 300]), _ENTRY, max_size=3),
  _METADATA,
  st.integers(0, 48),
  st.booleans(),
)
def test_fuzz_safetensors_headers(tmp_path_factory, header, metadata, data_size, contiguous):
  """Generated headers: dtypes known and not, shapes and offsets of every type and sign, with or without a data
  section that fits them."""
  if contiguous:  # make the offsets consistent with the shapes, so that valid headers come up often
    offset = 0
    for info in header.values():
      dt = {"F32": 4, "F16": 2, "I8": 1, "U8": 1, "I64": 8, "BOOL": 1, "I32": 4, "F64": 8}.get(info["dtype"], 1)
      n = math.prod(max(0, d) if isinstance(d, int) else 1 for d in info["shape"]) * dt
      info["data_offsets"] = [offset, offset + n]
      offset += n
    data_size = offset if data_size % 2 and offset < 1 << 16 else data_size
  if metadata is not None:
    header["__metadata__"] = metadata
  blob = json.dumps(header).encode()
  data = struct.pack("<Q", len(blob)) + blob + (bytes(range(256)) * (data_size // 256 + 1))[:data_size]
  path = str(tmp_path_factory.mktemp("sth") / "h.safetensors")
  open(path, "wb").write(data)
  _check_safetensors(path, data)


@pytest.fixture(scope="module")
def gguf_bytes(tiny_gguf):
  return open(tiny_gguf, "rb").read()


@FUZZ
@given(data=st.data())
def test_fuzz_gguf_mutations(tmp_path_factory, tiny, tiny_gguf, gguf_bytes, data):
  """Byte edits, truncations and random u64 counts anywhere in the header region of a valid tiny GGUF: only
  ReprobeErrors escape; an accepted file parses as gguf.GGUFReader parses it; the unmutated file loads exactly."""
  header_end = len(gguf_bytes) - sum(t.data.nbytes for t in gguf_file.open_gguf(tiny_gguf).tensors)
  raw = bytearray(gguf_bytes)
  kind = data.draw(st.sampled_from(["none", "byte", "u64", "cut"]))
  if kind == "byte":
    for _ in range(data.draw(st.integers(1, 3))):
      raw[data.draw(st.integers(0, header_end - 1))] = data.draw(st.integers(0, 255))
  elif kind == "u64":
    at = data.draw(st.integers(0, header_end - 8))
    raw[at : at + 8] = struct.pack("<Q", data.draw(st.sampled_from([0, 1, 255, 2**31, 2**40, 2**63, 2**64 - 1])))
  elif kind == "cut":
    raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
  path = str(tmp_path_factory.mktemp("gg") / "f.gguf")
  open(path, "wb").write(bytes(raw))
  try:
    g = gguf_file.open_gguf(path)
  except ReprobeError as e:
    event(f"{kind}: header refused")
    assert path in str(e)
    return
  from gguf import GGUFReader

  ref = GGUFReader(path)  # bounded now: every count was checked against the file size
  assert [k for k in ref.fields if not k.startswith("GGUF.")] == list(g.fields)
  for k, f in g.fields.items():
    if f.type == 9 and f.item_type == 8:
      assert [bytes(x) for x in f.value] == [bytes(ref.fields[k].parts[i]) for i in ref.fields[k].data]
    elif f.type == 9:
      assert np.array_equal(f.value, np.asarray(ref.fields[k].contents()), equal_nan=True)
    elif f.type not in (6, 12) or not math.isnan(f.value):
      assert f.value == ref.fields[k].contents(), k
  assert [(t.name, t.tensor_type, t.shape) for t in g.tensors] == [
    (t.name, t.tensor_type, tuple(t.shape.tolist())) for t in ref.tensors
  ]
  for ours, theirs in zip(g.tensors, ref.tensors):
    assert ours.data.tobytes() == theirs.data.view(np.uint8).tobytes()
  try:
    cfg, stream = gguf_io.read_gguf(g)
    arrays = {name: get() for name, get, _ in stream}
  except ReprobeError as e:
    event(f"{kind}: model refused")
    assert path in str(e)
    return
  event(f"{kind}: accepted")
  if bytes(raw) == gguf_bytes:
    assert cfg.num_layers == _CFG.num_layers and len(arrays) == len(export_tensors(_CFG, tiny.params))
    assert _same_params(load_pretrained(path, tokenizer=False), tiny)
