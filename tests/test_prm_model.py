"""The PRM (docs/method.md §A7) held to a PyTorch reference: transformers' Qwen2Model plus the same head, a random tiny
config saved with the upstream tensor names (`model.*`, `score.0.*`, `score.2.*`); incremental scoring equals
scoring the whole text; bad checkpoints and separators give one clear error each."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from reprobe_jax.errors import CheckpointError, ConfigError
from reprobe_jax.models import CaptureSpec, LanguageModel, ModelConfig
from reprobe_jax.models.safetensors_io import write_safetensors
from reprobe_jax.prm.model import append_step, from_target, load_prm, prefill, rewards, save_prm

SEP = "<extra_0>"
WORDS = ["<pad>", "<s>", "</s>", SEP] + [f"w{i}" for i in range(93)]


def _tokenizer(words=WORDS):
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


class _RefPRM(torch.nn.Module):
  """Qwen2ForProcessRewardModel's shape: `model` (Qwen2Model) and `score` = Linear(H, H), ReLU, Linear(H, 2)."""

  def __init__(self, cfg):
    super().__init__()
    self.model = transformers.Qwen2Model(cfg)
    h = cfg.hidden_size
    self.score = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, 2))

  def step_rewards(self, ids: list[int], sep_id: int) -> np.ndarray:
    """P(correct) at every separator of one unpadded sequence (the upstream recipe: softmax(score)[..., 1])."""
    x = torch.tensor([ids])
    h = self.model(input_ids=x).last_hidden_state
    p = torch.softmax(self.score(h), dim=-1)[0, :, 1]
    return p[x[0] == sep_id].detach().numpy()


def _save(ref: _RefPRM, cfg, directory, *, drop=(), tokenizer=True):
  os.makedirs(directory, exist_ok=True)
  tensors = {k: v.detach().numpy() for k, v in ref.state_dict().items() if k not in drop}
  write_safetensors(os.path.join(directory, "model.safetensors"), tensors, {"format": "pt"})
  d = cfg.to_dict()
  d["architectures"] = ["Qwen2ForProcessRewardModel"]
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(d, f)
  if tokenizer:
    _tokenizer().save_pretrained(directory)
  return str(directory)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
  torch.manual_seed(0)
  cfg = transformers.Qwen2Config(
    vocab_size=len(WORDS),
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    initializer_range=0.25,
    tie_word_embeddings=False,
  )
  cfg._attn_implementation = "eager"
  model = _RefPRM(cfg).eval()
  with torch.no_grad():  # random init leaves biases at zero; make them matter
    for layer in model.model.layers:
      for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
        p.bias.normal_(0, 0.5)
    for lin in (model.score[0], model.score[2]):
      lin.bias.normal_(0, 0.5)
  root = tmp_path_factory.mktemp("prm")
  return model, cfg, _save(model, cfg, root / "prm"), root


def _batch(seed=0, b=3, tp=7, t=24):
  """Left-padded prompts [B, Tp], response tokens [B, T] and ordered step spans [B, 4, 2] with gaps, an empty
  step and a padded (0, 0) slot."""
  rng = np.random.default_rng(seed)
  plen = [7, 4, 1][:b]
  prompt = np.zeros((b, tp), np.int32)
  pmask = np.zeros((b, tp), bool)
  for i, n in enumerate(plen):
    prompt[i, tp - n :] = rng.integers(4, len(WORDS), n)
    pmask[i, tp - n :] = True
  tokens = rng.integers(4, len(WORDS), (b, t)).astype(np.int32)
  spans = np.array(
    [[[0, 5], [5, 9], [11, 20], [20, 24]], [[0, 3], [3, 3], [3, 10], [0, 0]], [[0, 1], [1, 2], [2, 17], [0, 0]]],
    np.int32,
  )[:b]
  return prompt, pmask, tokens, spans


def _reference(ref_model, prompt, pmask, tokens, spans, sep_id):
  out = np.full(spans.shape[:2], np.nan)
  for i in range(len(prompt)):
    ids = prompt[i][pmask[i]].tolist()
    where = []
    for k, (a, e) in enumerate(spans[i]):
      if e > a:
        ids += tokens[i, a:e].tolist() + [sep_id]
        where.append(k)
    out[i, where] = ref_model.step_rewards(ids, sep_id)
  return out


