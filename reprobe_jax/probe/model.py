"""The ReProbe step verifier (docs/method.md §A4): a small post-LN transformer over a frozen LM's per-token features.

Per trajectory the token projection runs once; every step is then scored in the same batched call: the encoder
sees the tokens [0, step end) with a learned marker on the step's own tokens, and the classifier reads the masked
mean over the step's tokens. Output: P(step incorrect).

The module holds parameters only: dropout keeps no RNG stream of its own and draws from the `rngs` a training step
passes in. So `nnx.split(probe)` is (graphdef, params), the graphdef depends on the config alone, and every probe of
one config shares the compiled code of `score_steps`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from flax import nnx

from reprobe_jax.fields import Int, Real, check_fields, field_name
from reprobe_jax.errors import ConfigError
from reprobe_jax.models.forward import StaticGraph
from reprobe_jax.models.sharding import ShardingCtx, constrain_rows

if TYPE_CHECKING:
  from reprobe_jax.probe.data import PackedSteps

_XAVIER = nnx.initializers.xavier_uniform()
_ZEROS = nnx.initializers.zeros_init()


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
  """Static probe shape. Defaults are the paper's (docs/method.md §A4): d=512, 1 layer, 16 heads, dropout 0.1."""

  feature_dim: int
  d_model: int = 512
  n_layers: int = 1
  n_heads: int = 16
  ff_dim: int = 2048
  dropout: float = 0.1

  def __post_init__(self):
    check_fields(
      self,
      {
        "feature_dim": Int(1),
        "d_model": Int(1),
        "n_layers": Int(1),
        "n_heads": Int(1),
        "ff_dim": Int(1),
        "dropout": Real(0.0, 1.0, high_open=True),
      },
    )
    if self.d_model % self.n_heads:
      raise ConfigError(
        f"{field_name(self, 'n_heads')}: expected a divisor of d_model={self.d_model}, got {self.n_heads}"
      )


def _linear(din, dout, rngs):
  return nnx.Linear(din, dout, kernel_init=_XAVIER, bias_init=_ZEROS, rngs=rngs)


class EncoderLayer(nnx.Module):
  """PyTorch `nn.TransformerEncoderLayer(norm_first=False, activation='gelu')`: post-LN attention and FFN."""

  def __init__(self, cfg: ProbeConfig, rngs: nnx.Rngs):
    d = cfg.d_model
    self.attn = nnx.MultiHeadAttention(
      num_heads=cfg.n_heads,
      in_features=d,
      qkv_features=d,
      out_features=d,
      kernel_init=_XAVIER,
      bias_init=_ZEROS,
      dropout_rate=cfg.dropout,
      decode=False,
      keep_rngs=False,
      rngs=rngs,
    )
    self.norm1 = nnx.LayerNorm(d, epsilon=1e-5, rngs=rngs)
    self.ff1 = _linear(d, cfg.ff_dim, rngs)
    self.ff2 = _linear(cfg.ff_dim, d, rngs)
    self.norm2 = nnx.LayerNorm(d, epsilon=1e-5, rngs=rngs)
    self.drop = nnx.Dropout(cfg.dropout)

  def __call__(self, x, mask, *, deterministic: bool, rngs: nnx.Rngs | None = None):
    """x [N, T, d]; mask [N, 1, T, T] bool (True = may attend)."""
    a = self.attn(x, mask=mask, deterministic=deterministic, rngs=rngs)
    x = self.norm1(x + self.drop(a, deterministic=deterministic, rngs=rngs))
    h = self.ff2(self.drop(jax.nn.gelu(self.ff1(x), approximate=False), deterministic=deterministic, rngs=rngs))
    return self.norm2(x + self.drop(h, deterministic=deterministic, rngs=rngs))


