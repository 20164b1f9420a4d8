"""The decoder's projection GEMMs alone, in JAX and in PyTorch: `python -m bench.chain --m=1,8,32,1024`.

A chain of 30 layers with SmolLM2-135M's projection shapes (q, k, v, o, gate, up, down; distinct weights per
layer, so none stays hot in cache), the jitted side as a `fori_loop` of 8 passes like the decode loop, the
torch side in inference mode, 2 threads each. After every layer the activations are rescaled by their max: a
chain that only halves them (an earlier version) reaches denormals within 30 layers, which slowed PyTorch 3-10x
and measured nothing about GEMMs. Prints ms per pass and GFLOP/s, best of `--repeats`, with the machine line.
`--dtype=bfloat16` stores weights and activations in bfloat16 on both sides (the bytes a bf16 decode would stream;
on CPUs with AVX512-BF16 or AMX both libraries have bf16 kernels), so the two dtypes can be compared in one run.
`--split-k` adds a JAX column where every GEMM is a batched dot over the two halves of its K (`[2, M, K/2] x
[2, K/2, N]`, a free reshape of the stored [K, N] weight, summed): at M = 1 XLA:CPU's dots mostly run on one
thread, and a batch of two gives its runtime two pieces to spread over the cores (docs/performance.md, AMD EPYC Zen 5).
`--packed` adds a JAX column where every GEMM runs reprobe-jax's CPU decode kernel on weights packed beforehand
(docs/kernels.md; float32, at most 128 rows).
"""

import argparse

import numpy as np

from bench.timing import best_time, threads

LAYERS, D, F, KV = 30, 576, 1536, 192
SHAPES = {"q": (D, D), "k": (D, KV), "v": (D, KV), "o": (D, D), "g": (D, F), "u": (D, F), "d": (F, D)}
PASSES = 8


def weights(seed: int = 0):
  rng = np.random.default_rng(seed)
  return [{n: (rng.standard_normal(s, dtype=np.float32) * 0.02) for n, s in SHAPES.items()} for _ in range(LAYERS)]


def _matmul(x, w):
  return x @ w


