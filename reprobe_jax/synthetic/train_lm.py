"""Trains a target LM from scratch on (prompt, response) texts: optax, grain, orbax with exact resume.

The loss is next-token cross-entropy on response tokens only. Batches come from a grain `MapDataset` read by
index (batch i is a pure function of the seed and i), so a resumed run sees exactly the batches an uninterrupted
run would; parameters, optimiser state and the step are saved with an orbax `CheckpointManager`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Sequence

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging

from reprobe_jax.errors import ConfigError
from reprobe_jax.models import CaptureSpec, LanguageModel, ModelConfig
from reprobe_jax.models.forward import run_decoder
from reprobe_jax.tblog import ScalarWriter


@dataclasses.dataclass(frozen=True)
class TrainLMConfig:
  steps: int = 600
  batch_size: int = 32
  learning_rate: float = 3e-3
  warmup_steps: int = 40
  weight_decay: float = 0.01
  grad_clip: float = 1.0
  seed: int = 0
  checkpoint_every: int = 100


def encode_examples(tokenizer, pairs: Sequence[tuple[str, str]], buckets: Sequence[int], *,
                    prompt_weight: float = 0.0):
  """(prompt, response) texts -> {length bucket T: (tokens [N, T] right-padded, loss mask [N, T])}.

  The loss mask covers the response and the EOS that follows it, so the model learns to stop; prompt tokens get
  `prompt_weight` (a small weight there is extra signal at no extra compute: the prompt is run anyway). Each
  example goes
  to the smallest bucket that holds it, which keeps padding (and compute) low; examples longer than every bucket
  get a new one (their length rounded up to a multiple of 64).
  """
  eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
  encoded = []
  for prompt, response in pairs:
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    r = tokenizer(response, add_special_tokens=False)["input_ids"] + [eos]
    encoded.append((p + r, len(p)))
  longest = max(len(ids) for ids, _ in encoded)
  buckets = sorted(set(buckets) | ({-(-longest // 64) * 64} if longest > max(buckets) else set()))
  rows: dict[int, list[tuple[list[int], int]]] = {b: [] for b in buckets}
  for ids, n_prompt in encoded:
    rows[next(b for b in buckets if len(ids) <= b)].append((ids, n_prompt))
  out = {}
  for b, items in rows.items():
    if not items:
      continue
    tokens = np.full((len(items), b), pad, np.int32)
    mask = np.zeros((len(items), b), np.float32)
    for j, (ids, n_prompt) in enumerate(items):
      tokens[j, :len(ids)] = ids
      mask[j, 1:n_prompt] = prompt_weight
      mask[j, n_prompt:len(ids)] = 1.0
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


def _make_step(graphdef, treedef, tx):

  def loss_fn(leaves, tokens, loss_mask):
    params = jax.tree.unflatten(treedef, leaves)
    inputs = tokens[:, :-1]  # [B, T-1]
    # Right padding sits after every real token, so causal attention never reads it: no key mask needed.
    key_valid = jnp.ones(inputs.shape, bool)
    positions = jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape)
    logits, _, _ = run_decoder(graphdef, params, inputs, positions, key_valid, capture=CaptureSpec(), shard=None)
    # logsumexp minus the target logit picked by a one-hot product: its gradient is softmax - one-hot, with no
    # scatter (the backward of a gather), which XLA:CPU runs far slower than this fused elementwise product.
    target = jnp.sum(logits * jax.nn.one_hot(tokens[:, 1:], logits.shape[-1], dtype=logits.dtype), axis=-1)
    nll = jax.nn.logsumexp(logits, axis=-1) - target  # [B, T-1]
    w = loss_mask[:, 1:]
    return jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(leaves, opt_state, tokens, loss_mask):
    loss, grads = jax.value_and_grad(loss_fn)(leaves, tokens, loss_mask)
    updates, opt_state = tx.update(grads, opt_state, leaves)
    return optax.apply_updates(leaves, updates), opt_state, loss

  return step


def train_lm(model_cfg: ModelConfig, data: dict[int, tuple[np.ndarray, np.ndarray]], cfg: TrainLMConfig,
             workdir: str, *,
             on_step: Callable[[int, float], None] | None = None) -> tuple[LanguageModel, list[float]]:
  """Trains from scratch (or resumes from `workdir`), returns the model (no tokenizer) and the loss history."""
  lm = LanguageModel.random(model_cfg, seed=cfg.seed)
  leaves, treedef = jax.tree.flatten(lm.params)
  warmup = min(cfg.warmup_steps, max(cfg.steps // 10, 1))
  schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, warmup, max(cfg.steps, warmup + 1),
                                                cfg.learning_rate * 0.05)
  tx = optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                   optax.adamw(schedule, b2=0.98, weight_decay=cfg.weight_decay))
  opt_state = tx.init(leaves)
  losses: list[float] = []
  mngr = ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "checkpoints")),
                               options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True))
  start = 0
  if mngr.latest_step() is not None:
    start = mngr.latest_step()
    target = {"leaves": leaves, "opt_state": opt_state, "losses": np.zeros(start, np.float32)}
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    restored = mngr.restore(start, args=ocp.args.StandardRestore(abstract))
    leaves, opt_state = restored["leaves"], restored["opt_state"]
    losses = [float(x) for x in np.asarray(restored["losses"])]
    logging.info("resumed target-LM training at step %d", start)
  batches = BatchSchedule(data, cfg)
  step_fn = _make_step(lm.graphdef, treedef, tx)
  tb = ScalarWriter(os.path.join(workdir, "tb"))
  for i in range(start, cfg.steps):
    batch = batches[i]
    leaves, opt_state, loss = step_fn(leaves, opt_state, jnp.asarray(batch["tokens"]),
                                      jnp.asarray(batch["loss_mask"]))
    losses.append(float(loss))
    if on_step is not None:
      on_step(i + 1, losses[-1])
    if (i + 1) % 10 == 0:
      tb.write(i + 1, {"train/loss": np.mean(losses[-10:]), "train/learning_rate": schedule(i)})
    if (i + 1) % cfg.checkpoint_every == 0 or i + 1 == cfg.steps:
      mngr.save(i + 1, args=ocp.args.StandardSave(
          {"leaves": leaves, "opt_state": opt_state, "losses": np.asarray(losses, np.float32)}))
  mngr.wait_until_finished()
  mngr.close()
  tb.close()
  params = jax.tree.unflatten(treedef, leaves)
  return LanguageModel(model_cfg, lm.graphdef, params), losses
