"""The PRM baseline's model (docs/method.md §A7): a decoder backbone from our model table plus the Qwen2.5-Math-PRM head
Linear(H, H), ReLU, Linear(H, 2); the steps of a response are joined by a separator token and each step's reward
is softmax(head)[1] read at the separator after it.

    prm = load_prm("Qwen/Qwen2.5-Math-PRM-7B")               # or a folder; separator '<extra_0>' by default
    r = step_rewards(prm, prompt_ids, prompt_mask, tokens, spans)   # [B, S] P(step correct), NaN for empty steps
    cache = prefill(prm, prompt_ids, prompt_mask, room=512)        # incremental, as search uses it:
    r0, cache = append_step(prm, cache, tokens, spans[:, 0])        # one step per call, each read once

Token layout: a row's PRM input is its prompt (left-padded [B, Tp]), then for each step its response tokens
[start, end) followed by one separator token. Tokens between steps (none in our aligned trajectories) are not read.
The PRM reads the target's own token ids, so it must share the target's tokenizer (a PRM trained here does; a
checkpoint with another vocabulary is refused where a scorer is checked against its target).

The backbone is the same `Decoder` as the target (any family), loaded with the tied-embedding layout: a PRM has no
LM head, and under jit the unused vocabulary logits are dropped, so a PRM pays for its backbone and head only.
Checkpoints use the upstream tensor names: the backbone's `model.*` and the head's `score.0.*`, `score.2.*`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from reprobe_jax.io.atomic import atomic_folder, seal_folder
from reprobe_jax.errors import CheckpointError, ConfigError
from reprobe_jax.models import CaptureSpec, LanguageModel
from reprobe_jax.models.checkpoint import export_tensors, load_tensors
from reprobe_jax.models.safetensors_io import iter_hf_tensors, write_safetensors
from reprobe_jax.models.config import ModelConfig
from reprobe_jax.models.forward import StaticGraph, positions_from_mask, run_decoder
from reprobe_jax.models.kv_cache import KVCache
from reprobe_jax.models.language_model import resolve_dtype
from reprobe_jax.models.loading import load_tokenizer, resolve_path
from reprobe_jax.models.sampling import extend_in_jit
from reprobe_jax.models.sharding import DEFAULT_RULES, ShardingCtx
from reprobe_jax.io.readers import read_json
from reprobe_jax.io.seal import check_folder

QWEN_SEPARATOR = "<extra_0>"  # Qwen2.5-Math-PRM's step separator
HEAD_TENSORS = ("score.0.weight", "score.0.bias", "score.2.weight", "score.2.bias")
_CAPTURE = CaptureSpec(hidden_layers=(-1,))  # the last hidden state, after the final norm
CHUNK = 32  # tokens per forward when a step is appended to the PRM's cache (a step of w tokens costs ceil((w+1)/32))


@struct.dataclass
class PRMHead:
  """Linear(H, H), ReLU, Linear(H, 2); kernels stored [in, out] (the transpose of torch's Linear.weight)."""

  w1: jax.Array  # [H, H]
  b1: jax.Array  # [H]
  w2: jax.Array  # [H, 2]
  b2: jax.Array  # [2]

  def logits(self, h):
    """[..., 2] logits (index 1 = correct) from hidden states [..., H] (float32)."""
    h = h.astype(jnp.float32)
    return jax.nn.relu(h @ self.w1 + self.b1) @ self.w2 + self.b2

  def __call__(self, h):
    """P(step correct) [...] from hidden states [..., H]: softmax(logits)[..., 1]."""
    return jax.nn.softmax(self.logits(h), axis=-1)[..., 1]


@struct.dataclass
class PRM:
  """A PRM on device: backbone parameters and head are the traced leaves; the config, graph and separator id are
  static (they key the jit cache). `config` is the backbone's, tied (no LM head)."""

  params: Any
  head: PRMHead
  config: ModelConfig = struct.field(pytree_node=False)
  graph: StaticGraph = struct.field(pytree_node=False)
  separator_id: int = struct.field(pytree_node=False)


def _backbone_config(cfg: ModelConfig) -> ModelConfig:
  return cfg.replace(tie_word_embeddings=True)


def random_head(hidden: int, seed: int = 0) -> PRMHead:
  """A fresh head: normal kernels of scale H^-1/2, zero biases (what training starts from)."""
  k1, k2 = jax.random.split(jax.random.key(seed))
  scale = hidden**-0.5
  return PRMHead(
    w1=jax.random.normal(k1, (hidden, hidden), jnp.float32) * scale,
    b1=jnp.zeros((hidden,), jnp.float32),
    w2=jax.random.normal(k2, (hidden, 2), jnp.float32) * scale,
    b2=jnp.zeros((2,), jnp.float32),
  )


def check_separator(separator_id, vocab_size: int, where: str = "PRM") -> int:
  """The separator id as an int in [0, vocab_size); ConfigError otherwise."""
  if (
    isinstance(separator_id, bool)
    or not isinstance(separator_id, (int, np.integer))
    or not (0 <= separator_id < vocab_size)
  ):
    raise ConfigError(f"{where}: separator_id must be a token id in [0, {vocab_size}), got {separator_id!r}")
  return int(separator_id)


def separator_token_id(tokenizer, separator: str, where: str = "PRM") -> int:
  """The id of the single token `separator` in `tokenizer`; ConfigError naming it when the tokenizer lacks it
  (an unknown token maps to the unknown id, or is split into several)."""
  if not isinstance(separator, str) or not separator:
    raise ConfigError(f"{where}: separator must be a non-empty token string, got {separator!r}")
  vocab = tokenizer.get_vocab()
  if separator not in vocab:
    raise ConfigError(
      f"{where}: the separator token {separator!r} is not in the tokenizer's vocabulary "
      f"({len(vocab)} tokens); name a token it has"
    )
  return int(vocab[separator])


def from_target(lm: LanguageModel, *, separator_id: int, seed: int = 0) -> PRM:
  """A PRM whose backbone is a copy of the target's weights (without its LM head) and whose head is random."""
  cfg = _backbone_config(lm.config)
  tensors = export_tensors(lm.config, lm.params)
  tensors.pop("lm_head.weight", None)
  items = [(k, (lambda v=v: v), v.shape) for k, v in tensors.items()]
  graphdef, params = load_tensors(cfg, items, dtype=lm.dtype, shard=lm.shard, source="target")
  return PRM(
    params=params,
    head=random_head(cfg.hidden_size, seed),
    config=cfg,
    graph=StaticGraph(graphdef),
    separator_id=check_separator(separator_id, cfg.vocab_size),
  )


def load_prm(
  path: str,
  *,
  separator: str = QWEN_SEPARATOR,
  separator_id: int | None = None,
  dtype="float32",
  mesh=None,
  rules=DEFAULT_RULES,
) -> PRM:
  """A PRM from a Hugging Face-layout folder (or hub id): config.json, safetensors with `model.*` and the head
  `score.0.*`, `score.2.*`. The backbone streams onto `mesh` like the decoder does. The separator is `separator_id`
  if given, else the folder's `prm_separator` (written by `save_prm`) or `separator`, looked up in its tokenizer.
  CheckpointError for a checkpoint without the head (a causal LM is not a PRM) or with a head of other shapes;
  ConfigError for a separator the tokenizer does not have."""
  path = resolve_path(str(path))
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isdir(path) or not os.path.exists(cfg_path):
    raise CheckpointError(f"{path}: not a PRM folder (no config.json)")
  check_folder(path, "PRM folder", required=False)  # one `save_prm` wrote is sealed; a downloaded one is not
  raw = read_json(cfg_path, "PRM config")
  cfg = _backbone_config(ModelConfig.from_hf_dict(raw, source=cfg_path))
  head_arrays: dict[str, np.ndarray] = {}

  def backbone():
    for name, get, shape in iter_hf_tensors(path):
      if name.startswith("score."):
        if name not in HEAD_TENSORS:
          raise CheckpointError(
            f"{path}: unexpected head tensor {name!r} {list(shape)}; a PRM head is {', '.join(HEAD_TENSORS)}"
          )
        head_arrays[name] = np.asarray(get(), np.float32)
      elif name != "lm_head.weight":  # a PRM reads no vocabulary logits
        yield name, get, shape

  shard = ShardingCtx(mesh, tuple(rules)) if mesh is not None else None
  graphdef, params = load_tensors(cfg, backbone(), dtype=resolve_dtype(dtype), shard=shard, source=path)
  missing = [n for n in HEAD_TENSORS if n not in head_arrays]
  if missing:
    raise CheckpointError(
      f"{path}: no PRM head: missing {missing} (Linear(H, H), ReLU, Linear(H, 2) named "
      "score.0.*, score.2.*); a causal LM checkpoint is not a PRM"
    )
  h = cfg.hidden_size
  want = {"score.0.weight": (h, h), "score.0.bias": (h,), "score.2.weight": (2, h), "score.2.bias": (2,)}
  for name, shape in want.items():
    if head_arrays[name].shape != shape:
      raise CheckpointError(
        f"{path}: head tensor {name!r} has shape {list(head_arrays[name].shape)}; a PRM with "
        f"hidden size {h} and 2 labels needs {list(shape)}"
      )
  head = PRMHead(
    w1=jnp.asarray(head_arrays["score.0.weight"].T),
    b1=jnp.asarray(head_arrays["score.0.bias"]),
    w2=jnp.asarray(head_arrays["score.2.weight"].T),
    b2=jnp.asarray(head_arrays["score.2.bias"]),
  )
  if separator_id is None:
    name = raw.get("prm_separator", separator)
    try:
      tok = load_tokenizer(path)
    except Exception as e:  # tokenizer files that do not load
      raise ConfigError(
        f"{path}: the separator {name!r} needs the PRM's tokenizer, which does not load ({e}); pass separator_id"
      ) from None
    if tok is None:
      raise ConfigError(
        f"{path}: the separator {name!r} needs the PRM's tokenizer, and the folder has none; pass separator_id"
      )
    separator_id = separator_token_id(tok, name, path)
  return PRM(
    params=params,
    head=head,
    config=cfg,
    graph=StaticGraph(graphdef),
    separator_id=check_separator(separator_id, cfg.vocab_size, path),
  )


def save_prm(
  prm: PRM, directory: str, *, tokenizer=None, separator: str | None = None, extra: dict | None = None
) -> None:
  """Writes the upstream layout (config.json with `architectures` [<Family>ForProcessRewardModel], model.safetensors
  with `model.*` and `score.*`; the tokenizer when given) atomically. `separator` (its token string) is recorded as
  `prm_separator` so `load_prm` finds the same id; `extra` keys go into config.json (e.g. what it was trained on)."""
  cfg = prm.config.to_hf_dict()
  cfg["architectures"] = [cfg["architectures"][0].replace("ForCausalLM", "ForProcessRewardModel")]
  cfg.update(
    num_labels=2,
    prm_separator_id=prm.separator_id,
    **({"prm_separator": separator} if separator else {}),
    **(extra or {}),
  )
  tensors = export_tensors(prm.config, prm.params)
  head = jax.device_get(prm.head)
  tensors.update(
    {
      "score.0.weight": np.asarray(head.w1).T,
      "score.0.bias": np.asarray(head.b1),
      "score.2.weight": np.asarray(head.w2).T,
      "score.2.bias": np.asarray(head.b2),
    }
  )
  with atomic_folder(directory) as tmp:
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(cfg, f, indent=2)
    write_safetensors(
      os.path.join(tmp, "model.safetensors"),
      {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
      {"format": "pt"},
    )
    if tokenizer is not None:
      tokenizer.save_pretrained(tmp)
    seal_folder(tmp, last="config.json")  # each file's digest beside it: load_prm refuses a damaged file


# ------------------------------------------------------------------------------------------------ scoring


def valid_spans(spans, t: int):
  """[B, S] bool: the step has tokens and lies in a buffer of t tokens (0 <= start < end <= t)."""
  return (spans[..., 1] > spans[..., 0]) & (spans[..., 0] >= 0) & (spans[..., 1] <= t)


def join_steps(prompt_ids, prompt_mask, tokens, spans, separator_id: int):
  """The PRM input of each row: (ids [B, L], mask [B, L], separator positions [B, S]) with L = Tp + T + S.
  prompt_ids/prompt_mask [B, Tp] (left-padded), tokens [B, T], spans [B, S, 2] ordered, non-overlapping. Positions
  [Tp, ...) hold step 0's tokens, a separator, step 1's tokens, a separator, ...; a step with no tokens gets no
  separator (its position is 0 and must not be read)."""
  b, tp = prompt_ids.shape
  t, s = tokens.shape[1], spans.shape[1]
  ok = valid_spans(spans, t)  # [B, S]
  pos = jnp.arange(t)
  in_step = jnp.any(
    (pos[None, None, :] >= spans[..., 0:1]) & (pos[None, None, :] < spans[..., 1:2]) & ok[..., None], axis=1
  )  # [B, T]
  kept_before = jnp.cumsum(in_step, axis=1) - in_step  # [B, T] kept tokens before token j
  ends = jnp.where(ok, spans[..., 1], t + 1)  # [B, S]
  seps_before = jnp.sum(ends[:, None, :] <= pos[None, :, None], axis=-1)  # [B, T] separators placed before token j
  at = jnp.where(in_step, tp + kept_before + seps_before, tp + t + s)  # [B, T]; out of range -> dropped
  kept_to_end = jnp.take_along_axis(
    jnp.concatenate([kept_before, jnp.sum(in_step, 1, keepdims=True)], 1), jnp.clip(spans[..., 1], 0, t), axis=1
  )  # [B, S] kept tokens before each end
  rank = jnp.cumsum(ok, axis=1) - ok  # [B, S] valid steps before step k
  sep_at = jnp.where(ok, tp + kept_to_end + rank, 0)
  length = tp + t + s
  rows = jnp.arange(b)[:, None]
  ids = jnp.zeros((b, length), jnp.int32).at[:, :tp].set(jnp.where(prompt_mask, prompt_ids, 0))
  ids = ids.at[rows, at].set(tokens.astype(jnp.int32), mode="drop")
  ids = ids.at[rows, jnp.where(ok, sep_at, length)].set(separator_id, mode="drop")
  mask = jnp.zeros((b, length), bool).at[:, :tp].set(prompt_mask.astype(bool))
  mask = mask.at[rows, at].set(True, mode="drop").at[rows, jnp.where(ok, sep_at, length)].set(True, mode="drop")
  return ids, mask, sep_at


def hidden_states(prm: PRM, ids, mask):
  """[B, L, H] the backbone's last hidden state (after the final norm) of ids [B, L] with mask [B, L]."""
  key_valid = mask.astype(bool)
  _, _, captured = run_decoder(
    prm.graph, prm.params, ids, positions_from_mask(mask), key_valid, capture=_CAPTURE, shard=None
  )
  return next(iter(captured["hidden_states"].values()))


def step_logits(prm: PRM, prompt_ids, prompt_mask, tokens, spans):
  """[B, S, 2] head logits at every step's separator (index 1 = correct), the whole text in one forward; the
  entries of steps without tokens are meaningless (mask them with `valid_spans`). What training differentiates."""
  ids, mask, sep_at = join_steps(prompt_ids, prompt_mask, tokens, spans, prm.separator_id)
  h = hidden_states(prm, ids, mask)
  return prm.head.logits(jnp.take_along_axis(h, sep_at[..., None], axis=1))


def step_rewards(prm: PRM, prompt_ids, prompt_mask, tokens, spans):
  """[B, S] P(step correct) of every step, the whole text in one forward (docs/method.md §A7); NaN for steps without
  tokens. Pure: callable inside another jitted program; `rewards` below is the jitted entry point."""
  r = jax.nn.softmax(step_logits(prm, prompt_ids, prompt_mask, tokens, spans), axis=-1)[..., 1]
  return jnp.where(valid_spans(spans, tokens.shape[1]), r, jnp.nan)


rewards = jax.jit(step_rewards)


def prefill(prm: PRM, prompt_ids, prompt_mask, room: int) -> KVCache:
  """The PRM's own KV cache of each row's prompt [B, Tp] (left-padded), with `room` slots after it for steps and
  their separators. Pure (callable inside jit); `room` is static."""
  b, tp = prompt_ids.shape
  cache = KVCache.zeros(prm.config, b, tp + room, jax.tree.leaves(prm.params)[0].dtype)
  _, _, cache = extend_in_jit(
    prm.graph, prm.params, cache, prompt_ids.astype(jnp.int32), prompt_mask.astype(jnp.int32), capture=CaptureSpec()
  )
  return cache


def append_step(prm: PRM, cache: KVCache, tokens, span):
  """Appends each row's step tokens[span] [B, 2] and a separator to its cache: (P(step correct) [B], cache). Only
  the new tokens are read (in chunks of CHUNK); a row whose span is empty gets NaN and an unchanged cache. Pure."""
  t = tokens.shape[1]
  ok = valid_spans(span[:, None, :], t)[:, 0]  # [B]
  start = span[:, 0]
  width = jnp.where(ok, span[:, 1] - span[:, 0] + 1, 0)  # step tokens + the separator
  chunks = (jnp.max(width) + CHUNK - 1) // CHUNK
  h0 = jnp.zeros((tokens.shape[0], prm.config.hidden_size), jnp.float32)
  offs = jnp.arange(CHUNK)

  def body(carry):
    c, cache, h = carry
    j = c * CHUNK + offs[None, :]  # [B, C] index into the step + separator sequence
    ids = jnp.take_along_axis(tokens, jnp.clip(start[:, None] + j, 0, t - 1), axis=1)
    ids = jnp.where(j == width[:, None] - 1, prm.separator_id, ids).astype(jnp.int32)
    mask = j < width[:, None]
    _, captured, cache = extend_in_jit(prm.graph, prm.params, cache, ids, mask.astype(jnp.int32), capture=_CAPTURE)
    hid = next(iter(captured["hidden_states"].values()))  # [B, C, H]
    last = j == width[:, None] - 1  # the separator, in this chunk for some rows
    h = jnp.where(jnp.any(last, axis=1)[:, None], jnp.sum(jnp.where(last[..., None], hid, 0.0), axis=1), h)
    return c + 1, cache, h

  _, cache, h = jax.lax.while_loop(lambda carry: carry[0] < chunks, body, (jnp.int32(0), cache, h0))
  return jnp.where(ok, prm.head(h), jnp.nan), cache
