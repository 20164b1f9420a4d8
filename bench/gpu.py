"""The GPU check's own pieces (bench/gpu_check.sh runs the steps): the device's roofline and the summary.

    python -m bench.gpu roofline --out=DIR [--quick]   # bf16 and f32 matmul, device copy and read: roofline.json
    python -m bench.gpu summary DIR                    # DIR/steps.tsv and DIR/detail/ -> summary.md, summary.json

The roofline is measured on the device the other steps ran on (JAX's default backend, PyTorch's CUDA device when it
sees one): matmul throughput in bfloat16 and float32 on square products, each the best of several runs (a lower
bound on what the chip can do, `bench.timing.best_time`), and device memory bandwidth of a copy (bytes read + bytes
written) and of a read (a sum). Float32 runs at the process's JAX matmul precision, which the script sets to
'highest' (true float32 on both sides; JAX would otherwise use TF32 on a GPU and PyTorch would not), so the f32
figures bound the bench's f32 figures.

The summary holds every step with its status (ran, skipped with its reason, failed with its reason) and checks each
bench figure against its physical bound through `bench.report.bounded`: prefill FLOP rates and the RL update's
against the f32 matmul bound, batch-1 decode weight-read rates against the bandwidth bound. A figure above its bound
is a harness error (the bound or the work count is wrong), and fails the check.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from reprobe_jax.errors import ConfigError, ReprobeError

# Every step the script records, in its order; `summary` reports a step with no record as failed.
STEPS = ("setup", "parity_f32", "parity_bf16", "bench_smollm2", "bench_gemma3", "rl", "roofline")
STATUSES = ("ran", "skipped", "failed")
FULL = {"matmul_n": (4096, 8192), "copy_mib": 1024, "repeats": 5}
QUICK = {"matmul_n": (256,), "copy_mib": 64, "repeats": 2}


# ------------------------------------------------------------------------------------------------ roofline


def _torch_device():
  import torch

  return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def matmul_rates(sizes, repeats: int) -> list[dict]:
  """FLOP/s of an n^3 product for each n of `sizes`, in bfloat16 and float32, JAX and PyTorch on their devices."""
  import jax
  import jax.numpy as jnp
  import torch

  from bench.timing import best_time

  dev = _torch_device()
  jdot = jax.jit(jnp.dot)
  sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
  rows = []
  for n in sizes:
    for name, jdt, tdt in (("bfloat16", jnp.bfloat16, torch.bfloat16), ("float32", jnp.float32, torch.float32)):
      ka, kb = jax.random.split(jax.random.key(n))
      a, b = jax.random.normal(ka, (n, n), jdt), jax.random.normal(kb, (n, n), jdt)
      ta, tb = torch.randn(n, n, device=dev, dtype=tdt), torch.randn(n, n, device=dev, dtype=tdt)

      def tmm(ta=ta, tb=tb):
        torch.mm(ta, tb)
        sync()

      flops = 2.0 * n**3
      with torch.inference_mode():
        torch_rate = flops / best_time(tmm, repeats)
      jax_rate = flops / best_time(lambda a=a, b=b: jdot(a, b).block_until_ready(), repeats)
      rows.append({"n": n, "dtype": name, "jax_flops_per_s": jax_rate, "torch_flops_per_s": torch_rate})
      del a, b, ta, tb
  return rows


def bandwidth_rates(nbytes: int, repeats: int) -> dict:
  """Device memory bandwidth (bytes/s) over a float32 buffer of `nbytes`: copy (read + write; JAX's donated `v + 1`,
  PyTorch's `copy_`) and read (a sum), JAX and PyTorch on their devices."""
  import jax
  import jax.numpy as jnp
  import torch

  from bench.timing import best_time

  n = max(1024, nbytes // 4)
  size = 4.0 * n
  inc = jax.jit(lambda v: v + 1.0, donate_argnums=0)  # the output reuses the input's buffer: no allocation timed
  state = [jnp.ones((n,), jnp.float32)]

  def jcopy():
    state[0] = inc(state[0])
    state[0].block_until_ready()

  out = {"bytes": int(size), "copy": {}, "read": {}}
  out["copy"]["jax"] = 2 * size / best_time(jcopy, repeats)
  jsum = jax.jit(jnp.sum)
  out["read"]["jax"] = size / best_time(lambda: jsum(state[0]).block_until_ready(), repeats)
  state.clear()  # the buffer goes before PyTorch's two
  dev = _torch_device()
  sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
  src, dst = torch.ones(n, device=dev), torch.empty(n, device=dev)

  def tcopy():
    dst.copy_(src)
    sync()

  def tsum():
    src.sum()
    sync()

  with torch.inference_mode():
    out["copy"]["torch"] = 2 * size / best_time(tcopy, repeats)
    out["read"]["torch"] = size / best_time(tsum, repeats)
  return out


def roofline(quick: bool) -> dict:
  """The device's bounds: {'matmul': rows, 'bandwidth': ..., 'bf16_bound', 'f32_bound', 'bandwidth_bound' (each the
  max over what was measured) and what each came from, 'backend', 'device', 'precision'}."""
  import jax

  sizes = QUICK if quick else FULL
  rows = matmul_rates(sizes["matmul_n"], sizes["repeats"])
  bw = bandwidth_rates(sizes["copy_mib"] * 2**20, sizes["repeats"])
  out = {"matmul": rows, "bandwidth": bw, "quick": quick, "repeats": sizes["repeats"], "statistic": "best"}
  for dtype, key in (("bfloat16", "bf16"), ("float32", "f32")):
    figures = [
      (r[f"{fw}_flops_per_s"], f"{fw} {dtype} {r['n']}^3")
      for r in rows
      if r["dtype"] == dtype
      for fw in ("jax", "torch")
    ]
    out[f"{key}_bound"], out[f"{key}_bound_from"] = max(figures)
  kinds = [(v, f"{kind} ({fw})") for kind in ("copy", "read") for fw, v in bw[kind].items()]
  out["bandwidth_bound"], out["bandwidth_bound_from"] = max(kinds)
  out["backend"] = jax.default_backend()
  out["device"] = device_name()
  out["precision"] = str(jax.config.jax_default_matmul_precision or "default")
  return out


# ------------------------------------------------------------------------------------------------ summary


def device_name() -> str:
  """nvidia-smi's name of the GPU, else JAX's device kind (and this CPU's description on a CPU)."""
  try:
    names = subprocess.run(
      ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
      capture_output=True,
      text=True,
      timeout=20,
      check=False,
    )
    if names.returncode == 0 and names.stdout.strip():
      return names.stdout.strip().splitlines()[0]
  except (OSError, subprocess.SubprocessError):
    pass
  import jax

  kind = jax.devices()[0].device_kind
  if jax.default_backend() == "cpu":
    from reprobe_jax.eval.machine import describe

    return f"{kind}: {describe()}"
  return kind


def read_steps(path: str) -> dict[str, dict]:
  """steps.tsv (name, status, seconds, detail; one line per step, as the script writes it) by step name."""
  out = {}
  if not os.path.exists(path):
    return out
  with open(path) as f:
    for i, line in enumerate(f, 1):
      parts = line.rstrip("\n").split("\t")
      if len(parts) != 4 or parts[1] not in STATUSES:
        raise ConfigError(f"{path}:{i}: expected 'name<TAB>ran|skipped|failed<TAB>seconds<TAB>detail', got {line!r}")
      out[parts[0]] = {"status": parts[1], "seconds": float(parts[2] or 0), "detail": parts[3]}
  return out


def _load(path: str) -> dict | None:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def bound_checks(detail: str, roof: dict | None) -> list[dict]:
  """Every bench figure against its bound from `roof` (`roofline`): {'figure', 'measured', 'bound', 'fraction',
  'status' ('ok' or report.HARNESS_ERROR), 'error'?}. The bench's own in-run harness errors come through too."""
  from bench import report

  if roof is None:
    return []
  f32, bw = roof["f32_bound"], roof["bandwidth_bound"]
  checks = []

  def check(figure, measured, bound, bound_from, unit, scale):
    b = report.bounded(measured, bound, figure, bound_from, unit, scale)
    checks.append({"figure": figure, "measured": measured, "bound": bound, **b})

  for step in ("bench_smollm2", "bench_gemma3"):
    res = _load(os.path.join(detail, step, "results.json"))
    if res is None:
      continue
    r = res["roofline"]
    for name in ("prefill_plain", "prefill_capture"):
      for side, who in (("ours", "reprobe-jax"), ("hf", "PyTorch")):
        if name in r:
          f = f"{step} {name} {who} FLOP rate"
          check(f, r[name][f"{side}_flops_per_s"], f32, f"f32 matmul: {roof['f32_bound_from']}", "TFLOP/s", 1e12)
    d = r.get("decode_b1", {})
    for side, who in (("ours", "reprobe-jax"), ("hf", "PyTorch")):
      if f"{side}_bytes_per_s" in d:
        f = f"{step} batch-1 decode {who} weight-read rate"
        check(f, d[f"{side}_bytes_per_s"], bw, f"bandwidth: {roof['bandwidth_bound_from']}", "GB/s", 1e9)
    for e in r.get("harness_errors", []):
      checks.append({"figure": f"{step} (its own in-run bounds)", "status": report.HARNESS_ERROR, "error": e})
  rl = _load(os.path.join(detail, "rl", "rl.json"))
  if rl is not None:
    for name, m in rl["methods"].items():
      med = m["median"]
      if med["update"] > 0 and med["update_flops"] > 0:
        rate = med["update_flops"] / med["update"]
        check(f"rl {name} update FLOP rate", rate, f32, f"f32 matmul: {roof['f32_bound_from']}", "TFLOP/s", 1e12)
  return checks


def _figures(detail: str) -> list[str]:
  """Markdown rows of the headline figures: each bench row's ratio, the RL step's time, the roofline's bounds."""
  lines = []
  for step in ("bench_smollm2", "bench_gemma3"):
    res = _load(os.path.join(detail, step, "results.json"))
    if res is None:
      continue
    env = res.get("environment", {})
    lines.append(f"| {step} | model | {res.get('model')} ({res.get('source')}) | {env.get('torch_device', '')} | |")
    for r in res["rows"]:
      u = r["unit"].replace("_per_s", "/s")
      lines.append(
        f"| {step} | {r['name']} | {r['ours'][r['unit']]:.4g} {u} | {r['hf'][r['unit']]:.4g} {u} | {r['ratio']:.2f}x |"
      )
    for key, what in (("search", "beam search vs reference loop"), ("spae", "SPAE potentials vs per boundary")):
      sec = res.get(key)
      if sec:
        ratio = sec["rows"][0]["ratio"] if key == "search" else sec["ratio"]
        lines.append(f"| {step} | {what} | | | {ratio:.2f}x |")
    for e in res.get("hf_static_cache_errors") or []:
      lines.append(f"| {step} | HF static cache did not run | {e} | | |")
  rl = _load(os.path.join(detail, "rl", "rl.json"))
  if rl is not None:
    for name, m in rl["methods"].items():
      lines.append(f"| rl | {name.upper()} step (s, median) | {m['median']['total']:.3g} s | | |")
  roof = _load(os.path.join(detail, "roofline", "roofline.json"))
  if roof is not None:
    lines += [
      f"| roofline | bf16 matmul bound | {roof['bf16_bound'] / 1e12:.4g} TFLOP/s | {roof['bf16_bound_from']} | |",
      f"| roofline | f32 matmul bound | {roof['f32_bound'] / 1e12:.4g} TFLOP/s | {roof['f32_bound_from']} | |",
      f"| roofline | bandwidth bound | {roof['bandwidth_bound'] / 1e9:.4g} GB/s | {roof['bandwidth_bound_from']} | |",
    ]
  return lines


def _ran_detail(step: str, detail: str) -> str | None:
  """What a step that ran did, from its results (its log's last line is a goal or a table row): None to keep that."""
  if step.startswith("bench_"):
    res = _load(os.path.join(detail, step, "results.json"))
    if res is not None:
      env = res["environment"]
      return (
        f"{res['model']}: JAX on {env['jax_backend']}, torch on {env['torch_device']}; {len(res['rows'])} rows, "
        f"{len(res['roofline']['harness_errors'])} in-run harness errors"
      )
  if step == "rl":
    rl = _load(os.path.join(detail, "rl", "rl.json"))
    if rl is not None:
      steps = ", ".join(f"{k.upper()} {m['median']['total']:.3g} s" for k, m in rl["methods"].items())
      return f"{rl['model']['source']}: a step {steps}"
  return None


def summary(out_dir: str) -> tuple[dict, str]:
  """(summary.json's dict, summary.md's text) of a check's folder: every step of STEPS with its status, the bound
  checks ('bounds': failed on any harness error) and the headline figures."""
  import jax

  detail = os.path.join(out_dir, "detail")
  steps = read_steps(os.path.join(out_dir, "steps.tsv"))
  rows = []
  for name in STEPS:
    s = steps.get(name) or {"status": "failed", "seconds": 0.0, "detail": "no record: the script stopped before it"}
    if s["status"] == "ran":
      s["detail"] = _ran_detail(name, detail) or s["detail"]
    rows.append({"step": name, **s})
  roof = _load(os.path.join(detail, "roofline", "roofline.json"))
  checks = bound_checks(detail, roof)
  errors = [c for c in checks if c["status"] != "ok"]
  if roof is None:
    bounds = {"status": "skipped", "detail": "no roofline.json: the roofline step did not run to its end"}
  elif errors:
    bounds = {
      "status": "failed",
      "detail": f"{len(errors)} of {len(checks)} figures above their bound (harness errors)",
    }
  else:
    bounds = {"status": "ran", "detail": f"{len(checks)} figures checked, none above its bound"}
  rows.append({"step": "bounds", "seconds": 0.0, **bounds})
  device = device_name()
  result = {"device": device, "jax_backend": jax.default_backend(), "steps": rows, "bound_checks": checks}
  lines = [
    f"# GPU check: {device}",
    "",
    f"JAX {jax.__version__} on {jax.default_backend()}; details in detail/ (or detail.tar.gz).",
    "",
    "| step | status | time (s) | detail |",
    "|---|---|---|---|",
  ]
  lines += [f"| {r['step']} | {r['status']} | {r['seconds']:.0f} | {r['detail'].replace('|', '/')} |" for r in rows]
  figures = _figures(detail)
  if figures:
    lines += ["", "| step | figure | reprobe-jax | PyTorch | ratio |", "|---|---|---|---|---|"] + figures
  if checks:
    lines += ["", "| figure | measured / bound |", "|---|---|"]
    lines += [
      f"| {c['figure']} | {c['fraction']:.0%} |" if c["status"] == "ok" else f"| {c['figure']} | **{c['status']}** |"
      for c in checks
    ]
    lines += [f"- **Harness error**: {c['error']}." for c in errors]
  return result, "\n".join(lines) + "\n"


def write_summary(out_dir: str) -> int:
  """Writes summary.json and summary.md into out_dir and prints the table; 1 if a step failed, else 0."""
  from reprobe_jax.io.atomic import write_json

  result, text = summary(out_dir)
  write_json(os.path.join(out_dir, "summary.json"), result, indent=2)
  with open(os.path.join(out_dir, "summary.md.tmp"), "w") as f:
    f.write(text)
  os.replace(os.path.join(out_dir, "summary.md.tmp"), os.path.join(out_dir, "summary.md"))
  print(text)
  return int(any(r["status"] == "failed" for r in result["steps"]))


# ------------------------------------------------------------------------------------------------ CLI


def parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n\n")[0])
  sub = p.add_subparsers(dest="command", required=True)
  r = sub.add_parser("roofline", help="bf16 / f32 matmul and device bandwidth: <out>/roofline.json")
  r.add_argument("--out", required=True, help="writes roofline.json here")
  r.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run, not a measurement")
  s = sub.add_parser("summary", help="summary.md and summary.json of a check's folder")
  s.add_argument("dir", help="the check's output folder (steps.tsv, detail/)")
  return p.parse_args(argv)


def main(argv=None) -> int:
  from reprobe_jax.io.atomic import write_json

  args = parse_args(sys.argv[1:] if argv is None else argv)
  try:
    if args.command == "summary":
      if not os.path.isdir(args.dir):
        raise ConfigError(f"summary: {args.dir} is not a folder (the check's output folder)")
      return write_summary(args.dir)
    os.makedirs(args.out, exist_ok=True)
    roof = roofline(args.quick)
    write_json(os.path.join(args.out, "roofline.json"), roof, indent=2)
    print(
      f"{roof['device']} ({roof['backend']}, f32 precision {roof['precision']}): bf16 "
      f"{roof['bf16_bound'] / 1e12:.3g} TFLOP/s ({roof['bf16_bound_from']}), f32 {roof['f32_bound'] / 1e12:.3g} "
      f"TFLOP/s ({roof['f32_bound_from']}), bandwidth {roof['bandwidth_bound'] / 1e9:.4g} GB/s "
      f"({roof['bandwidth_bound_from']})"
    )
  except ReprobeError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
