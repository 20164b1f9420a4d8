"""The built-in default's mechanics on a small, fast configuration (the quality gates are measured by the full
build)."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers

from reprobe_jax.errors import ConfigError
from reprobe_jax.models import load_pretrained
from reprobe_jax.jobs.target import build, load_report
from reprobe_jax.jobs.target_config import SyntheticBuildConfig, TinyLMShape, config_from_dict
from reprobe_jax.synthetic.tokenizer import build_tokenizer, chat_prompt
from reprobe_jax.synthetic.train_lm import TrainLMConfig, encode_examples, train_lm

SMALL = SyntheticBuildConfig(
  train_problems_per_difficulty=12,
  eval_problems_per_family=6,
  vocab_size=600,
  model=TinyLMShape(hidden_size=48, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2),
  train=TrainLMConfig(steps=4, batch_size=8, checkpoint_every=2),
  buckets=(256, 512),
  max_new_tokens=(("line", 24), ("thinking", 32)),
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("synthetic"))
  events = []
  out = build(SMALL, workdir, progress=lambda stage, done, total: events.append((stage.split()[0], done, total)))
  return workdir, out, events


def test_build_writes_model_samples_and_report(built):
  _, out, events = built
  report = load_report(out)
  assert set(report["groups"]) == {f"{f}/{m}" for m in ("line", "thinking") for f in ("arithmetic", "planning", "qa")}
  for name, g in report["groups"].items():
    assert g["samples"] == 6, name
    assert 0.0 <= g["final_accuracy"] <= 1.0 and g["mean_tokens"] > 0
    if name.endswith("thinking"):
      assert "recheck_after_answer_share" in g and "right_to_wrong_rate" in g
  assert {"train", "sample"} <= {e[0] for e in events}
  assert ("train", 4, 4) in events
  for f in (
    "problems_train.jsonl",
    "problems_eval.jsonl",
    "samples_eval.jsonl",
    "report.md",
    "model/config.json",
    "model/model.safetensors",
    "model/tokenizer.json",
  ):
    assert os.path.exists(os.path.join(out, f)), f
  with open(os.path.join(out, "samples_eval.jsonl")) as f:
    rec = json.loads(f.readline())
  assert {"response", "labels", "correct", "num_tokens"} <= set(rec)


def test_rebuild_reuses_and_changed_config_builds_anew(built):
  workdir, out, _ = built
  before = os.path.getmtime(os.path.join(out, "model", "model.safetensors"))
  events = []
  again = build(SMALL, workdir, progress=lambda *e: events.append(e))
  assert again == out and not events  # nothing trained or sampled
  assert os.path.getmtime(os.path.join(out, "model", "model.safetensors")) == before
  changed = dataclasses.replace(SMALL, seed=1)
  assert changed.key() != SMALL.key()


def test_exported_model_matches_pytorch(built):
  _, out, _ = built
  lm = load_pretrained(os.path.join(out, "model"))
  hf = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(out, "model"), dtype=torch.float32).eval()
  tok = transformers.AutoTokenizer.from_pretrained(os.path.join(out, "model"))
  text = chat_prompt(tok, "Start with 4. Add 3. What is the final result?") + "- Step 1: 4 + 3 = 7\n"
  ids = np.asarray([tok(text)["input_ids"]])
  assert ids.shape[1] > 10 and tok.decode(ids[0]) == text  # byte-level BPE round-trips exactly
  with torch.no_grad():
    ref = hf(torch.tensor(ids)).logits.numpy()
  ours = np.asarray(lm.forward(ids).logits)
  assert np.abs(ours - ref).max() / np.abs(ref).max() < 1e-4


def test_training_resumes_to_the_same_result(tmp_path):
  """A run killed after its first checkpoint and restarted ends where an uninterrupted run ends."""
  pairs = [(f"q{i}", f"a {i % 7} b {i % 5}") for i in range(40)]
  tok = build_tokenizer([q + a for q, a in pairs], 300)
  data = encode_examples(tok, [(chat_prompt(tok, q), a) for q, a in pairs], (32,))
  from reprobe_jax.models import ModelConfig

  cfg = ModelConfig(
    family="llama",
    vocab_size=len(tok),
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    tie_word_embeddings=True,
  )
  tcfg = TrainLMConfig(steps=6, batch_size=4, checkpoint_every=3)
  whole, losses = train_lm(cfg, data, tcfg, str(tmp_path / "a"))

  class Killed(Exception):
    pass

  def kill_at_5(step, loss):
    if step == 5:
      raise Killed

  with pytest.raises(Killed):
    train_lm(cfg, data, tcfg, str(tmp_path / "b"), on_step=kill_at_5)
  resumed, losses_b = train_lm(cfg, data, tcfg, str(tmp_path / "b"))
  assert losses_b == losses
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_config_overrides_are_checked():
  from configs.target_synthetic import get_config

  c = get_config()
  cfg = config_from_dict(c)
  assert cfg.train.steps == c.train.steps and cfg.model.hidden_size == c.model.hidden_size
  c.train.stepz = 3
  with pytest.raises(ConfigError, match="stepz"):
    config_from_dict(c)


def test_thinking_subset_is_a_stable_share_of_the_problems():
  from reprobe_jax.jobs.target import thinking_subset
  from reprobe_jax.tasks import make_problems

  problems = make_problems("arithmetic", 400, seed=0, difficulty=1)
  chosen = thinking_subset(problems, 0.4)
  assert 0.3 < len(chosen) / len(problems) < 0.5
  # chosen by id, not by position: the same problems whatever the order
  assert {p.id for p in thinking_subset(problems[::-1], 0.4)} == {p.id for p in chosen}
  assert thinking_subset(problems, 1.0) == problems
  with pytest.raises(ConfigError, match="thinking_fraction"):
    thinking_subset(problems, 0.0)
