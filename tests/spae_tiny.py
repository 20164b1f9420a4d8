"""Helpers of the SPAE tokenisation and decoding tests: a SentencePiece-style tokenizer built here (Metaspace
pre-tokenizer that always prepends '▁', a Unigram vocabulary, one piece that merges '\\n\\n' with the next word) and
a tiny Llama trained with optax for a few seconds to write given token sequences."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

WORDS = ["What", "is", "six", "times", "seven", "So", "the", "answer", "Final", "Answer", "boxed"]
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<think>", "</think>"]


def sentencepiece_tokenizer():
  """A Llama-2-style tokenizer: '▁' for spaces, prepended to every text; '42' alone is ['▁', '4', '2'], after '{'
  ['4', '2']; '\\n\\nSo' is one piece (a paragraph end merged with the next word)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  chars = sorted(set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,?!:*\\{}\n"))
  pieces = [(t, 0.0) for t in SPECIALS] + [("▁", -2.0)] + [(c, -3.0) for c in chars]
  pieces += [("**", -1.0), ("\n\nSo", -1.0)] + [(w, -1.0) for w in WORDS] + [("▁" + w, -1.0) for w in WORDS]
  sp = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=False))
  sp.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
  sp.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
  sp.add_special_tokens(SPECIALS)
  return PreTrainedTokenizerFast(
    tokenizer_object=sp, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
  )


def tiny_lm(tok, seed: int = 0):
  from reprobe_jax.models import LanguageModel, ModelConfig

  cfg = ModelConfig(
    family="llama",
    vocab_size=len(tok),
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=32,
    tie_word_embeddings=True,
    max_position_embeddings=256,
    bos_token_id=tok.bos_token_id,
    eos_token_ids=(tok.eos_token_id,),
    pad_token_id=tok.pad_token_id,
  )
  return LanguageModel.random(cfg, seed=seed, tokenizer=tok)


def train(lm, seqs, steps: int = 300, lr: float = 3e-3, until: float = 3e-3):
  """Teacher-forced next-token training on the sequences (right-padded, one batch) with Adam, for `steps` steps or
  until the mean loss is below `until`; returns the last loss."""
  import optax

  from reprobe_jax.models.capture import CaptureSpec
  from reprobe_jax.models.forward import forward

  n = max(map(len, seqs))
  ids = np.zeros((len(seqs), n), np.int32)
  mask = np.zeros((len(seqs), n), np.int32)
  for i, s in enumerate(seqs):
    ids[i, : len(s)], mask[i, : len(s)] = s, 1
  ids, mask = jnp.asarray(ids), jnp.asarray(mask)
  pos = jnp.broadcast_to(jnp.arange(n), ids.shape)
  graph = lm.static_graph

  def loss_fn(params):
    logits = forward(graph, params, ids, mask, pos, capture=CaptureSpec())["logits"][:, :-1]
    lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(lp, ids[:, 1:, None], axis=-1)[..., 0]
    w = mask[:, 1:].astype(jnp.float32)
    return jnp.sum(nll * w) / jnp.sum(w)

  tx = optax.adam(lr)

  @jax.jit
  def step(params, opt):
    loss, g = jax.value_and_grad(loss_fn)(params)
    upd, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, upd), opt, loss

  params, opt = lm.params, tx.init(lm.params)
  for _ in range(steps):
    params, opt, loss = step(params, opt)
    if float(loss) < until:
      break
  lm.params = params
  return float(loss)
