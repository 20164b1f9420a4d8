"""The decode-path compiler options against XLA's defaults, in one process: `python -m bench.xla_options`.

Greedy `generate` (EOS off, so every row decodes its budget) through the decode entries (`decoding.prefill`,
`decoding.decode`, compiled with `reprobe_jax.models.xla_options.DECODE_COMPILER_OPTIONS`) and through their
`*_in_jit` twins (the same functions under XLA's defaults), interleaved round by round so drifts in the machine's
speed hit both alike. Per batch: the fastest total of each and the per-token step time (fastest runs at two
budgets, as the bench's decode rows), and whether both gave the same greedy tokens. Prints a table with the
machine line.
"""

import argparse
import os
import time

import numpy as np


def compare(lm, prompts: np.ndarray, n_new: int, rounds: int) -> dict:
  """{'options'|'defaults': {'total_s', 'step_s'}, 'same_tokens'} for one batch of prompts [B, P]."""
  from reprobe_jax.models import decoding
  from reprobe_jax.models.sampling import SamplingParams

  sides = {
    "options": (decoding.prefill, decoding.decode),
    "defaults": (decoding.prefill_in_jit, decoding.decode_in_jit),
  }
  short = n_new // 2 + 1
  greedy = SamplingParams(temperature=0)
  lists = prompts.tolist()
  best, tokens = {}, {}
  saved = decoding.prefill, decoding.decode
  try:
    for r in range(rounds + 1):  # round 0 compiles and warms up
      for name, (pre, dec) in sides.items():
        decoding.prefill, decoding.decode = pre, dec
        for n in (short, n_new):
          t0 = time.perf_counter()
          gen = lm.generate(lists, greedy, max_new_tokens=n)
          t = time.perf_counter() - t0
          if r:
            best[(name, n)] = min(best.get((name, n), float("inf")), t)
          if n == n_new:
            tokens[name] = np.asarray(gen.tokens)
  finally:
    decoding.prefill, decoding.decode = saved
  out = {
    name: {"total_s": best[(name, n_new)], "step_s": (best[(name, n_new)] - best[(name, short)]) / (n_new - short)}
    for name in sides
  }
  out["same_tokens"] = bool(np.array_equal(tokens["options"], tokens["defaults"]))
  return out


def main(argv=None) -> None:
  from bench.cases import _without_eos
  from bench.pair import load_pair, token_stream, windows
  from bench.report import machine_line
  from bench.timing import threads
  from reprobe_jax.eval.machine import describe
  from reprobe_jax.models.xla_options import DECODE_COMPILER_OPTIONS

  p = argparse.ArgumentParser(prog="python -m bench.xla_options", description=__doc__.splitlines()[0])
  p.add_argument("--model", default="smollm2", help="smollm2, tiny, or a HF directory / .gguf (as bench.run)")
  p.add_argument("--batches", default="1,8,32")
  p.add_argument("--prompt-len", type=int, default=64)
  p.add_argument("--new-tokens", type=int, default=32)
  p.add_argument("--rounds", type=int, default=3, help="timed rounds per side (after one warm-up round)")
  args = p.parse_args(argv)
  try:
    batches = [int(v) for v in args.batches.split(",")]
  except ValueError:
    batches = []
  if not batches or min(batches) < 1:
    raise SystemExit(f"--batches must list positive batch sizes, got {args.batches!r}")
  if args.new_tokens < 3 or args.prompt_len < 1 or args.rounds < 1:
    raise SystemExit("--new-tokens must be >= 3, --prompt-len and --rounds >= 1")
  if not DECODE_COMPILER_OPTIONS:
    raise SystemExit("the decode compiler options are off here (another jaxlib line, or REPROBE_JAX_XLA_DEFAULTS=1)")
  load = list(os.getloadavg())
  pair = load_pair(args.model)
  try:
    lm = _without_eos(pair.lm)
    stream = token_stream(pair, max(batches) * args.prompt_len)
    lines = [
      "| batch | step, options (ms) | step, XLA defaults (ms) | step ratio | total, options (s) | "
      "total, defaults (s) | same greedy tokens |",
      "|---|---|---|---|---|---|---|",
    ]
    for b in batches:
      r = compare(lm, windows(stream, b, args.prompt_len), args.new_tokens, args.rounds)
      o, d = r["options"], r["defaults"]
      ratio = f"{d['step_s'] / o['step_s']:.2f}x" if o["step_s"] > 0 and d["step_s"] > 0 else "n/a (noise)"
      lines.append(
        f"| {b} | {o['step_s'] * 1e3:.1f} | {d['step_s'] * 1e3:.1f} | {ratio} | {o['total_s']:.2f} | "
        f"{d['total_s']:.2f} | {r['same_tokens']} |"
      )
      print(lines[-1], flush=True)
  finally:
    pair.close()
  env = {
    "machine_detail": describe().long(),
    "threads": threads(),
    "load_start": load,
    "load_end": list(os.getloadavg()),
  }
  print("\n".join([machine_line(env), f"options {DECODE_COMPILER_OPTIONS}", ""] + lines))


if __name__ == "__main__":
  main()