def split_k_matmul(x, w):
  """x @ w as a batched dot over the two halves of K (a free reshape of w), summed; K odd: a plain dot."""
  import jax.numpy as jnp

  k, n = w.shape
  if k % 2:
    return x @ w
  halves = x.reshape(x.shape[0], 2, k // 2).transpose(1, 0, 2)  # [2, M, K/2]
  return jnp.einsum("smk,skn->smn", halves, w.reshape(2, k // 2, n)).sum(0)


def packed_matmul(x, wp):
  """x @ w through reprobe-jax's CPU decode kernel, w packed (`reprobe_jax.kernels.pack`; N a multiple of 32)."""
  from reprobe_jax import kernels

  return kernels.packed_matmul(x, wp, wp.shape[0] * kernels.PANEL)


def layer(x, w, tile, silu, mm=_matmul):
  q, k, v = mm(x, w["q"]), mm(x, w["k"]), mm(x, w["v"])
  h = x + mm(q + tile(k + v), w["o"])
  return h + mm(silu(mm(h, w["g"])) * mm(h, w["u"]), w["d"])


DTYPES = ("float32", "bfloat16")


def time_jax(ws, m: int, repeats: int, dtype: str = "float32", split_k: bool = False, packed: bool = False) -> float:
  import jax
  import jax.numpy as jnp
  from reprobe_jax import kernels

  wj = jax.tree.map(lambda a: jnp.asarray(a, dtype), ws)
  if packed:
    wj = jax.tree.map(kernels.pack, wj)
  mm = packed_matmul if packed else split_k_matmul if split_k else _matmul
  x0 = jnp.asarray(np.random.default_rng(1).standard_normal((m, D), dtype=np.float32), dtype)

  @jax.jit
  def run(x, wj):
    def one(_, x):
      for w in wj:
        x = layer(x, w, lambda a: jnp.tile(a, (1, 3)), jax.nn.silu, mm)
        x = x / (jnp.max(jnp.abs(x)) + 1e-3)
      return x

    return jax.lax.fori_loop(0, PASSES, one, x)

  return best_time(lambda: run(x0, wj).block_until_ready(), repeats) / PASSES


def time_torch(ws, m: int, repeats: int, threads: int, dtype: str = "float32") -> float:
  import torch

  torch.set_num_threads(threads)
  td = getattr(torch, dtype)
  wt = [{n: torch.from_numpy(a).to(td) for n, a in w.items()} for w in ws]
  x0 = torch.from_numpy(np.random.default_rng(1).standard_normal((m, D), dtype=np.float32)).to(td)

  @torch.inference_mode()
  def run(x):
    for _ in range(PASSES):
      for w in wt:
        x = layer(x, w, lambda a: a.repeat(1, 3), torch.nn.functional.silu)
        x = x / (x.abs().amax() + 1e-3)
    return x

  return best_time(lambda: run(x0), repeats) / PASSES


def main(argv=None) -> None:
  import os
  from bench.report import machine_line
  from reprobe_jax.eval.machine import describe

  p = argparse.ArgumentParser(prog="python -m bench.chain", description=__doc__.splitlines()[0])
  p.add_argument("--m", default="1,8,32,1024", help="rows per GEMM (the decode batch; prefill tokens)")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--threads", type=int, default=2)
  p.add_argument("--dtype", default="float32", help="weights and activations: float32 or bfloat16 (both sides)")
  p.add_argument("--split-k", action="store_true", help="also time JAX with every GEMM split over K as a batch of 2")
  p.add_argument(
    "--packed",
    action="store_true",
    help="also time JAX with every GEMM through the CPU decode kernel on packed weights (float32)",
  )
  args = p.parse_args(argv)
  if args.dtype not in DTYPES:
    raise SystemExit(f"--dtype must be one of {', '.join(DTYPES)}, got {args.dtype!r}")
  if args.packed:
    from reprobe_jax import kernels

    if args.dtype != "float32":
      raise SystemExit("--packed runs the float32 kernel: drop --dtype")
    if not kernels.available():
      raise SystemExit(f"--packed: the CPU decode kernel is unavailable here ({kernels.unavailable_reason()})")
  try:
    ms = [int(v) for v in args.m.split(",")]
  except ValueError:
    ms = []
  if not ms or min(ms) < 1:
    raise SystemExit(f"--m must list positive row counts, got {args.m!r}")
  if args.packed and max(ms) > kernels.MAX_ROWS:
    raise SystemExit(f"--packed takes at most {kernels.MAX_ROWS} rows (--m), got {max(ms)}")
  ws = weights()
  flops_per_row = 2 * LAYERS * sum(a * b for a, b in SHAPES.values())
  load = list(os.getloadavg())
  lines = []
  split = " JAX split-K ms | JAX / split-K time |" if args.split_k else ""
  split += " packed kernel ms | JAX / packed time |" if args.packed else ""
  lines.append(
    "| M | JAX ms | torch ms | JAX GFLOP/s | torch GFLOP/s | torch / JAX time |"
    + split
    + "\n"
    + "|"
    + "---|" * (6 + 2 * args.split_k + 2 * args.packed)
  )
  for m in ms:
    tj = time_jax(ws, m, args.repeats, args.dtype)
    tt = time_torch(ws, m, args.repeats, args.threads, args.dtype)
    row = (
      f"| {m} | {tj * 1e3:.1f} | {tt * 1e3:.1f} | {m * flops_per_row / tj / 1e9:.1f} | "
      f"{m * flops_per_row / tt / 1e9:.1f} | {tt / tj:.2f}x |"
    )
    if args.split_k:
      ts = time_jax(ws, m, args.repeats, args.dtype, split_k=True)
      row += f" {ts * 1e3:.1f} | {tj / ts:.2f}x |"
    if args.packed:
      tp = time_jax(ws, m, args.repeats, args.dtype, packed=True)
      row += f" {tp * 1e3:.1f} | {tj / tp:.2f}x |"
    lines.append(row)
  env = {
    "machine_detail": describe().long(),
    "threads": threads(),
    "load_start": load,
    "load_end": list(os.getloadavg()),
  }
  print("\n".join([machine_line(env), f"dtype {args.dtype}", ""] + lines))


if __name__ == "__main__":
  main()
