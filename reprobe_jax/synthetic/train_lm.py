"""Trains a target LM from scratch on (prompt, response) texts: optax, grain, orbax with exact resume.

The loss is next-token cross-entropy on response tokens only. Batches come from a grain `MapDataset` read by
index (batch i is a pure function of the seed and i), so a resumed run sees exactly the batches an uninterrupted
run would; the loop, checkpoints and TensorBoard scalars are `reprobe_jax.train.trainer.Trainer`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import grain
import jax
import jax.numpy as jnp
import numpy as np

from reprobe_jax.models import LanguageModel, ModelConfig
from reprobe_jax.models.logprob import masked_mean_nll, sequence_logprobs
from reprobe_jax.fields import SEED, Int, check_fields
from reprobe_jax.train.optimizer import OptimizerConfig, make_optimizer
from reprobe_jax.train.trainer import Trainer, TrainerConfig


@dataclasses.dataclass(frozen=True)
class TrainLMConfig:
  """optimizer: a cosine decay to 5% after a warmup of 40 steps, or a tenth of the run when that is shorter."""

  steps: int = 600
  batch_size: int = 32
  optimizer: OptimizerConfig = OptimizerConfig(
    learning_rate=3e-3,
    schedule="cosine",
    warmup_steps=40,
    warmup_frac=0.1,
    end_frac=0.05,
    weight_decay=0.01,
    b2=0.98,
    grad_clip=1.0,
  )
  seed: int = 0
  checkpoint_every: int = 100

  def __post_init__(self):
    check_fields(self, TRAIN_LM_RULES)


# What TrainLMConfig's fields must be (checked where it is made, and named from the build config that holds one).
TRAIN_LM_RULES = {"steps": Int(1), "batch_size": Int(1), "seed": SEED, "checkpoint_every": Int(1)}


def encode_examples(
  tokenizer,
  pairs: Sequence[tuple[str, str]],
  buckets: Sequence[int],
  *,
  prompt_weight: float | Sequence[float] = 0.0,
  response_weight: float | Sequence[float] = 1.0,
):
  """(prompt, response) texts -> {length bucket T: (tokens [N, T] right-padded, loss mask [N, T])}.

  The loss mask covers the response and the EOS that follows it, so the model learns to stop; prompt tokens get
  `prompt_weight` (a small weight there is extra signal at no extra compute: the prompt is run anyway). Each
  example goes
  to the smallest bucket that holds it, which keeps padding (and compute) low; examples longer than every bucket
  get a new one (their length rounded up to a multiple of 64). prompt_weight and response_weight (the weight of
  the response tokens and EOS): one for all, or one per pair.
  """
  eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

  def per_pair(w, name):
    out = [w] * len(pairs) if isinstance(w, (int, float)) else list(w)
    if len(out) != len(pairs):
      raise ValueError(f"encode_examples: {len(pairs)} pairs but {len(out)} {name}s")
    return out

  encoded = []
  for (prompt, response), w, rw in zip(
    pairs, per_pair(prompt_weight, "prompt weight"), per_pair(response_weight, "response weight")
  ):
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    r = tokenizer(response, add_special_tokens=False)["input_ids"] + [eos]
    encoded.append((p + r, len(p), (w, rw)))
  longest = max(len(ids) for ids, _, _ in encoded)
  buckets = sorted(set(buckets) | ({-(-longest // 64) * 64} if longest > max(buckets) else set()))
  rows: dict[int, list[tuple[list[int], int, tuple[float, float]]]] = {b: [] for b in buckets}
  for ids, n_prompt, w in encoded:
    rows[next(b for b in buckets if len(ids) <= b)].append((ids, n_prompt, w))
  out = {}
  for b, items in rows.items():
    if not items:
      continue
    tokens = np.full((len(items), b), pad, np.int32)
    mask = np.zeros((len(items), b), np.float32)
    for j, (ids, n_prompt, (w, rw)) in enumerate(items):
      tokens[j, : len(ids)] = ids
      mask[j, 1:n_prompt] = w
      mask[j, n_prompt : len(ids)] = rw
    out[b] = (tokens, mask)
  return out


class BatchSchedule:
  """Batch i is a pure function of (seed, i): a bucket drawn in proportion to its size, then that bucket's next
  batch from a grain dataset (shuffled, repeated). A resumed run therefore sees the batches an uninterrupted run
  would have seen."""

  def __init__(self, data: dict[int, tuple[np.ndarray, np.ndarray]], cfg: "TrainLMConfig"):
    self.lengths = sorted(data)
    sizes = np.array([len(data[b][0]) for b in self.lengths], float)
    rng = np.random.default_rng(cfg.seed)
    self.choice = rng.choice(len(self.lengths), size=cfg.steps, p=sizes / sizes.sum())
    self.within = np.zeros(cfg.steps, np.int64)
    counts = np.zeros(len(self.lengths), np.int64)
    for i, c in enumerate(self.choice):
      self.within[i], counts[c] = counts[c], counts[c] + 1
    self.datasets = []
    for k, b in enumerate(self.lengths):
      tokens, mask = data[b]
      n = len(tokens)
      batches_needed = int(counts[k]) + 1
      epochs = -(-batches_needed * cfg.batch_size // n) + 1
      ds = grain.MapDataset.range(n).repeat(epochs).shuffle(seed=cfg.seed + k)
      ds = ds.map(lambda j, t=tokens, m=mask: {"tokens": t[j], "loss_mask": m[j]})
      self.datasets.append(ds.batch(cfg.batch_size, drop_remainder=True))

  def __getitem__(self, i: int) -> dict:
    return self.datasets[self.choice[i]][int(self.within[i])]


def lm_loss(graphdef, treedef):
  """loss(leaves, batch, rng, frozen): next-token NLL, the masked mean of -sequence_logprobs under
  batch['loss_mask']."""

  def loss(leaves, batch, rng, frozen):
    del rng, frozen
    tokens = batch["tokens"]  # [B, T], right-padded
    # Right padding sits after every real token, so causal attention never reads it: every key may count.
    lp = sequence_logprobs(graphdef, jax.tree.unflatten(treedef, leaves), tokens, jnp.ones(tokens.shape, jnp.int32))
    return masked_mean_nll(lp, batch["loss_mask"])

  return loss


def train_lm(
  model_cfg: ModelConfig,
  data: dict[int, tuple[np.ndarray, np.ndarray]],
  cfg: TrainLMConfig,
  workdir: str,
  *,
  on_step: Callable[[int, float], None] | None = None,
) -> tuple[LanguageModel, list[float]]:
  """Trains from scratch (or resumes from `workdir`), returns the model (no tokenizer) and the loss history; a
  checkpoint made with another model config or TrainLMConfig is a CheckpointError naming the field.

  `on_step(step, loss)` is called for every step, in order, each time the losses are fetched from the device
  (every 10 steps and at checkpoints).
  """
  lm = LanguageModel.random(model_cfg, seed=cfg.seed)
  leaves, treedef = jax.tree.flatten(lm.params)
  tx, schedule = make_optimizer(cfg.optimizer, cfg.steps)
  batches = BatchSchedule(data, cfg)
  loop = TrainerConfig(steps=cfg.steps, seed=cfg.seed, checkpoint_every=cfg.checkpoint_every, keep_latest=2)
  trainer = Trainer(
    lm_loss(lm.graphdef, treedef),
    tx,
    loop,
    workdir,
    learning_rate=schedule,
    on_step=None if on_step is None else lambda step, m: on_step(step, m["loss"]),
    signature={"model": dataclasses.asdict(model_cfg), "train": dataclasses.asdict(cfg)},
  )
  result = trainer.fit(leaves, lambda i: {k: jnp.asarray(v) for k, v in batches[i].items()})
  params = jax.tree.unflatten(treedef, result.params)
  return LanguageModel(model_cfg, lm.graphdef, params), result.metrics["loss"]
