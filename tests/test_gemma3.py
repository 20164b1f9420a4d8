"""Gemma 3 beyond the family parity suite (tests/test_model_parity.py holds two tiny Gemma 3 configs to transformers:
logits, hidden states, attention window, KV-cache decoding, greedy generate, export). Here: worked examples of its
formulas, its config.json forms against transformers' Gemma3TextConfig (defaults, older keys, the multimodal
`gemma3` wrapper and its checkpoint), that the parity setup fails without the window, the local RoPE or the query
scale, and a tiny Gemma 3 GGUF written here against the model it came from and transformers reading the file.
"""

from __future__ import annotations

import copy
import math

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers

from flax import nnx

from reprobe_jax.errors import ConfigError, UnsupportedModelError
from reprobe_jax.models import CaptureSpec, LanguageModel, ModelConfig, load_pretrained
from reprobe_jax.models.checkpoint import abstract_model
from reprobe_jax.models.layers import GemmaRMSNorm
from reprobe_jax.models.rope_config import RopeConfig

TOL = 1e-4
VOCAB = 101


def _rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.abs(a - b).max() / max(np.abs(b).max(), 1e-12)


def _text_kw(**kw):
  base = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
    max_position_embeddings=512,
    initializer_range=0.25,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    sliding_window=4,
    sliding_window_pattern=3,
    query_pre_attn_scalar=20,
    rope_theta=1e5,
    rope_local_base_freq=100.0,
  )
  base.update(kw)
  return base


