"""The configurations of the Colab notebooks (colab/): one function per notebook, the job's own config plus the
notebook's choices, and `smoke=True` for the tiny version the test suite executes (tests/test_notebooks.py).

    config = colab.reprobe("artifacts")                      # the built-in default (make demo's target and probes)
    config = colab.reprobe("artifacts", model="HuggingFaceTB/SmolLM2-135M-Instruct")   # a hub model (GPU/TPU)
    config = colab.reprobe("/tmp/w", smoke=True)             # a few problems on a 2-layer, 32-wide target

A smoke run exercises every code path of the notebook (target build, sampling with capture, labels, probe
training, search, potentials, truncation) at sizes where its numbers mean nothing; it takes under a minute per
notebook on 2 CPU cores.
"""

import os

import ml_collections

from configs import reprobe_smollm2, reprobe_synthetic, spae_smollm2, spae_synthetic, tts_synthetic

PROBE = "attn+logit"  # the notebooks' probe: the best in-domain feature set of docs/results.md's table


def _smoke_target(t: ml_collections.ConfigDict) -> None:
  t.train_problems_per_difficulty = 8
  t.difficulties = (1,)
  t.eval_problems_per_family = 2
  t.vocab_size = 400
  t.max_new_tokens = ml_collections.ConfigDict({"line": 32, "thinking": 48})
  t.model.update(
    dict(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1, max_position_embeddings=512)
  )
  t.train.update(dict(steps=20, batch_size=4, checkpoint_every=20))


def _place(c: ml_collections.ConfigDict, workdir: str, name: str, model: str) -> None:
  c.workdir = os.path.join(workdir, name)
  if model:
    c.target_path = model
  else:
    c.target.workdir = os.path.join(workdir, c.target.workdir.split("/")[-1])


def reprobe(workdir: str, *, model: str = "", smoke: bool = False) -> ml_collections.ConfigDict:
  """The quickstart's ReProbe job: configs/reprobe_synthetic.py (or, for a model, configs/reprobe_smollm2.py's
  sizes and few-shot prompts) with one probe (attention + logit features) and no PRM baseline."""
  c = reprobe_smollm2.get_config() if model else reprobe_synthetic.get_config()
  _place(c, workdir, "reprobe_smollm2" if model else "reprobe_synthetic", model)
  c.feature_sets = (PROBE,)
  c.prm.enabled = False
  if smoke:
    if not model:
      _smoke_target(c.target)
    c.update(dict(train_problems=8, val_problems=4, test_problems=4, difficulties=(1,)))
    c.trajectories.update(dict(samples=2, max_new_tokens=48))
    c.probe.update(dict(d_model=16, n_heads=2, ff_dim=32))
    c.train.update(dict(epochs=1, batch_size=8))
  return c


def tts(workdir: str, *, model: str = "", smoke: bool = False) -> ml_collections.ConfigDict:
  """The test-time-scaling notebook: the quickstart's ReProbe job (same run folder, so its probe is reused) plus
  the grid of configs/tts_synthetic.py:demo with Perplexity beside the probe, in and out of domain."""
  c = tts_synthetic.get_config("demo")
  base = reprobe(workdir, model=model, smoke=smoke)
  tts_section = c.tts
  c = base
  c.job = "tts"
  c.tts = tts_section
  c.tts.domains = ("arithmetic", "planning")
  c.tts.scorers = (f"probe[{PROBE}]", "perplexity")
  c.tts.problems = 30
  if smoke:
    c.tts.update(dict(problems=2, domains=("arithmetic",), budgets=(1, 2), max_steps=3))
  return c


def spae(workdir: str, *, model: str = "", smoke: bool = False) -> ml_collections.ConfigDict:
  """The SPAE notebook: configs/spae_synthetic.py (its own target, trained with interrupted thinking traces) or,
  for a model, configs/spae_smollm2.py's prompts and sizes."""
  c = spae_smollm2.get_config() if model else spae_synthetic.get_config()
  _place(c, workdir, "spae_smollm2" if model else "spae_synthetic", model)
  c.spae.problems = 8
  c.spae.samples = 8
  if smoke:
    if not model:
      _smoke_target(c.target)
      c.target.thinking_fraction = 1.0
    c.spae.update(dict(problems=2, samples=2, difficulties=(1,), max_new_tokens=32, batch_size=8))
    c.probe.update(dict(samples=2, max_tokens=3))
  return c