def test_step_rewards_match_torch(ref):
  model, _, path, _ = ref
  prm = load_prm(path)
  assert prm.separator_id == WORDS.index(SEP)
  batch = _batch()
  got = np.asarray(rewards(prm, *map(jnp.asarray, batch)))
  want = _reference(model, *batch, prm.separator_id)
  assert np.array_equal(np.isnan(got), np.isnan(want))
  assert np.isnan(got[1, 1]) and np.isnan(got[1, 3])  # the empty step and the padded slot
  np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], atol=1e-5)
  assert np.std(want[~np.isnan(want)]) > 1e-3  # the rewards differ between steps: the check can fail


def test_incremental_equals_whole_text(ref):
  _, _, path, _ = ref
  prm = load_prm(path)
  prompt, pmask, tokens, spans = map(jnp.asarray, _batch())
  whole = np.asarray(rewards(prm, prompt, pmask, tokens, spans))
  step = jax.jit(append_step)
  cache = jax.jit(prefill, static_argnames="room")(prm, prompt, pmask, room=tokens.shape[1] + spans.shape[1])
  one = []
  for k in range(spans.shape[1]):
    r, cache = step(prm, cache, tokens, spans[:, k])
    one.append(np.asarray(r))
  np.testing.assert_allclose(np.stack(one, 1), whole, atol=1e-5, equal_nan=True)
  held = np.asarray(cache.index)  # only real tokens and one separator per step went in: no holes, nothing else
  want = np.asarray(pmask).sum(1) + np.asarray([sum(int(e - a) + 1 for a, e in sp if e > a) for sp in spans])
  np.testing.assert_array_equal(held, want)


def test_long_step_spans_several_chunks(ref):
  _, _, path, _ = ref
  prm = load_prm(path)
  rng = np.random.default_rng(3)
  tokens = jnp.asarray(rng.integers(4, len(WORDS), (2, 80)), jnp.int32)
  spans = jnp.asarray([[[0, 70], [70, 80]], [[0, 2], [2, 66]]], jnp.int32)  # 71 and 65 tokens: 3 chunks of 32
  prompt, pmask = jnp.full((2, 2), 5, jnp.int32), jnp.ones((2, 2), bool)
  whole = np.asarray(rewards(prm, prompt, pmask, tokens, spans))
  cache = prefill(prm, prompt, pmask, room=90)
  got = []
  for k in range(2):
    r, cache = append_step(prm, cache, tokens, spans[:, k])
    got.append(np.asarray(r))
  np.testing.assert_allclose(np.stack(got, 1), whole, atol=1e-5)


def test_save_load_round_trip_and_from_target(ref, tmp_path):
  _, _, path, _ = ref
  prm = load_prm(path)
  save_prm(prm, str(tmp_path / "again"), tokenizer=_tokenizer(), separator=SEP)
  back = load_prm(str(tmp_path / "again"))
  batch = tuple(map(jnp.asarray, _batch()))
  np.testing.assert_allclose(
    np.asarray(rewards(back, *batch)), np.asarray(rewards(prm, *batch)), atol=1e-6, equal_nan=True
  )
  with open(tmp_path / "again" / "config.json") as f:
    assert json.load(f)["architectures"] == ["Qwen2ForProcessRewardModel"]

  cfg = ModelConfig(
    family="llama",
    vocab_size=len(WORDS),
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    tie_word_embeddings=False,
  )
  lm = LanguageModel.random(cfg, seed=1)
  p2 = from_target(lm, separator_id=3)
  ids = jnp.asarray(np.random.default_rng(0).integers(0, len(WORDS), (2, 9)), jnp.int32)
  h_lm = lm.forward(ids, capture=CaptureSpec(hidden_layers=(-1,))).hidden_states[2]
  from reprobe_jax.prm.model import hidden_states

  np.testing.assert_allclose(np.asarray(hidden_states(p2, ids, jnp.ones_like(ids, bool))), np.asarray(h_lm), atol=1e-6)


def test_bad_checkpoints_and_separators(ref, tmp_path):
  model, cfg, path, _ = ref
  no_head = _save(model, cfg, tmp_path / "lm", drop=("score.2.weight", "score.2.bias"))
  with pytest.raises(CheckpointError, match=r"no PRM head.*score\.2\.weight"):
    load_prm(no_head)
  with pytest.raises(ConfigError, match=r"separator token '<sep>' is not in the tokenizer"):
    load_prm(path, separator="<sep>")
  with pytest.raises(ConfigError, match=r"separator_id must be a token id in \[0, 97\)"):
    load_prm(path, separator_id=500)
  no_tok = _save(model, cfg, tmp_path / "no_tok", tokenizer=False)
  with pytest.raises(ConfigError, match="needs the PRM's tokenizer"):
    load_prm(no_tok)
  assert load_prm(no_tok, separator_id=3).separator_id == 3
