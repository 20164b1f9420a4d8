"""A tiny thinking model for the RL tests that need SPAE to probe something: a small Llama trained for a few
dozen steps on the arithmetic family's thinking traces, so its samples open `<think>`, write paragraph steps and
close the block (their arithmetic is mostly wrong: the tests reward them by a coin, not by correctness)."""

from __future__ import annotations

import dataclasses
import tempfile
import zlib

from reprobe_jax.models import LanguageModel, ModelConfig, SamplingParams
from reprobe_jax.rl import loop
from reprobe_jax.synthetic.tokenizer import build_tokenizer
from reprobe_jax.synthetic.train_lm import TrainLMConfig, encode_examples, train_lm
from reprobe_jax.tasks import make_problems
from reprobe_jax.tasks.traces import solve_many
from reprobe_jax.trajectories import prompt_text

TRAIN_STEPS = 60


def build_thinking_lm(directory: str) -> None:
  """Trains the model and saves it (weights, config, tokenizer) to `directory` (HF format, float32)."""
  problems = make_problems("arithmetic", 64, 5, 1)
  traces = solve_many(problems, "thinking", 0)
  tok = build_tokenizer([t.text for t in traces] + [p.question for p in problems], 300)
  cfg = ModelConfig(
    family="llama",
    vocab_size=len(tok),
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=1,
    head_dim=16,
    tie_word_embeddings=True,
    eos_token_ids=(tok.eos_token_id,),
    pad_token_id=tok.pad_token_id,
    max_position_embeddings=512,
  )
  shell = LanguageModel.random(cfg, seed=0, tokenizer=tok)
  pairs = [(prompt_text(shell, p, "thinking"), t.text) for p, t in zip(problems, traces)]
  with tempfile.TemporaryDirectory() as work:
    lm, _ = train_lm(cfg, encode_examples(tok, pairs, (256,)), TrainLMConfig(steps=TRAIN_STEPS, batch_size=8), work)
  lm.tokenizer = tok
  lm.save_pretrained(directory)


def coin_reward(problem, text):
  """A reward that mixes within groups whatever the model knows: the parity of the response's CRC."""
  return float(zlib.crc32(text.encode()) % 2)


def tiny_rl(**kw) -> loop.RLConfig:
  base = dict(
    advantage="spae",
    steps=2,
    prompts_per_step=2,
    group_size=4,
    prompts_per_round=2,
    max_refill_rounds=1,
    max_new_tokens=128,
    sampling=SamplingParams(temperature=0.7, top_k=0, top_p=1.0),
    optimizer=dataclasses.replace(loop.RLConfig().optimizer, learning_rate=1e-2),
    train_problems=8,
    train_difficulties=(1,),
    mini_batches=2,
    checkpoint_every=1,
  )
  base.update(kw)
  return loop.RLConfig(**base)
