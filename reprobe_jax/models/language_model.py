"""`LanguageModel`: the NNX shell around the pure forward / sampling functions, plus load and save."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

import reprobe_jax.models.decode_state as decode_state
import reprobe_jax.models.sampling as sampling
from reprobe_jax import kernels
from reprobe_jax.io.atomic import atomic_folder
from reprobe_jax.errors import CacheFullError, ConfigError, shape_errors
from reprobe_jax.fields import check_seed
from reprobe_jax.models.capture import CaptureSpec, ForwardOutput, TokenFeatures
from reprobe_jax.models.checkpoint import export_tensors
from reprobe_jax.models.config import ModelConfig
from reprobe_jax.models.forward import StaticGraph, forward as _forward, positions_from_mask
from reprobe_jax.models.decode_state import StopRule
from reprobe_jax.models.kv_cache import KVCache
from reprobe_jax.models.safetensors_io import write_safetensors
from reprobe_jax.models.sampler import Sampler
from reprobe_jax.models.sharding import ShardingCtx, to_host
from reprobe_jax.models.transformer import Decoder, packing_applies, with_packed_weights

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def resolve_dtype(dtype) -> Any:
  if isinstance(dtype, str):
    if dtype not in _DTYPES:
      raise ConfigError(f"dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]
  return dtype


@dataclasses.dataclass
class Generation:
  """Result of `LanguageModel.generate`; rows are prompt-major (row = prompt * n + sample).

  tokens [R, N] int32 (pad after each row's end); logprobs [R, N] (log p of each token at temperature 1);
  lengths [R]; finish_reason per row ('eos', 'stop' or 'length'); prompt_index [R]; texts; features: for each
  generated token, what the state that predicted it captured (hidden states [R, N, D], attention window
  [R, N, L, H, W], top_probs [R, N, K], token_entropy and token_self_certainty [R, N], as `capture` asks),
  zero past each row's end.
  """

  tokens: Int[np.ndarray, "r n"]
  logprobs: Float[np.ndarray, "r n"]
  lengths: Int[np.ndarray, " r"]
  finish_reason: list[str]
  prompt_index: Int[np.ndarray, " r"]
  prompt_ids: list[list[int]]
  texts: list[str]
  features: TokenFeatures

  def token_ids(self, row: int) -> list[int]:
    return self.tokens[row, : self.lengths[row]].tolist()


def _strings(name: str, values) -> tuple[str, ...]:
  """A sequence of non-empty strings (a bare string is one item, not its characters)."""
  values = (values,) if isinstance(values, str) else tuple(values)
  for v in values:
    if not isinstance(v, str) or not v:
      raise ConfigError(f"{name} must be non-empty strings, got {v!r}")
  return values


KEEP = object()  # `sharing_weights`: keep this model's tokenizer


@dataclasses.dataclass(frozen=True)
class _DecodeView:
  """`LanguageModel.decode_view`'s cache: what it was made from, what it is, and why it is not packed ('' if it is)."""

  graphdef: Any
  params: Any
  packed_decode: bool | None
  graph: StaticGraph
  view_params: Any
  why_not: str


class LanguageModel:
  """A frozen decoder: `forward` with capture, `generate`, `save_pretrained`; params split once for jit."""

  def __init__(
    self, config: ModelConfig, graphdef, params, tokenizer=None, *, shard: ShardingCtx | None = None, dtype=jnp.float32
  ):
    self.config = config
    self.graphdef = graphdef
    self.params = params
    self.tokenizer = tokenizer
    self.shard = shard
    self.dtype = resolve_dtype(dtype)
    self._stop_cache: dict[tuple[str, ...], np.ndarray] = {}
    self._static: StaticGraph | None = None
    # None: the decode path packs weights for the CPU kernel where `packing_applies`; False: never; True: wherever
    # the kernel can run, whatever the model's size (tests, benchmarks).
    self.packed_decode: bool | None = None
    self._decode: _DecodeView | None = None

  @property
  def static_graph(self) -> StaticGraph:
    """The graphdef wrapped for jit (hashed once; rebuilt if `graphdef` is replaced)."""
    if self._static is None or self._static.value is not self.graphdef:
      self._static = StaticGraph(self.graphdef)
    return self._static

  def decode_view(self) -> tuple[StaticGraph, Any]:
    """(graph, params) for the decode-path programs: prefill, decode, force, fork, `extend`, the step-level search
    and SPAE's probes. On one CPU device, for a float32 model with at least `kernels.MIN_MODEL_BYTES` of matmul
    weights (see `packed_decode`), the model with a packed copy of every weight beside it
    (`transformer.with_packed_weights`), so steps of up to `kernels.MAX_ROWS` rows run the CPU kernel; else the
    model's own. Made once per params object (replacing `params` makes a new one); the packed copies hold as many
    bytes again as the matmul weights. `decode_kernel` says which."""
    c = self._decode
    if (
      c is not None
      and c.graphdef is self.graphdef
      and c.params is self.params
      and c.packed_decode == self.packed_decode
    ):
      return c.graph, c.view_params
    if self.packed_decode is False:
      why = "off (packed_decode=False)"
    elif self.shard is not None:
      why = "sharded"
    else:
      why = packing_applies(self.params, min_bytes=0 if self.packed_decode else kernels.MIN_MODEL_BYTES)
    if why:
      graph, params = self.static_graph, self.params
    else:
      graphdef, params = nnx.split(with_packed_weights(nnx.merge(self.graphdef, self.params)))
      graph = StaticGraph(graphdef)
    self._decode = _DecodeView(self.graphdef, self.params, self.packed_decode, graph, params, why)
    return graph, params

  def sharing_weights(self, *, config: ModelConfig | None = None, tokenizer: Any = KEEP) -> "LanguageModel":
    """The same weights under another config (e.g. no EOS ids) or tokenizer (None: none), sharing this model's
    decode view: the packed copies are made once per params object, not once per `LanguageModel` (each holds as
    many bytes as the matmul weights). The config must describe the same architecture; only token ids and the like
    may differ."""
    lm = LanguageModel(
      config or self.config,
      self.graphdef,
      self.params,
      self.tokenizer if tokenizer is KEEP else tokenizer,
      shard=self.shard,
      dtype=self.dtype,
    )
    lm.packed_decode = self.packed_decode
    self.decode_view()
    lm._decode = self._decode  # checked by graphdef, params and packed_decode identity on each use: valid for both
    return lm

  @property
  def decode_kernel(self) -> str:
    """Which matmuls the decode path runs: 'packed (CPU kernels)' or 'XLA dots (<why not packed>)'."""
    self.decode_view()
    why = self._decode.why_not
    return "packed (CPU kernels)" if not why else f"XLA dots ({why})"

  @classmethod
  def random(cls, config: ModelConfig, *, seed: int = 0, dtype="float32", tokenizer=None) -> "LanguageModel":
    """A randomly initialised model (for training from scratch and tests)."""
    dt = resolve_dtype(dtype)
    graphdef, params = nnx.split(
      Decoder(config, dtype=dt, rngs=nnx.Rngs(check_seed(seed, "LanguageModel.random seed")))
    )
    return cls(config, graphdef, params, tokenizer, dtype=dt)

  def module(self) -> Decoder:
    return nnx.merge(self.graphdef, self.params)

  # ------------------------------------------------------------------------------------------ forward

  def forward(
    self, input_ids, attention_mask=None, *, capture: CaptureSpec = CaptureSpec(), position_ids=None
  ) -> ForwardOutput:
    """Full forward of [B, T] tokens. Positions default to HF generate's cumsum(mask) - 1 (padding-invariant)."""
    if input_ids.ndim != 2 if hasattr(input_ids, "ndim") else np.ndim(input_ids) != 2:
      raise ConfigError(f"input_ids must be [batch, seq], got shape {np.shape(input_ids)}")
    if not isinstance(input_ids, jax.Array):  # host ids are checked where they are; device ids were made by us
      self.check_ids(input_ids)
    input_ids = jnp.asarray(input_ids, jnp.int32)
    self._check_length(input_ids.shape[1])
    mask = jnp.ones_like(input_ids) if attention_mask is None else jnp.asarray(attention_mask, jnp.int32)
    if mask.shape != input_ids.shape:
      raise ConfigError(f"attention_mask shape {mask.shape} differs from input_ids shape {input_ids.shape}")
    pos = positions_from_mask(mask) if position_ids is None else jnp.asarray(position_ids, jnp.int32)
    with shape_errors("position_ids: one per input id"):
      chex.assert_equal_shape([pos, input_ids])
    capture.resolve_layers(self.config.num_layers)
    out = _forward(self.static_graph, self.params, input_ids, mask, pos, capture=capture, shard=self.shard)
    return ForwardOutput(
      logits=out["logits"],
      hidden_states=out["hidden_states"],
      attn_window=out.get("attn_window"),
      top_probs=out.get("top_probs"),
      token_logprobs=out.get("token_logprobs"),
      token_entropy=out.get("token_entropy"),
      token_self_certainty=out.get("token_self_certainty"),
    )

  def _check_length(self, n: int):
    if n > self.config.max_position_embeddings:
      raise CacheFullError(
        f"sequence of {n} tokens exceeds the model's max_position_embeddings={self.config.max_position_embeddings}"
      )

  def check_ids(self, ids, what: str = "input_ids"):
    """ConfigError naming the first token id outside the vocabulary, where it is (`what[row, position]` of a [B, T]
    array, `what[row][position]` of ragged rows such as prompts, `what[position]` of one sequence) and the vocabulary
    size. Checked on the host copy (no device round trip)."""
    ragged = isinstance(ids, (list, tuple)) and any(isinstance(r, (list, tuple, np.ndarray)) for r in ids)
    for r, row in enumerate(ids if ragged else [ids]):
      arr = np.asarray(row)
      if arr.size == 0:
        continue
      bad = (arr < 0) | (arr >= self.config.vocab_size)
      if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        index = ", ".join(map(str, at))
        where = f"{what}[{r}][{index}]" if ragged else f"{what}[{index}]"
        raise ConfigError(f"{where}: token id {arr[at]} is outside the vocabulary [0, {self.config.vocab_size})")

  # ------------------------------------------------------------------------------------------ caches

  def new_cache(self, batch: int, size: int) -> KVCache:
    self._check_length(size)
    return KVCache.zeros(self.config, batch, size, self.dtype)

  def extend(
    self, cache: KVCache, input_ids, attention_mask=None, *, capture: CaptureSpec = CaptureSpec()
  ) -> tuple[Float[Array, "b t v"], dict, KVCache]:
    """Appends left-padded tokens [B, T] to each row of `cache` (donated), each row at its own next slot.
    Returns (logits [B, T, V], captured, cache). A boundary API: it reads the cache's fill level back to refuse an
    overflow (the sampler's jitted operations finish such rows as 'cache_full' instead)."""
    if not isinstance(input_ids, jax.Array):
      input_ids = np.asarray(input_ids, np.int32)
    mask = np.ones(np.shape(input_ids), np.int32) if attention_mask is None else np.asarray(attention_mask, np.int32)
    with shape_errors(f"extend: input_ids and attention_mask must be one [B, T] with B = the cache's {cache.batch}"):
      chex.assert_rank(mask, 2)
      chex.assert_shape([input_ids, mask], (cache.batch, None))
      chex.assert_equal_shape([input_ids, mask])
    held = to_host(cache.index)
    need = held + mask.sum(axis=1)
    if np.any(need > cache.size):
      r = int(np.argmax(need))
      raise CacheFullError(
        f"cache of {cache.size} slots holds {int(held[r])}; cannot append {int(need[r] - held[r])} more (row {r})"
      )
    return sampling.extend(
      *self.decode_view(),
      cache,
      jnp.asarray(input_ids, jnp.int32),
      jnp.asarray(mask),
      capture=capture,
      shard=self.shard,
    )

  # ------------------------------------------------------------------------------------------ generate

  def encode(self, prompts: Sequence[str] | Sequence[Sequence[int]]) -> list[list[int]]:
    """Prompts as token-id lists: a list of texts or of id lists (a bare string is refused, not split into
    characters; ids must be integers inside the vocabulary)."""
    if isinstance(prompts, (str, bytes)):
      raise ConfigError("prompts must be a list of texts or of token-id lists, got a bare string; wrap it: [text]")
    prompts = list(prompts)
    if not prompts:
      raise ConfigError("generate: no prompts given")
    out = []
    for j, p in enumerate(prompts):
      if isinstance(p, str):
        if self.tokenizer is None:
          raise ConfigError("text prompts need a tokenizer; pass token ids instead")
        out.append(list(self.tokenizer(p)["input_ids"]))
      else:
        ids = np.asarray(p)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
          raise ConfigError(f"prompt {j} must be a text or a flat list of integer token ids, got {p!r:.80}")
        out.append([int(t) for t in ids])
    return out

  def stop_token_mask(self, stop_strings: Sequence[str]) -> np.ndarray:
    """[V] bool: tokens whose decoded text ends with one of the delimiters (resolved once per set)."""
    key = tuple(sorted(stop_strings))
    if key not in self._stop_cache:
      mask = np.zeros(self.config.vocab_size, bool)
      if key:
        if self.tokenizer is None:
          raise ConfigError("stop_strings need a tokenizer")
        n = min(len(self.tokenizer), self.config.vocab_size)
        texts = self.tokenizer.batch_decode([[i] for i in range(n)])
        for i, t in enumerate(texts):
          mask[i] = any(t.endswith(s) for s in key)
      self._stop_cache[key] = mask
    return self._stop_cache[key]

  def eos_mask(self) -> np.ndarray:
    mask = np.zeros(self.config.vocab_size, bool)
    ids = set(self.config.eos_token_ids)
    if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
      ids.add(self.tokenizer.eos_token_id)
    for i in ids:
      if 0 <= i < self.config.vocab_size:
        mask[i] = True
    return mask

  def pad_id(self) -> int:
    for cand in (self.config.pad_token_id, getattr(self.tokenizer, "pad_token_id", None), *self.config.eos_token_ids):
      if cand is not None:
        return int(cand)
    return 0

  def sampler(
    self,
    sampling_params: sampling.SamplingParams = sampling.SamplingParams(),
    *,
    capture: CaptureSpec = CaptureSpec(),
    stop=None,
  ) -> Sampler:
    """The open sampler (prefill, decode to a boundary, force, take, resume, read). `stop`: a compiled stop table
    (anything with `advance(state [B], tok [B]) -> (state, ends [B])`: a StopRule, or a step boundary compiled for
    this model's tokenizer, e.g. `StepBoundary("line").compile(lm.tokenizer, lm.config.vocab_size)` from
    `reprobe_jax.steps`: the exact step ends of docs/method.md §A1), or stop strings (a token whose own text ends
    with one of them ends a step)."""
    if stop is not None and not hasattr(stop, "advance"):
      if hasattr(stop, "compile"):  # a step boundary: the model layer runs tables, it does not build them
        raise ConfigError(
          f"stop={stop!r} is a step boundary, not a compiled stop table; pass "
          "stop=boundary.compile(lm.tokenizer, lm.config.vocab_size)"
        )
      stop = StopRule.from_mask(self.stop_token_mask(_strings("stop_strings", stop)))
    return Sampler(self, sampling_params, capture, stop)

  def generate(
    self,
    prompts,
    sampling_params: sampling.SamplingParams = sampling.SamplingParams(),
    *,
    max_new_tokens: int,
    stop_strings: Sequence[str] = (),
    seed: int = 0,
    n: int = 1,
    capture: CaptureSpec = CaptureSpec(),
    stop=None,
  ) -> Generation:
    """Samples `n` continuations of each prompt (text or token ids), prefilling each prompt once (its n rows read
    its cache as a shared prefix).

    Prompts are left-padded to a power-of-two bucket and the batch to a power of two, so a new prompt in the same
    bucket compiles nothing. Stops per row on EOS, on a token whose text ends with a stop string (or on `stop`, a
    compiled stop table as `sampler` takes it), or at `max_new_tokens`.
    """
    smp = self.sampler(sampling_params, capture=capture, stop=stop if stop is not None else (stop_strings or None))
    ids = self.encode(prompts)
    state = smp.decode(smp.prefill(ids, max_new_tokens=max_new_tokens, n=n, seed=seed))
    r = len(ids) * n
    host = to_host(
      {
        "tokens": state.tokens,
        "logprobs": state.logprobs,
        "lengths": state.lengths,
        "finish": state.finish,
        "features": state.features,
      }
    )  # rows may span other processes
    tokens = host["tokens"][:r, :max_new_tokens]
    lengths = host["lengths"][:r]
    tokens = np.where(np.arange(tokens.shape[1])[None] < lengths[:, None], tokens, self.pad_id())
    finish = [decode_state.FINISH_NAMES[int(c)] for c in host["finish"][:r]]
    texts = (
      [self.tokenizer.decode(tokens[i, : lengths[i]]) for i in range(r)] if self.tokenizer is not None else [""] * r
    )
    feats = jax.tree.map(lambda v: v[:r, :max_new_tokens], host["features"])
    return Generation(
      tokens=tokens,
      logprobs=host["logprobs"][:r, :max_new_tokens],
      lengths=lengths,
      finish_reason=finish,
      prompt_index=np.repeat(np.arange(len(ids)), n),
      prompt_ids=ids,
      texts=texts,
      features=feats,
    )

  # ------------------------------------------------------------------------------------------ export

  def save_pretrained(self, directory: str, *, dtype: str = "float32") -> None:
    """config.json + model.safetensors (+ tokenizer files) that PyTorch `transformers` loads; written into a
    temporary folder, then moved into place, so a crash leaves nothing half-written."""
    np_dtype = {"float32": np.float32, "bfloat16": jnp.bfloat16, "float16": np.float16}[dtype]
    with atomic_folder(directory) as tmp:
      cfg = self.config.to_hf_dict()
      cfg["torch_dtype"] = dtype
      with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
      write_safetensors(
        os.path.join(tmp, "model.safetensors"),
        export_tensors(self.config, self.params, np.dtype(np_dtype)),
        {"format": "pt"},
      )
      gen = {
        "bos_token_id": self.config.bos_token_id,
        "eos_token_id": cfg["eos_token_id"],
        "pad_token_id": self.config.pad_token_id,
      }
      with open(os.path.join(tmp, "generation_config.json"), "w") as f:
        json.dump({k: v for k, v in gen.items() if v is not None}, f, indent=2)
      if self.tokenizer is not None:
        self.tokenizer.save_pretrained(tmp)