def _randomise_norms(model):
  """Random init leaves Gemma's zero-centred norm weights at 0 (a multiplier of 1); make them matter."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.normal_(0, 0.5)


def _with_config(lm: LanguageModel, cfg: ModelConfig) -> LanguageModel:
  """The same weights under another (static) config, e.g. without the sliding window."""
  graphdef, _ = abstract_model(cfg, jnp.float32)
  return LanguageModel(cfg, graphdef, lm.params)


# ------------------------------------------------------------------------------------------------ worked examples


def test_gemma_rmsnorm_worked_example():
  # x = [3, 4]: mean of squares 12.5, rsqrt 0.2828427; x_hat = [0.8485281, 1.1313708]; weights w = [0, 1] scale
  # by 1 + w = [1, 2]: [0.8485281, 2.2627417].
  norm = GemmaRMSNorm(2, 0.0, dtype=jnp.float32, rngs=nnx.Rngs(0))
  norm.scale[...] = jnp.array([0.0, 1.0])
  np.testing.assert_allclose(np.asarray(norm(jnp.array([[3.0, 4.0]]))), [[0.8485281, 2.2627417]], rtol=1e-6)


# ------------------------------------------------------------------------------------------------ config.json


def _windows_of(hf_cfg) -> tuple:
  return tuple(hf_cfg.sliding_window if t == "sliding_attention" else None for t in hf_cfg.layer_types)


def test_defaults_are_transformers_defaults():
  ours = ModelConfig.from_hf_dict({"model_type": "gemma3_text"})
  hf = transformers.Gemma3TextConfig()
  assert (
    ours.vocab_size,
    ours.hidden_size,
    ours.intermediate_size,
    ours.num_layers,
    ours.num_heads,
    ours.num_kv_heads,
    ours.head_dim,
    ours.max_position_embeddings,
    ours.rms_norm_eps,
    ours.hidden_act,
    ours.tie_word_embeddings,
    ours.query_pre_attn_scalar,
    ours.bos_token_id,
    ours.eos_token_ids,
    ours.pad_token_id,
  ) == (
    hf.vocab_size,
    hf.hidden_size,
    hf.intermediate_size,
    hf.num_hidden_layers,
    hf.num_attention_heads,
    hf.num_key_value_heads,
    hf.head_dim,
    hf.max_position_embeddings,
    hf.rms_norm_eps,
    hf.hidden_activation,
    hf.tie_word_embeddings,
    hf.query_pre_attn_scalar,
    hf.bos_token_id,
    (hf.eos_token_id,),
    hf.pad_token_id,
  )
  assert ours.sliding_windows == _windows_of(hf)  # every 6th layer global
  assert ours.sliding_windows[:6] == (4096,) * 5 + (None,)
  assert ours.rope == RopeConfig(theta=hf.rope_parameters["full_attention"]["rope_theta"]) == RopeConfig(theta=1e6)
  assert ours.local_rope == RopeConfig(theta=hf.rope_parameters["sliding_attention"]["rope_theta"])
  assert ours.local_rope.theta == 1e4 and ours.final_logit_softcapping is None


def test_older_keys_read_as_transformers_reads_them():
  # sliding_window_pattern 3 over 7 layers: layers 2 and 5 (i + 1 divisible by 3) are global. rope_scaling applies
  # to the global layers, rope_local_base_freq is the local layers' base.
  kw = dict(
    num_hidden_layers=7,
    sliding_window=8,
    sliding_window_pattern=3,
    rope_theta=5e5,
    rope_local_base_freq=20.0,
    rope_scaling={"rope_type": "linear", "factor": 8.0},
    head_dim=16,
  )
  ours = ModelConfig.from_hf_dict({"model_type": "gemma3_text", **kw})
  hf = transformers.Gemma3TextConfig(**kw)
  assert ours.sliding_windows == (8, 8, None, 8, 8, None, 8) == _windows_of(hf)
  assert ours.rope == RopeConfig(rope_type="linear", theta=5e5, factor=8.0)
  assert hf.rope_parameters["full_attention"] == {"rope_type": "linear", "rope_theta": 5e5, "factor": 8.0}
  assert ours.local_rope == RopeConfig(theta=20.0) and hf.rope_parameters["sliding_attention"]["rope_theta"] == 20.0
  assert [ours.layer_rope(i).theta for i in range(7)] == [20.0, 20.0, 5e5, 20.0, 20.0, 5e5, 20.0]


def test_config_round_trips_and_transformers_reads_our_export():
  cfg = ModelConfig.from_hf_dict({"model_type": "gemma3_text", **_text_kw(final_logit_softcapping=30.0)})
  assert cfg.query_pre_attn_scalar == 20.0 and cfg.sliding_windows == (4, 4, None)
  d = cfg.to_hf_dict()
  assert ModelConfig.from_hf_dict(d) == cfg
  hf = transformers.AutoConfig.for_model(**d)
  assert type(hf) is transformers.Gemma3TextConfig
  assert _windows_of(hf) == cfg.sliding_windows and hf.query_pre_attn_scalar == 20
  assert hf.rope_parameters["sliding_attention"]["rope_theta"] == 100.0 and hf.final_logit_softcapping == 30.0
  # A config built in code spells out what its defaults mean, so it also equals its config.json read back.
  built = ModelConfig(
    family="gemma3",
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    sliding_windows=(4, None),
    qk_norm=True,
    hidden_act="gelu_pytorch_tanh",
  )
  assert built.local_rope == built.rope and built.query_pre_attn_scalar == 16.0
  assert ModelConfig.from_hf_dict(built.to_hf_dict()) == built


@pytest.mark.parametrize(
  "change, error, match",
  [
    (
      {"attn_logit_softcapping": 50.0},
      UnsupportedModelError,
      r"attn_logit_softcapping=50\.0: transformers' Gemma 3 "
      r"reads this field but never applies it",
    ),
    ({"use_bidirectional_attention": True}, UnsupportedModelError, r"use_bidirectional_attention=true"),
    ({"attention_bias": True}, UnsupportedModelError, r"attention_bias=true is not supported for Gemma 3"),
    (
      {"layer_types": ["sliding_attention", "full_attention"]},
      ConfigError,
      r"layer_types must list .* for each of the 3 layers, got 2 entries",
    ),
    ({"layer_types": ["sliding_attention", "local", "full_attention"]}, ConfigError, r"with \['local'\]"),
    ({"sliding_window": None}, ConfigError, r"'sliding_attention' layers but sliding_window is null"),
    (
      {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
      ConfigError,
      r"'rope_parameters' of a Gemma 3 config must map 'full_attention' / 'sliding_attention'",
    ),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear"}}}, ConfigError, r"rope type 'linear' needs factor"),
    (
      {"rope_parameters": {"sliding_attention": {"rope_theta": "big"}}},
      ConfigError,
      r"'rope_parameters\.sliding_attention\.rope_theta' must be a finite number",
    ),
    ({"partial_rotary_factor": 0.5}, ConfigError, r"family 'gemma3' rotates the whole head"),
    ({"hidden_activation": "relu"}, UnsupportedModelError, r"hidden_act 'relu' is not supported"),
    ({"query_pre_attn_scalar": 0}, ConfigError, r"query_pre_attn_scalar must be a finite number > 0, got 0\.0"),
  ],
)
def test_bad_or_unsupported_fields_are_named(change, error, match):
  d = {"model_type": "gemma3_text", **_text_kw(), **change}
  with pytest.raises(error, match=match) as e:
    ModelConfig.from_hf_dict(d, source="/m/config.json")
  assert str(e.value).startswith("/m/config.json: ")


def test_gemma3_options_are_refused_for_other_families_and_its_shape_is_fixed():
  shape = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2, num_kv_heads=2, head_dim=4)
  with pytest.raises(ConfigError, match="final_logit_softcapping is a Gemma 3 option; family 'llama'"):
    ModelConfig(family="llama", final_logit_softcapping=30.0, **shape)
  with pytest.raises(ConfigError, match=r"family 'gemma3' has q/k norms .* got qk_norm=False"):
    ModelConfig(family="gemma3", **shape)
  with pytest.raises(ConfigError, match=r"family 'gemma3' has q/k norms .* attention_bias=True"):
    ModelConfig(family="gemma3", qk_norm=True, attention_bias=True, **shape)


def test_multimodal_config_errors_name_the_text_config():
  with pytest.raises(UnsupportedModelError, match=r"text_config\.model_type 'llama' is not supported"):
    ModelConfig.from_hf_dict({"model_type": "gemma3", "text_config": {"model_type": "llama"}})
  with pytest.raises(ConfigError, match=r"field 'text_config\.hidden_size' must be an integer >= 1"):
    ModelConfig.from_hf_dict({"model_type": "gemma3", "text_config": {"hidden_size": "64"}})
  # The LM head is tied by the outer config, as transformers ties Gemma3ForConditionalGeneration.
  cfg = ModelConfig.from_hf_dict(
    {"model_type": "gemma3", "tie_word_embeddings": False, "text_config": {"model_type": "gemma3_text", **_text_kw()}}
  )
  assert not cfg.tie_word_embeddings and cfg.family == "gemma3" and cfg.sliding_windows == (4, 4, None)


# ------------------------------------------------------------------------------------------------ checkpoints


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """A random Gemma3ForCausalLM (layers 0, 1 local with window 4 and RoPE base 100, layer 2 global; hidden size 40,
  whose square root is not exact), saved by transformers and loaded by us. Returns (hf, ours, folder)."""
  torch.manual_seed(0)
  cfg = transformers.Gemma3TextConfig(**_text_kw(hidden_size=40))
  cfg._attn_implementation = "eager"
  hf = transformers.Gemma3ForCausalLM(cfg).eval()
  _randomise_norms(hf)
  directory = tmp_path_factory.mktemp("gemma3_text")
  hf.save_pretrained(directory)
  return hf, load_pretrained(str(directory)), str(directory)


def test_embedding_scale_rounds_to_the_model_dtype_as_transformers_does(tiny):
  # sqrt(40) = 6.3245553; in bfloat16 (8 significant bits) 6.3245553 = 1.5811388 x 4 and 1.5811388 x 128 = 202.39,
  # so it rounds to 202 / 128 x 4 = 6.3125, and HF multiplies the bfloat16 embedding by that bfloat16 number.
  hf, _, directory = tiny
  assert float(ml_dtypes.bfloat16(math.sqrt(40))) == 6.3125
  ids = np.random.RandomState(0).randint(3, VOCAB, (2, 16))
  lm = load_pretrained(directory, dtype="bfloat16")
  got = np.asarray(lm.forward(ids, capture=CaptureSpec(hidden_layers=(0,))).hidden_states[0])
  emb = np.asarray(lm.params["embed_tokens"].get_value())[ids]  # bfloat16
  np.testing.assert_array_equal(got, emb * ml_dtypes.bfloat16(6.3125))
  assert np.any(got != (emb.astype(np.float32) * math.sqrt(40)).astype(ml_dtypes.bfloat16))  # the rounding shows
  with torch.no_grad():
    ref = copy.deepcopy(hf).to(torch.bfloat16)(torch.tensor(ids), output_hidden_states=True).hidden_states[0]
  np.testing.assert_array_equal(got.astype(np.float32), ref.float().numpy())


def test_final_softcap_worked_example(tiny):
  # logits = cap tanh(raw / cap); with cap 5 a raw logit of 5 gives 5 tanh(1) = 3.8079708, and |logits| < 5.
  _, lm, _ = tiny
  ids = np.random.RandomState(1).randint(3, VOCAB, (2, 16))
  raw = np.asarray(lm.forward(ids).logits)
  capped = np.asarray(_with_config(lm, lm.config.replace(final_logit_softcapping=5.0)).forward(ids).logits)
  assert np.abs(raw).max() > 7.5  # the cap bends these logits
  np.testing.assert_allclose(capped, 5.0 * np.tanh(raw / 5.0), rtol=1e-5, atol=1e-5)
  assert np.abs(capped).max() < 5.0 and np.isclose(5.0 * np.tanh(1.0), 3.8079708)


def test_parity_needs_the_window_the_local_rope_and_the_query_scale(tiny):
  """Each Gemma 3 specific, turned off in our config over the same weights, moves the logits far outside the
  parity tolerance on these 16-token sequences: the parity suite would catch its loss."""
  hf, lm, _ = tiny
  ids = np.random.RandomState(0).randint(3, VOCAB, (2, 16))
  with torch.no_grad():
    ref = hf(torch.tensor(ids)).logits.numpy()
  assert _rel(lm.forward(ids).logits, ref) < TOL
  cfg = lm.config
  for name, changed in [
    ("no window", cfg.replace(sliding_windows=(None,) * 3)),
    ("global RoPE everywhere", cfg.replace(local_rope=cfg.rope)),
    ("head_dim query scale", cfg.replace(query_pre_attn_scalar=float(cfg.head_dim))),
  ]:
    assert _rel(_with_config(lm, changed).forward(ids).logits, ref) > 100 * TOL, name


def test_multimodal_checkpoint_loads_its_language_model(tmp_path):
  """A Gemma3ForConditionalGeneration folder (tiny vision tower and projector, skipped) loads as its language model:
  text-only logits equal transformers' multimodal model's."""
  torch.manual_seed(1)
  vision = dict(
    model_type="siglip_vision_model",
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    image_size=28,
    patch_size=14,
  )
  cfg = transformers.Gemma3Config(
    text_config=_text_kw(),
    vision_config=vision,
    mm_tokens_per_image=4,
    image_token_index=100,
    boi_token_index=98,
    eoi_token_index=99,
  )
  hf = transformers.Gemma3ForConditionalGeneration(cfg).eval()
  _randomise_norms(hf)
  hf.save_pretrained(tmp_path)
  lm = load_pretrained(str(tmp_path))
  assert lm.config.family == "gemma3" and lm.config.sliding_windows == (4, 4, None)
  ids = np.random.RandomState(2).randint(3, 98, (2, 12))
  with torch.no_grad():
    ref = hf(input_ids=torch.tensor(ids)).logits.numpy()
  assert _rel(lm.forward(ids).logits, ref) < TOL


# ------------------------------------------------------------------------------------------------ GGUF


def _write_gemma3_gguf(path, hf, *, with_tensors: bool = True, **meta):
  """A GGUF file as llama.cpp's converter writes a Gemma 3 checkpoint: F32 tensors under llama.cpp names, RMSNorm
  weights stored as 1 + w, the hyperparameters llama.cpp reads."""
  import gguf

  c = hf.config if hf is not None else None
  meta = dict(
    dict(
      context_length=c.max_position_embeddings,
      embedding_length=c.hidden_size,
      block_count=c.num_hidden_layers,
      feed_forward_length=c.intermediate_size,
      head_count=c.num_attention_heads,
      head_count_kv=c.num_key_value_heads,
      key_length=c.head_dim,
      rms_eps=c.rms_norm_eps,
      freq_base=c.rope_parameters["full_attention"]["rope_theta"],
      sliding_window=c.sliding_window,
      vocab_size=c.vocab_size,
    )
    if c is not None
    else {},
    **meta,
  )
  writer = gguf.GGUFWriter(str(path), "gemma3")
  writer.add_context_length(meta["context_length"])
  writer.add_embedding_length(meta["embedding_length"])
  writer.add_block_count(meta["block_count"])
  writer.add_feed_forward_length(meta["feed_forward_length"])
  writer.add_head_count(meta["head_count"])
  writer.add_head_count_kv(meta["head_count_kv"])
  writer.add_key_length(meta["key_length"])
  writer.add_value_length(meta["key_length"])
  writer.add_layer_norm_rms_eps(meta["rms_eps"])
  writer.add_rope_freq_base(meta["freq_base"])
  writer.add_sliding_window(meta["sliding_window"])
  writer.add_vocab_size(meta["vocab_size"])
  if with_tensors:
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, meta["block_count"])
    for name, p in hf.state_dict().items():
      if name == "lm_head.weight":  # tied: llama.cpp writes no output.weight
        continue
      base, suffix = name.rsplit(".", 1)
      x = p.detach().numpy().astype(np.float32)
      writer.add_tensor(names.get_name(base) + "." + suffix, x + 1.0 if name.endswith("norm.weight") else x)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()


def test_tiny_gguf_matches_its_source_and_transformers(tmp_path):
  """Six layers, so that llama.cpp's fixed pattern (every 6th layer global) has five local layers and one global;
  head_dim 256, where llama.cpp's query scale (head_dim) and transformers' (256) agree."""
  torch.manual_seed(2)
  cfg = transformers.Gemma3TextConfig(
    **_text_kw(
      num_hidden_layers=6,
      num_attention_heads=2,
      num_key_value_heads=1,
      head_dim=256,
      query_pre_attn_scalar=256,
      rope_theta=1e6,
      rope_local_base_freq=1e4,
      sliding_window_pattern=6,
    )
  )
  hf = transformers.Gemma3ForCausalLM(cfg).eval()
  _randomise_norms(hf)
  path = tmp_path / "tiny-gemma3.gguf"
  _write_gemma3_gguf(path, hf)
  lm = load_pretrained(str(path))
  assert lm.config.sliding_windows == (4,) * 5 + (None,) and lm.config.local_rope.theta == 1e4
  assert lm.tokenizer is None  # the file carries no tokenizer
  ids = np.random.RandomState(3).randint(3, VOCAB, (2, 14))
  with torch.no_grad():
    source = hf(torch.tensor(ids)).logits.numpy()
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    theirs = back.eval()(torch.tensor(ids)).logits.numpy()
  ours = np.asarray(lm.forward(ids).logits)
  assert _rel(ours, source) < TOL
  assert _rel(ours, theirs) < TOL


@pytest.mark.parametrize(
  "layers, hidden, heads, head_dim, scalar",
  [
    (26, 1152, 4, 256, 256),  # Gemma 3 1B: head_dim 256
    (18, 640, 4, 32, 32),  # another head_dim: llama.cpp scales by head_dim ** -0.5 (transformers' loader: 256)
    (62, 5376, 32, 128, 168),  # Gemma 3 27B: llama.cpp uses hidden / heads = 5376 / 32 = 168
  ],
)
def test_gguf_query_scale_follows_llama_cpp(tmp_path, layers, hidden, heads, head_dim, scalar):
  from reprobe_jax.models import gguf_io

  path = tmp_path / "meta-only.gguf"
  _write_gemma3_gguf(
    path,
    None,
    with_tensors=False,
    context_length=1024,
    embedding_length=hidden,
    block_count=layers,
    feed_forward_length=64,
    head_count=heads,
    head_count_kv=1,
    key_length=head_dim,
    rms_eps=1e-6,
    freq_base=1e6,
    sliding_window=512,
    vocab_size=16,
  )
  cfg, _ = gguf_io.read_gguf(path)
  assert cfg.query_pre_attn_scalar == scalar
  assert cfg.sliding_windows[:6] == (512,) * 5 + (None,) and cfg.local_rope.theta == 1e4 and cfg.rope.theta == 1e6