class Probe(nnx.Module):
  def __init__(self, cfg: ProbeConfig, *, rngs: nnx.Rngs):
    d = cfg.d_model
    self.config = cfg
    self.proj1 = _linear(cfg.feature_dim, 2 * d, rngs)
    self.proj_norm1 = nnx.LayerNorm(2 * d, epsilon=1e-5, rngs=rngs)
    self.proj2 = _linear(2 * d, d, rngs)
    self.proj_norm2 = nnx.LayerNorm(d, epsilon=1e-5, rngs=rngs)
    self.marker = nnx.Embed(2, d, embedding_init=_XAVIER, rngs=rngs)
    self.layers = nnx.List([EncoderLayer(cfg, rngs) for _ in range(cfg.n_layers)])
    self.cls1 = _linear(d, d, rngs)
    self.cls_norm = nnx.LayerNorm(d, epsilon=1e-5, rngs=rngs)
    self.cls2 = _linear(d, 1, rngs)
    self.drop = nnx.Dropout(cfg.dropout)

  def project(self, features, *, deterministic: bool, rngs: nnx.Rngs | None = None):
    """features [B, T, F] -> [B, T, d] (step 1 of A4, once per trajectory)."""
    h = jax.nn.gelu(self.proj_norm1(self.proj1(features)), approximate=False)
    h = self.drop(h, deterministic=deterministic, rngs=rngs)
    return jax.nn.gelu(self.proj_norm2(self.proj2(h)), approximate=False)

  def __call__(self, features, token_mask, spans, *, deterministic: bool = True, rngs: nnx.Rngs | None = None):
    """Logits of P(incorrect) for every step: features [B, T, F], token_mask [B, T] (valid, non-padding tokens),
    spans [B, S, 2] half-open [start, end) token spans (end <= start marks a padding step). Returns [B, S].
    With deterministic=False dropout draws from `rngs`, which must then be given."""
    b, t, _ = features.shape
    s = spans.shape[1]
    h = self.project(features, deterministic=deterministic, rngs=rngs)  # [B, T, d]
    pos = jnp.arange(t)
    start, end = spans[..., 0:1], spans[..., 1:2]  # [B, S, 1]
    in_step = (pos >= start) & (pos < end) & token_mask[:, None, :]  # [B, S, T]
    visible = (pos < end) & token_mask[:, None, :]  # [B, S, T]: the window [0, step end)
    x = h[:, None] + self.marker(in_step.astype(jnp.int32))  # [B, S, T, d]
    x = x.reshape(b * s, t, -1)
    vis = visible.reshape(b * s, t)
    attn_mask = (vis[:, None, :, None] & vis[:, None, None, :]) | jnp.eye(t, dtype=bool)[None, None]
    for layer in self.layers:
      x = layer(x, attn_mask, deterministic=deterministic, rngs=rngs)
    w = in_step.reshape(b * s, t, 1).astype(x.dtype)
    pooled = jnp.sum(x * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1.0)  # [B*S, d]
    return self.classify(pooled, deterministic=deterministic, rngs=rngs).reshape(b, s)

  def classify(self, pooled, *, deterministic: bool, rngs: nnx.Rngs | None = None):
    """Pooled step vectors [..., d] -> logits [...] (step 5 of A4)."""
    z = jax.nn.gelu(self.cls_norm(self.cls1(pooled)), approximate=False)
    return self.cls2(self.drop(z, deterministic=deterministic, rngs=rngs))[..., 0]

  def packed(
    self,
    features,
    pack: "PackedSteps",
    *,
    deterministic: bool = True,
    rngs: nnx.Rngs | None = None,
    shard: ShardingCtx | None = None,
  ):
    """Logits [P] of the packed steps of `pack` (`reprobe_jax.probe.data.pack_steps`): the same function as
    `__call__`, computed over each step's window [0, step end) only. Windows sit side by side in rows of L slots
    and attend within themselves (block-diagonal masks), so no compute goes to padding steps or to the tokens past
    a step's end. features [B, T, F]; padding steps (step -1 in every slot) give arbitrary logits. shard: data
    parallel over a mesh (docs/scale.md): trajectories, packed rows and steps on its data axis."""
    features, pack = constrain_rows((features, pack), shard)
    h = self.project(features, deterministic=deterministic, rngs=rngs)  # [B, T, d]
    total, count = self.pooled(h, pack, deterministic=deterministic, rngs=rngs, shard=shard)
    return constrain_rows(self.classify(total / jnp.maximum(count, 1.0), deterministic=deterministic, rngs=rngs), shard)

  def pooled(
    self,
    h,
    pack: "PackedSteps",
    *,
    deterministic: bool = True,
    rngs: nnx.Rngs | None = None,
    shard: ShardingCtx | None = None,
  ):
    """(sums [P, d], counts [P, 1]) of the encoder's outputs over each packed step's own tokens: `packed` between the
    projection (h [B, T, d], `project`) and the classifier. A step whose window is not in `pack` sums to 0."""
    seg = pack.segment  # [R, L] int32: the packed step whose window holds the slot, -1 = empty
    filled = seg >= 0
    x = constrain_rows(h[pack.row, pack.token] * filled[..., None], shard)  # [R, L, d]
    x = x + self.marker(pack.in_step.astype(jnp.int32))
    r, l = seg.shape
    same = (seg[:, :, None] == seg[:, None, :]) & filled[:, :, None]  # [R, L, L]
    attn_mask = (same | jnp.eye(l, dtype=bool)[None])[:, None]  # [R, 1, L, L]
    for layer in self.layers:
      x = layer(x, attn_mask, deterministic=deterministic, rngs=rngs)
    p = pack.num_steps
    ids = jnp.where(pack.in_step & filled, seg, p).reshape(-1)  # a slot outside every step pools into bin P
    total = jax.ops.segment_sum(x.reshape(r * l, -1), ids, num_segments=p + 1)[:p]  # [P, d]
    count = jax.ops.segment_sum(jnp.ones((r * l, 1), x.dtype), ids, num_segments=p + 1)[:p]
    return total, count


