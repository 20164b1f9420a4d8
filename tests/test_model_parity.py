"""The Flax decoder held to PyTorch `transformers` for every supported family and rope type.

Each case builds a tiny random HF model, saves it, loads it with `load_pretrained`, and compares: logits and every
hidden state (fp32, max abs diff relative to the tensor's scale), the attention window against eager
`output_attentions`, KV-cache decoding against the full forward, and 32 greedy tokens against HF `generate` with a
left-padded batch.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import transformers

from reprobe_jax.models import CaptureSpec, SamplingParams, load_pretrained

TOL = 1e-4
W = 5
VOCAB = 101


def _common(**kw):
  base = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.25,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
  )
  base.update(kw)
  return base


CASES = {
  "llama": (transformers.LlamaConfig, _common()),
  "llama_tied_llama3": (
    transformers.LlamaConfig,
    _common(
      tie_word_embeddings=True,
      num_key_value_heads=1,
      rope_parameters=dict(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=64,
      ),
    ),
  ),
  "llama_linear": (
    transformers.LlamaConfig,
    _common(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
  ),
  "llama_dynamic": (
    transformers.LlamaConfig,
    _common(rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)),
  ),
  "mistral_sliding": (transformers.MistralConfig, _common(sliding_window=6, head_dim=16)),
  "qwen2_bias_yarn": (
    transformers.Qwen2Config,
    _common(
      rope_parameters=dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0, original_max_position_embeddings=128)
    ),
  ),
  "qwen3_qknorm": (transformers.Qwen3Config, _common(head_dim=24, tie_word_embeddings=True)),
  "phi3_partial_longrope": (
    transformers.Phi3Config,
    _common(
      num_key_value_heads=4,
      max_position_embeddings=4096,
      original_max_position_embeddings=256,
      rope_parameters=dict(
        rope_type="longrope",
        rope_theta=10000.0,
        partial_rotary_factor=0.5,
        short_factor=[1.0 + 0.1 * i for i in range(4)],
        long_factor=[2.0 + 0.3 * i for i in range(4)],
        original_max_position_embeddings=256,
      ),
    ),
  ),
  # original context 8 < sequence length: the long factors are in force, as HF picks them per call.
  "phi3_longrope_long": (
    transformers.Phi3Config,
    _common(
      max_position_embeddings=4096,
      original_max_position_embeddings=8,
      rope_parameters=dict(
        rope_type="longrope",
        rope_theta=10000.0,
        short_factor=[1.0 + 0.1 * i for i in range(8)],
        long_factor=[2.0 + 0.3 * i for i in range(8)],
        original_max_position_embeddings=8,
      ),
    ),
  ),
  # Gemma 3: layers 0 and 1 local (window 4, RoPE base 100), layer 2 global (base 1e5), on sequences of 14-20
  # tokens; query_pre_attn_scalar 20 is not head_dim 24 (which is not hidden / heads either).
  "gemma3_local_global": (
    transformers.Gemma3TextConfig,
    _common(
      head_dim=24,
      sliding_window=4,
      sliding_window_pattern=3,
      query_pre_attn_scalar=20,
      rope_parameters={
        "full_attention": dict(rope_type="default", rope_theta=1e5),
        "sliding_attention": dict(rope_type="default", rope_theta=100.0),
      },
    ),
  ),
  # A global layer between two local ones, linear RoPE scaling on the global layer only, an untied head, one KV
  # head, the default query_pre_attn_scalar (256, not head_dim 16) and a final logit softcap that bends the
  # logits (their scale is about 14).
  "gemma3_linear_untied_softcap": (
    transformers.Gemma3TextConfig,
    _common(
      head_dim=16,
      num_key_value_heads=1,
      tie_word_embeddings=False,
      sliding_window=4,
      final_logit_softcapping=10.0,
      layer_types=["sliding_attention", "full_attention", "sliding_attention"],
      rope_parameters={
        "full_attention": dict(rope_type="linear", rope_theta=1e4, factor=4.0),
        "sliding_attention": dict(rope_type="default", rope_theta=10.0),
      },
    ),
  ),
}
_MODELS = {transformers.Gemma3TextConfig: transformers.Gemma3ForCausalLM}


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
  cls, kw = CASES[request.param]
  torch.manual_seed(0)
  cfg = cls(**kw)
  cfg._attn_implementation = "eager"
  model_cls = _MODELS[cls] if cls in _MODELS else getattr(transformers, cls.__name__.replace("Config", "ForCausalLM"))
  hf = model_cls(cfg).eval()
  if request.param.startswith("qwen2"):  # random init leaves biases at zero; make them matter
    with torch.no_grad():
      for layer in hf.model.layers:
        for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
          p.bias.normal_(0, 0.5)
  if request.param.startswith("gemma3"):  # and Gemma's zero-centred norm weights (1 + w) at zero
    with torch.no_grad():
      for n, p in hf.named_parameters():
        if "norm" in n:
          p.normal_(0, 0.5)
  directory = tmp_path_factory.mktemp(request.param)
  hf.save_pretrained(directory)
  return request.param, hf, load_pretrained(str(directory))


def _rel(a, b, where=None):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if where is not None:
    a, b = a[where], b[where]
  return np.abs(a - b).max() / max(np.abs(b).max(), 1e-12)


def _left_padded(rng, lengths, t):
  ids = np.zeros((len(lengths), t), np.int64)
  mask = np.zeros_like(ids)
  for i, n in enumerate(lengths):
    ids[i, t - n :] = rng.randint(3, VOCAB, n)
    mask[i, t - n :] = 1
  return ids, mask


def test_forward_logits_hidden_attention(pair):
  name, hf, lm = pair
  ids, mask = _left_padded(np.random.RandomState(1), [14, 9], 14)
  pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
  with torch.no_grad():
    ref = hf(
      torch.tensor(ids),
      attention_mask=torch.tensor(mask),
      position_ids=torch.tensor(pos),
      output_hidden_states=True,
      output_attentions=True,
    )
  n_layers = lm.config.num_layers
  out = lm.forward(
    ids,
    mask,
    capture=CaptureSpec(hidden_layers=tuple(range(n_layers + 1)), attn_window=W, top_k_probs=4, token_stats=True),
  )
  valid = mask.astype(bool)
  assert _rel(out.logits, ref.logits.numpy(), valid) < TOL, name
  assert len(ref.hidden_states) == n_layers + 1
  for i in range(n_layers + 1):
    assert _rel(out.hidden_states[i], ref.hidden_states[i].numpy(), valid) < TOL, (name, i)
  # Attention window: query t reads keys t, t-1, ..., t-W+1 of HF's eager map; zero before the start.
  aw = np.asarray(out.attn_window)  # [B, T, L, H, W]
  assert aw.shape == (2, 14, n_layers, lm.config.num_heads, W)
  expect = np.zeros_like(aw)
  for layer in range(n_layers):
    a = ref.attentions[layer].numpy()  # [B, H, T, S]
    for t in range(14):
      for w in range(W):
        if t - w >= 0:
          expect[:, t, layer, :, w] = a[:, :, t, t - w]
  np.testing.assert_allclose(aw[valid], expect[valid], atol=TOL)
  for t in range(W - 1):  # keys before slot 0 are zero
    assert np.all(aw[:, t, :, :, t + 1 :] == 0)
  # Logit statistics against torch.
  probs = torch.softmax(ref.logits.double(), -1)
  np.testing.assert_allclose(np.asarray(out.top_probs)[valid], probs.topk(4, -1).values.numpy()[valid], atol=1e-5)
  ent = -(probs * probs.clamp_min(1e-300).log()).sum(-1).numpy()
  np.testing.assert_allclose(np.asarray(out.token_entropy)[valid], ent[valid], atol=1e-4)
  self_certainty = (-np.log(VOCAB) - torch.log_softmax(ref.logits.double(), -1).mean(-1)).numpy()
  np.testing.assert_allclose(np.asarray(out.token_self_certainty)[valid], self_certainty[valid], atol=1e-4)
  logp_next = torch.log(probs[:, :-1].gather(-1, torch.tensor(ids[:, 1:, None]))).squeeze(-1).numpy()
  next_valid = valid[:, 1:] & valid[:, :-1]
  np.testing.assert_allclose(np.asarray(out.token_logprobs)[:, :-1][next_valid], logp_next[next_valid], atol=1e-4)
  assert np.all(np.asarray(out.token_logprobs)[:, -1] == 0)


def test_kv_cache_decoding_equals_full_forward(pair):
  name, _, lm = pair
  ids, mask = _left_padded(np.random.RandomState(2), [20, 13], 20)
  full = np.asarray(lm.forward(ids, mask).logits)
  cache = lm.new_cache(2, 32)
  prefix = 12
  logits, _, cache = lm.extend(cache, ids[:, :prefix], mask[:, :prefix])
  steps = [np.asarray(logits)]
  for t in range(prefix, 20):
    logits, _, cache = lm.extend(cache, ids[:, t : t + 1], mask[:, t : t + 1])
    steps.append(np.asarray(logits))
  incremental = np.concatenate(steps, axis=1)
  valid = mask.astype(bool)
  assert _rel(incremental, full, valid) < TOL, name


def test_greedy_generate_matches_hf(pair):
  name, hf, lm = pair
  rng = np.random.RandomState(3)
  prompts = [rng.randint(3, VOCAB, n).tolist() for n in (11, 6, 8)]
  t = max(map(len, prompts))
  ids, mask = np.zeros((3, t), np.int64), np.zeros((3, t), np.int64)
  for i, p in enumerate(prompts):
    ids[i, t - len(p) :], mask[i, t - len(p) :] = p, 1
  with torch.no_grad():
    ref = hf.generate(
      torch.tensor(ids), attention_mask=torch.tensor(mask), max_new_tokens=32, do_sample=False, pad_token_id=0
    ).numpy()[:, t:]
  gen = lm.generate(prompts, SamplingParams(temperature=0.0), max_new_tokens=32)
  for row in range(3):
    n = gen.lengths[row]
    assert gen.tokens[row, :n].tolist() == ref[row, :n].tolist(), (name, row)
    if gen.finish_reason[row] == "eos":  # HF pads a finished row
      assert ref[row, n - 1] == 2 and np.all(ref[row, n:] == 0), (name, row)
    else:
      assert n == 32, (name, row)


def test_save_pretrained_loads_in_transformers_with_same_logits(pair, tmp_path):
  """Export runs the checkpoint table backwards (fused Phi-3 tensors, tied heads, biases, q/k norms)."""
  name, hf, lm = pair
  lm.save_pretrained(str(tmp_path / "export"))
  back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", dtype=torch.float32).eval()
  ids = np.random.RandomState(4).randint(3, VOCAB, (2, 10))
  with torch.no_grad():
    theirs = back(torch.tensor(ids)).logits.numpy()
    original = hf(torch.tensor(ids)).logits.numpy()
  assert _rel(theirs, original) < 1e-5  # same weights; only HF's attention kernel (sdpa vs eager) differs
  assert _rel(lm.forward(ids).logits, theirs) < TOL
  assert _rel(load_pretrained(str(tmp_path / "export")).forward(ids).logits, theirs) < TOL


def test_sharded_checkpoint_and_bfloat16(tmp_path):
  """Several safetensors files with an index load like one; bfloat16 stays close to float32."""
  torch.manual_seed(1)
  cfg = transformers.Qwen3Config(**_common(head_dim=16))
  hf = transformers.Qwen3ForCausalLM(cfg).eval()
  hf.save_pretrained(tmp_path, max_shard_size="40KB")
  assert len(list(tmp_path.glob("*.safetensors"))) > 2 and (tmp_path / "model.safetensors.index.json").exists()
  ids = np.random.RandomState(5).randint(3, VOCAB, (2, 9))
  with torch.no_grad():
    ref = hf(torch.tensor(ids)).logits.numpy()
  assert _rel(load_pretrained(str(tmp_path)).forward(ids).logits, ref) < TOL
  bf16 = load_pretrained(str(tmp_path), dtype="bfloat16")
  leaves = jax.tree.leaves(bf16.params)
  assert all(str(x.dtype) == "bfloat16" for x in leaves)
  assert _rel(bf16.forward(ids).logits, ref) < 5e-2
