"""Decode attention's two products alone, XLA's batched dots against the CPU decode kernels:
`python -m bench.attention --batches=8,32 --slots=96,512`.

30 layers of distinct KV caches shaped as SmolLM2-135M's (3 KV heads of 64, 3 query heads each, one new token per
row), so no cache stays hot; per layer scores = q . k, softmax, out = p . v, in a jitted loop of 4 passes, both
sides compiled with the decode path's compiler options. Prints ms per pass (30 layers) and the cache bytes read per
second, best of `--repeats`, with the machine line.
"""

import argparse
import os

import numpy as np

from bench.timing import best_time, threads

LAYERS, KV, GROUPS, HEAD = 30, 3, 3, 64
PASSES = 4


def attention_xla(q, k, v):
  import jax
  from reprobe_jax.kernels import attention

  p = jax.nn.softmax(attention.reference_qk(q, k), axis=-1)
  return attention.reference_pv(p, v)


def attention_kernel(q, k, v):
  import jax
  from reprobe_jax.kernels import attention

  return attention.decode_pv(jax.nn.softmax(attention.decode_qk(q, k), axis=-1), v)


def time_side(fn, batch: int, slots: int, repeats: int) -> float:
  import jax
  import jax.numpy as jnp
  from reprobe_jax.models.xla_options import DECODE_COMPILER_OPTIONS

  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((batch * KV, GROUPS, HEAD), dtype=np.float32))
  ks = [jnp.asarray(rng.standard_normal((batch * KV, slots, HEAD), dtype=np.float32)) for _ in range(LAYERS)]
  vs = [jnp.asarray(rng.standard_normal((batch * KV, slots, HEAD), dtype=np.float32)) for _ in range(LAYERS)]

  def run(q, ks, vs):
    def one(_, a):
      for k, v in zip(ks, vs):
        a = a + fn(q + a * 1e-6, k, v)
      return a

    return jax.lax.fori_loop(0, PASSES, one, jnp.zeros_like(q))

  compiled = jax.jit(run).lower(q, ks, vs).compile(compiler_options=DECODE_COMPILER_OPTIONS or None)
  return best_time(lambda: compiled(q, ks, vs).block_until_ready(), repeats) / PASSES


def main(argv=None) -> None:
  from bench.report import machine_line
  from reprobe_jax.kernels import attention
  from reprobe_jax.eval.machine import describe

  p = argparse.ArgumentParser(prog="python -m bench.attention", description=__doc__.splitlines()[0])
  p.add_argument("--batches", default="8,32")
  p.add_argument("--slots", default="96,512", help="KV cache slots per row")
  p.add_argument("--repeats", type=int, default=5)
  args = p.parse_args(argv)
  try:
    batches, slots = [int(b) for b in args.batches.split(",")], [int(s) for s in args.slots.split(",")]
  except ValueError:
    batches = slots = []
  if not batches or not slots or min(batches + slots) < 1:
    raise SystemExit(f"--batches and --slots must list positive integers, got {args.batches!r}, {args.slots!r}")
  if not attention.available():
    raise SystemExit("the CPU decode kernels are unavailable here: nothing to compare")
  load = list(os.getloadavg())
  lines = [
    "| batch | cache slots | XLA ms | kernel ms | XLA / kernel time | XLA GB/s | kernel GB/s |",
    "|---|---|---|---|---|---|---|",
  ]
  for b in batches:
    for s in slots:
      cache = 2 * LAYERS * b * KV * s * HEAD * 4  # keys and values read once per pass
      tx, tk = time_side(attention_xla, b, s, args.repeats), time_side(attention_kernel, b, s, args.repeats)
      lines.append(
        f"| {b} | {s} | {tx * 1e3:.2f} | {tk * 1e3:.2f} | {tx / tk:.2f}x | {cache / tx / 1e9:.1f} | "
        f"{cache / tk / 1e9:.1f} |"
      )
      print(lines[-1], flush=True)
  env = {
    "machine_detail": describe().long(),
    "threads": threads(),
    "load_start": load,
    "load_end": list(os.getloadavg()),
  }
  print("\n".join([machine_line(env), ""] + lines))


if __name__ == "__main__":
  main()