def count_params(module: nnx.Module) -> int:
  return sum(x.size for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


@functools.lru_cache(maxsize=None)
def abstract_probe(cfg: ProbeConfig) -> tuple[StaticGraph, nnx.State]:
  """(graph, abstract params) of every probe of this config, built without allocating weights; the graphdef is
  wrapped for jit once, so all probes of one config share compiled code. Treat the state as read-only."""
  graphdef, state = nnx.split(nnx.eval_shape(lambda: Probe(cfg, rngs=nnx.Rngs(0))))
  return StaticGraph(graphdef), state


@functools.partial(jax.jit, static_argnames=("graph",))
def _probabilities(graph: StaticGraph, state, features, token_mask, spans):
  probe = nnx.merge(graph.value, *state)
  return jax.nn.sigmoid(probe(features, token_mask, spans, deterministic=True))


def jit_operands(graphdef, params) -> tuple[StaticGraph, tuple]:
  """(graph, state) as the probe's jitted scorers take them: the graphdef hashed once (`StaticGraph`), params (one
  state or a tuple of them, e.g. (params, rest)) as a tuple without empty parts (an empty `rest` would only split
  the compile cache)."""
  graph = graphdef if isinstance(graphdef, StaticGraph) else StaticGraph(graphdef)
  state = tuple(params) if isinstance(params, (tuple, list)) else (params,)
  return graph, tuple(x for x in state if jax.tree.leaves(x))


@functools.partial(jax.jit, static_argnames=("graph", "shard"))
def _packed_probabilities(graph: StaticGraph, state, features, pack, shard=None):
  probe = nnx.merge(graph.value, *state)
  return jax.nn.sigmoid(probe.packed(features, pack, deterministic=True, shard=shard))


def score_packed(graphdef, params, features, pack: "PackedSteps", shard: ShardingCtx | None = None):
  """P(step incorrect) [P] of the packed steps of a batch (`reprobe_jax.probe.data.pack_steps`): the same values
  as `score_steps`, with compute only on each step's window [0, step end). Compiles once per (config, B, T, R, L,
  P); params as for `score_steps`. shard: data parallel over its mesh (`Probe.packed`), default one device."""
  graph, state = jit_operands(graphdef, params)
  if shard is None:
    return _packed_probabilities(graph, state, features, pack)
  return _packed_probabilities(graph, state, features, pack, shard=shard)


def score_steps(graphdef, params, features, token_mask, spans):
  """P(step incorrect) [B, S] for every step of a batch of trajectories in one jitted call (eval mode, docs/method.md
  §A4).

  The probe's only inference path: training validation, evaluation and the step scorer all come here, and it
  compiles once per (config, B, T, S). graphdef: a GraphDef or a StaticGraph (`abstract_probe`); params: the state
  `nnx.split` gave after it, or a tuple of its states (params, rest; a probe's rest is empty). features [B, T, F],
  token_mask [B, T], spans [B, S, 2].
  """
  graph, state = jit_operands(graphdef, params)
  b, t = token_mask.shape
  if features.shape[:2] != (b, t) or spans.shape[0] != b or spans.shape[-1] != 2 or spans.ndim != 3:
    raise ConfigError(
      f"score_steps: need features [B, T, F], token_mask [B, T], spans [B, S, 2]; got "
      f"{features.shape}, {token_mask.shape}, {spans.shape}"
    )
  return _probabilities(graph, state, features, token_mask, spans)
