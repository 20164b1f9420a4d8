"""Goals, roofline and the three outputs: results.json, results.md (tables) and results.png (bar chart)."""

from __future__ import annotations

import json
import os

from bench import spae

# (row, what, threshold): the ratio reprobe-jax / PyTorch a row must reach (docs/performance.md, Goals).
# The decode-speed goals' decode and prefill rows (they replace the first goals' batch-32 >= 3x and plain prefill
# >= 0.9x); the first goals' prefill-with-capture row stays.
RATIO_GOALS = [
  ("decode_b1", "batch-1 greedy decode >= 1.5x HF generate", 1.5),
  ("decode_b8", "batch-8 greedy decode >= 1.5x HF generate", 1.5),
  ("decode_b32", "batch-32 greedy decode >= 1.5x HF generate", 1.5),
  ("prefill_capture", "prefill with capture >= 1.5x HF eager with output_attentions", 1.5),
  ("prefill_plain", "plain prefill >= 1.0x PyTorch", 1.0),
  ("step_scoring", "PRM step scoring (whole text) >= 1.0x PyTorch", 1.0),
]
BANDWIDTH_GOAL = 0.7  # batch-1 decode reaches this fraction of the memory-bandwidth bound
PROBE_GOAL = 10.0  # probe step scoring this many times cheaper than the PRM
SEARCH_GOAL = 10.0  # our beam search this many times the search-and-learn-style loop's sampled steps/s
BEAM_COST_GOAL = 2.0  # our beam search costs at most this many times our Best-of-N per sampled step
SPAE_GOAL = 10.0  # batched SPAE potentials this many times the one-request-per-boundary loop's boundaries/s
SPAE_LONG_GOAL = 20.0  # the same on thinking of 1k+ tokens, where the loop re-reads a longer prefix per request
LONG_THINKING = 1024  # the shortest thinking SPAE_LONG_GOAL is read on
SEARCH_PROBE_VS_PRM_GOAL = 5.0  # a probe-guided search problem this many times cheaper than a PRM-guided one
SEARCH_PROBE_VS_PPL_GOAL = 1.2  # and at most this many times a Perplexity-guided one (its scorer reads no model)


HARNESS_ERROR = "harness-error"  # a measured figure above its roofline bound: the bound (or the work count) is wrong

# Rows whose time is the model's fp32 weight GEMMs at prefill-sized M, on both sides: a goal on them carries the
# ratio the two libraries' own GEMM kernels allow on the model's shapes (`gemm_ratio`), and whether the row ran
# those GEMMs through the LM head too (the PRM's head is a few columns, not the vocabulary).
GEMM_BOUND_ROWS = {"prefill_capture": True, "prefill_plain": True, "step_scoring": False}


def bounded(measured: float, bound: float, what: str, bound_from: str, unit: str, scale: float) -> dict:
  """measured / bound as a fraction in [0, 1] ({'fraction', 'status': 'ok'}), or, where the measurement exceeds its
  bound, {'fraction': None, 'status': 'harness-error', 'error': a sentence}: a bound that the measured work beats
  bounds nothing (a peak measured under load, a work count too high, a step time taken from noisy medians), so no
  percentage above 100% is reported."""
  if bound > 0 and measured <= bound:
    return {"fraction": measured / bound, "status": "ok"}
  return {
    "fraction": None,
    "status": HARNESS_ERROR,
    "error": f"{what}: measured {measured / scale:.3g} {unit} is above its bound {bound / scale:.3g} {unit} "
    f"({bound_from}): the bound or the measurement is wrong (a peak measured under load, a noisy "
    "step time), so no fraction is reported",
  }


def roofline(rows: dict, peaks: dict, bw: dict, flops: dict, param_bytes: int, backend: str) -> dict:
  """Achieved prefill FLOP/s against the compute bound and batch-1 decode bytes/s against the bandwidth bound.

  flops: row name -> model FLOPs of that row's forward. peaks: `timing.matmul_peaks` (the compute bound is its max
  over every GEMM shape and framework measured); bw: `timing.bandwidth` (the bound is its max over the copy, read
  and GEMV kernels). Both sides are held to the same machine bound. Every fraction goes through `bounded`: one above
  1 becomes a harness error, listed in 'harness_errors'. backend: JAX's default backend (recorded).
  """
  peak, bound = peaks["peak_flops_per_s"], bw["bound_bytes_per_s"]
  out = {
    "matmul": peaks,
    "bandwidth": bw,
    "backend": backend,
    "compute_bound_flops_per_s": peak,
    "compute_bound_from": peaks["peak_from"],
    "bandwidth_bound_bytes_per_s": bound,
    "bandwidth_bound_from": bw["bound_from"],
    "harness_errors": [],
  }
  sides = {"ours": "reprobe-jax", "hf": "PyTorch"}
  for name, f in flops.items():
    r = rows[name]
    p = {"model_flops": f, "bound_flops_per_s": peak}
    for side, who in sides.items():
      rate = f / r[side]["median_s"]
      b = bounded(rate, peak, f"{name} {who} FLOP rate", f"compute bound: {peaks['peak_from']}", "GFLOP/s", 1e9)
      p[f"{side}_flops_per_s"], p[f"{side}_of_bound"], p[f"{side}_status"] = rate, b["fraction"], b["status"]
      if "error" in b:
        out["harness_errors"].append(b["error"])
    out[name] = p
  d = {"param_bytes_per_token": param_bytes, "bound_bytes_per_s": bound, "bound_tokens_per_s": bound / param_bytes}
  row = rows.get("decode_b1")
  if row is not None:
    step = row.get("decode_step_s", {})
    for side, who in sides.items():
      # Decode-only step time when both runs produced every token; else the end-to-end time per token
      # (prefill included), which only understates the achieved bandwidth.
      s = step.get(side) if step.get("valid") and step.get(side, 0) > 0 else 1.0 / row[side]["tokens_per_s"]
      b = bounded(
        param_bytes / s,
        bound,
        f"batch-1 decode {who} weight-read rate",
        f"bandwidth bound: {bw['bound_from']}",
        "GB/s",
        1e9,
      )
      d[f"{side}_step_s"], d[f"{side}_bytes_per_s"] = s, param_bytes / s
      d[f"{side}_of_bound"], d[f"{side}_status"] = b["fraction"], b["status"]
      if "error" in b:
        out["harness_errors"].append(b["error"])
    d["step_time_source"] = (
      f"ours: {step.get('ours_from', 'decode-only difference')}; PyTorch: decode-only difference"
      if step.get("valid")
      else "end-to-end (prefill included)"
    )
    # What a read-only kernel was seen to reach (the bound also counts copies): how far below the bound the memory
    # reads themselves stop on this machine. A ratio, not a bound: our step may beat the read kernels measured.
    reads = [(v, f"{kind} ({fw})") for kind in ("read", "gemv") for fw, v in bw["kinds"].get(kind, {}).items()]
    if reads:
      best, source = max(reads)
      d["best_read_bytes_per_s"], d["best_read_from"] = best, source
      d["best_read_of_bound"] = best / bound if bound > 0 else None
      d["ours_of_best_read"] = d["ours_bytes_per_s"] / best
  out["decode_b1"] = d
  return out


def decode_phases(rows: dict) -> list[dict]:
  """Each greedy-decode row's end-to-end ratio split into its two phases: the decode step (ours: the decode loop
  timed alone; HF's: the difference of two run lengths; `cases.decode(step_time=True)`) and the time to the first
  token (prefill included). Rows without both measurements are left out; a step that is not valid (a row ended
  early, a negative difference) is reported as None."""
  out = []
  for name, r in rows.items():
    step, first = r.get("decode_step_s"), r.get("first_token_s")
    if not name.startswith("decode_b") or step is None or first is None:
      continue
    ok = bool(step.get("valid"))
    out.append(
      {
        "name": name,
        "batch": r["shape"]["batch"],
        "prompt": r["shape"]["prompt"],
        "new_tokens": r["shape"]["new_tokens"],
        "step_from_new_tokens": step.get("from_new_tokens"),
        "end_to_end_ratio": r["ratio"],
        "ours_step_s": step["ours"] if ok else None,
        "hf_step_s": step["hf"] if ok else None,
        "step_ratio": step["hf"] / step["ours"] if ok else None,
        "ours_first_token_s": first["ours"],
        "hf_first_token_s": first["hf"],
        "first_token_ratio": first["hf"] / first["ours"] if first["ours"] > 0 else None,
      }
    )
  return out


def decode_phases_markdown(phases: list[dict]) -> list[str]:
  if not phases:
    return []
  ms = lambda s: "-" if s is None else f"{s * 1e3:.1f} ms"
  x = lambda r: "-" if r is None else f"{r:.2f}x"
  short, full = phases[0]["step_from_new_tokens"] or ("?", phases[0]["new_tokens"])
  lines = [
    "Greedy decode by phase (fastest runs; our step is our decode loop timed alone over "
    f"{full} new tokens, PyTorch's the difference of its {short}- and {full}-new-token `generate` runs; the "
    "first token a run with one new token, prefill included):",
    "",
    "| batch | end to end | decode step, reprobe-jax | PyTorch | ratio | first token, reprobe-jax | PyTorch | ratio |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for p in phases:
    lines.append(
      f"| {p['batch']} | {p['end_to_end_ratio']:.2f}x | {ms(p['ours_step_s'])} | {ms(p['hf_step_s'])} | "
      f"{x(p['step_ratio'])} | {p['ours_first_token_s']:.2f} s | {p['hf_first_token_s']:.2f} s | "
      f"{x(p['first_token_ratio'])} |"
    )
  return lines + [""]


def gemm_ratio(peaks: dict, layers: int, with_head: bool = True) -> dict | None:
  """The ratio ours / PyTorch that a row made of the model's weight GEMMs reaches when each side runs every GEMM at
  its own library's rate measured in the same run (`timing.matmul_peaks` on `timing.gemm_shapes`), at the largest
  M measured (the prefill's rows): the two sides' summed GEMM times, each [k, n] entry counted as often as a forward
  runs it (its joined names x layers; the LM head once, or not at all without `with_head`). A row at its ceiling
  is as fast as its GEMM kernels allow; past it, the rest of the row (attention, norms, the host) is faster than
  the other side's. None where the run measured no GEMM shape on both sides."""
  shapes = [s for s in peaks.get("shapes", []) if s.get("jax_flops_per_s") and s.get("torch_flops_per_s")]
  if not shapes:
    return None
  m = max(s["m"] for s in shapes)
  ours = theirs = 0.0
  for s in shapes:
    names = s["name"].split("/")
    if s["m"] != m or (names == ["lm_head"] and not with_head):
      continue
    count = len(names) * (1 if names == ["lm_head"] else layers)
    ours += count * s["flops"] / s["jax_flops_per_s"]
    theirs += count * s["flops"] / s["torch_flops_per_s"]
  return {
    "gemm_ratio": theirs / ours,
    "gemm_ratio_from": f"both sides' fp32 GEMM kernels at their measured rates on the model's shapes at M = {m}"
    + ("" if with_head else ", LM head left out"),
  }


def goals(
  rows: dict,
  roof: dict,
  search: dict | None = None,
  spae: dict | None = None,
  spae_long: dict | None = None,
  layers: int | None = None,
) -> list[dict]:
  """Each goal as met / missed with its measured value, or pending when it cannot be measured yet; `search`: the
  run's step-level beam search section (`bench.search.run_all`), `spae`: its SPAE section (`bench.spae.run_all`),
  `spae_long`: its long-thinking SPAE section (`bench.spae.run_long`; the goal is read at the longest length, and
  only at 1k+ tokens). What bounds a goal, from other figures of the same run, where it is known: `gemm_ratio` (and
  `gemm_ratio_from`) on the GEMM-bound rows, given the model's `layers` (the ratio where the row's time is its
  GEMMs: a row a little past it is faster than the other side outside them), and `ceiling` (`ceiling_from`), a
  strict one: the per-problem cost of a probe-guided search against a PRM-guided one with a probe that costs
  nothing."""
  out = []
  for name, what, need in RATIO_GOALS:
    if name in rows:
      r = rows[name]["ratio"]
      g = {"goal": what, "measured": r, "target": need, "status": "met" if r >= need else "missed"}
      if name in GEMM_BOUND_ROWS and layers:
        g.update(gemm_ratio(roof.get("matmul", {}), layers, GEMM_BOUND_ROWS[name]) or {})
      out.append(g)
  d = roof.get("decode_b1", {})
  if "ours_status" in d:
    r = d["ours_of_bound"]
    status = HARNESS_ERROR if r is None else "met" if r >= BANDWIDTH_GOAL else "missed"
    out.append(
      {
        "goal": f"batch-1 decode >= {BANDWIDTH_GOAL:.0%} of the memory-bandwidth bound",
        "measured": r,
        "target": BANDWIDTH_GOAL,
        "status": status,
      }
    )
  if "harness_errors" in roof:
    n = len(roof["harness_errors"])
    out.append(
      {
        "goal": "no measured figure above its roofline bound (harness errors)",
        "measured": n,
        "target": 0,
        "status": "met" if n == 0 else HARNESS_ERROR,
      }
    )
  s = rows.get("step_scoring")
  if s is not None:
    probe = s["probe"]
    g = {"goal": f"probe step scoring >= {PROBE_GOAL:g}x cheaper than the PRM", "target": PROBE_GOAL}
    if "steps_per_s" in probe:
      g["measured"] = probe["vs_best_prm"]
      g["status"] = "met" if g["measured"] >= PROBE_GOAL else "missed"
    else:
      g["measured"], g["status"] = None, probe["status"]
    out.append(g)
  if search is not None:
    ref, bon = ({r["name"]: r for r in search["rows"]}[k] for k in ("beam_vs_reference", "beam_vs_best_of_n"))
    out.append(
      {
        "goal": f"beam search >= {SEARCH_GOAL:g}x the search-and-learn-style PyTorch loop (sampled steps/s)",
        "measured": ref["ratio"],
        "target": SEARCH_GOAL,
        "status": "met" if ref["ratio"] >= SEARCH_GOAL else "missed",
      }
    )
    out.append(
      {
        "goal": f"beam search costs <= {BEAM_COST_GOAL:g}x our Best-of-N per sampled step",
        "measured": bon["cost_ratio"],
        "target": BEAM_COST_GOAL,
        "status": "met" if bon["cost_ratio"] <= BEAM_COST_GOAL else "missed",
      }
    )
  scorers = (search or {}).get("scorers")
  if scorers is not None:
    sides = scorers["sides"]
    over_ppl = sides["probe"]["seconds_per_problem"] / sides["perplexity"]["seconds_per_problem"]
    out.append(
      {
        "goal": f"probe-guided beam search >= {SEARCH_PROBE_VS_PRM_GOAL:g}x cheaper per problem than PRM-guided",
        "measured": scorers["per_problem_ratio"],
        "target": SEARCH_PROBE_VS_PRM_GOAL,
        "status": "met" if scorers["per_problem_ratio"] >= SEARCH_PROBE_VS_PRM_GOAL else "missed",
        # a scorer that cost nothing: the PRM-guided search's time over the Perplexity-guided one's (decoding)
        "ceiling": sides["prm"]["seconds_per_problem"] / sides["perplexity"]["seconds_per_problem"],
        "ceiling_from": "a probe that costs nothing: PRM-guided over Perplexity-guided seconds per problem",
      }
    )
    out.append(
      {
        "goal": f"probe-guided beam search <= {SEARCH_PROBE_VS_PPL_GOAL:g}x Perplexity-guided per problem",
        "measured": over_ppl,
        "target": SEARCH_PROBE_VS_PPL_GOAL,
        "status": "met" if over_ppl <= SEARCH_PROBE_VS_PPL_GOAL else "missed",
      }
    )
  if spae is not None:
    out.append(
      {
        "goal": f"batched SPAE potentials >= {SPAE_GOAL:g}x one request per boundary (boundaries/s)",
        "measured": spae["ratio"],
        "target": SPAE_GOAL,
        "status": "met" if spae["ratio"] >= SPAE_GOAL else "missed",
      }
    )
  if spae_long is not None and spae_long["rows"]:
    r = max(spae_long["rows"], key=lambda row: row["length"])
    g = {
      "goal": f"batched SPAE potentials >= {SPAE_LONG_GOAL:g}x one request per boundary on thinking of "
      f"{LONG_THINKING}+ tokens",
      "target": SPAE_LONG_GOAL,
    }
    if r["length"] >= LONG_THINKING:
      g.update(measured=r["ratio"], status="met" if r["ratio"] >= SPAE_LONG_GOAL else "missed", length=r["length"])
    else:  # shorter thinking is the built-in lengths' goal, where the re-sent prefix is not what the loop costs
      g.update(
        measured=None,
        status=f"pending: the longest thinking measured is {r['length']} tokens (--spae-lengths=1024,2048)",
      )
    out.append(g)
  return out


def bounded_by(goal: dict) -> str:
  """The goals table's last column: what bounds the goal in this run (`goals`), or nothing."""
  if "ceiling" in goal:
    return f"at most {_fmt(goal['ceiling'])}: {goal['ceiling_from']}"
  if "gemm_ratio" in goal:
    return f"{_fmt(goal['gemm_ratio'])}: {goal['gemm_ratio_from']}"
  return ""


def _fmt(x, digits=3):
  if x is None:
    return "-"
  if isinstance(x, float):
    return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:,.0f}"
  return str(x)


def machine_line(env: dict) -> str:
  """The machine a run was measured on, its load and thread counts: the first line of every report."""
  t = env.get("threads", {})
  load = f"1-min load average {env['load_start'][0]:.2f} at start"
  if env.get("load_end"):
    load += f", {env['load_end'][0]:.2f} at end"
  threads = (
    f"XLA intra-op threads {t.get('xla_intra_op', '?')}, torch threads {t.get('torch_intra_op', '?')}"
    if t
    else f"torch threads {env.get('torch_threads', '?')}"
  )
  return f"Machine: {env.get('machine_detail', env.get('machine', 'unknown'))}; {load}; {threads}."


def _pct(fraction, status) -> str:
  return f"{fraction:.0%}" if fraction is not None else f"**{status}**"


def performance_markdown(result: dict) -> list[str]:
  """One table per run, starting with the machine line: what docs/performance.md shows for each CPU kind."""
  env, rows, roof = result["environment"], {r["name"]: r for r in result["rows"]}, result["roofline"]
  lines = ["## Performance", "", machine_line(env), ""]
  if env.get("decode_kernel"):
    lines += [f"reprobe-jax's decode path: {env['decode_kernel']}.", ""]
  lines += ["| measurement | reprobe-jax | PyTorch | ratio |", "|---|---|---|---|"]
  for r in result["rows"]:
    unit = r["unit"].replace("_per_s", "/s")
    lines.append(
      f"| {r['title'].split(' vs ')[0]} | {_fmt(r['ours'][r['unit']])} {unit} | "
      f"{_fmt(r['hf'][r['unit']])} {unit} | {r['ratio']:.2f}x |"
    )
  probe = rows.get("step_scoring", {}).get("probe", {})
  if "steps_per_s" in probe:
    lines.append(
      f"| Probe vs the PRM's fastest path | {_fmt(probe['steps_per_s'])} steps/s | | {probe['vs_best_prm']:.2f}x |"
    )
  m = roof["matmul"]
  best_shape = lambda key: max(r[key] for r in m["shapes"]) if m["shapes"] else None
  lines.append(
    f"| fp32 matmul, best on the model's GEMM shapes (GFLOP/s) | {_g(best_shape('jax_flops_per_s'))} | "
    f"{_g(best_shape('torch_flops_per_s'))} | |"
  )
  sq = m["square"]
  lines.append(
    f"| fp32 matmul, {sq['n']}^3 (GFLOP/s) | {_g(sq['jax_flops_per_s'])} | {_g(sq['torch_flops_per_s'])} | |"
  )
  for name in ("prefill_plain", "prefill_capture"):
    if name in roof:
      p = roof[name]
      lines.append(
        f"| {name} of the compute bound ({_g(p['bound_flops_per_s'])} GFLOP/s) | "
        f"{_pct(p['ours_of_bound'], p['ours_status'])} | {_pct(p['hf_of_bound'], p['hf_status'])} | |"
      )
  d = roof["decode_b1"]
  if "ours_status" in d:
    lines.append(
      f"| batch-1 decode of the bandwidth bound ({d['bound_bytes_per_s'] / 1e9:.1f} GB/s) | "
      f"{_pct(d['ours_of_bound'], d['ours_status'])} | {_pct(d['hf_of_bound'], d['hf_status'])} | |"
    )
  comp = result.get("compile")
  if comp is not None:
    for c in comp["rows"]:
      first = "" if c["first_call_s"] is None else f"first call {c['first_call_s']:.1f} s; "
      lines.append(
        f"| compile: {c['model']} {c['function']} | {first}lower {c['lower_s']:.1f} s + XLA compile "
        f"{c['compile_s']:.1f} s | | |"
      )
  errors = [f"**Harness error**: {e}." for e in roof.get("harness_errors", [])]
  phases = decode_phases_markdown(result.get("decode_phases") or decode_phases(rows))
  return lines + [""] + phases + errors + ([""] if errors else [])


def _g(x) -> str:
  return "-" if x is None else f"{x / 1e9:.3g}"


def roofline_markdown(roof: dict) -> list[str]:
  """The roofline section: matmul throughput per GEMM shape, bandwidth per kernel kind, the bounds and fractions
  (a harness error in place of any fraction above 100%)."""
  m, bw, d = roof["matmul"], roof["bandwidth"], roof["decode_b1"]
  t = m["threads"]
  lines = [
    "## Roofline",
    "",
    f"Best of {m['repeats']} runs per figure, in {m.get('passes', 1)} pass(es) (at the run's start and end; on "
    "shared cores a disturbance only adds time). Threads: XLA "
    f"intra-op {t['xla_intra_op']}, torch intra-op {t['torch_intra_op']} (inter-op {t['torch_inter_op']}), "
    f"{t['affinity_cpus']} CPUs in the affinity mask"
    + (f", XLA_FLAGS={t['xla_flags']}" if t["xla_flags"] else "")
    + ".",
    "",
    "| GEMM (fp32) | M | K | N | JAX GFLOP/s | PyTorch GFLOP/s |",
    "|---|---|---|---|---|---|",
  ]
  for r in m["shapes"] + [m["square"]]:
    extra = f" (NumPy {_g(r['numpy_flops_per_s'])})" if "numpy_flops_per_s" in r else ""
    lines.append(
      f"| {r['name']} | {r['m']} | {r['k']} | {r['n']} | {_g(r['jax_flops_per_s'])} | "
      f"{_g(r['torch_flops_per_s'])}{extra} |"
    )
  lines += [
    "",
    f"Compute bound: {_g(roof['compute_bound_flops_per_s'])} GFLOP/s, the max over every shape and "
    f"framework above ({roof['compute_bound_from']}).",
    "",
    f"| bandwidth kernel ({bw['bytes'] / 2**20:.0f} MiB fp32) | " + " | ".join(("NumPy", "JAX", "PyTorch")) + " |",
    "|---|---|---|---|",
  ]
  for kind, what in (("copy", "copy (read + write)"), ("read", "read (sum)"), ("gemv", "GEMV [1, 1024] x weight")):
    by = bw["kinds"][kind]
    lines.append(
      f"| {what} | "
      + " | ".join(f"{by[fw] / 1e9:.1f} GB/s" if fw in by else "-" for fw in ("numpy", "jax", "torch"))
      + " |"
    )
  lines += [
    "",
    f"Bandwidth bound: {bw['bound_bytes_per_s'] / 1e9:.1f} GB/s, the max over every kernel above "
    f"({bw['bound_from']}). A batch-1 decode step reads every weight once and writes almost nothing, so read "
    "and GEMV are its kernels; copies stay in the max because any rate the memory delivered is one the bound "
    "must reach.",
    "",
  ]
  for name in ("prefill_plain", "prefill_capture"):
    if name in roof:
      p = roof[name]
      lines.append(
        f"- {name}: {p['model_flops'] / 1e9:.1f} model GFLOP; reprobe-jax {_g(p['ours_flops_per_s'])} "
        f"GFLOP/s ({_pct(p['ours_of_bound'], p['ours_status'])} of the compute bound), PyTorch "
        f"{_g(p['hf_flops_per_s'])} GFLOP/s ({_pct(p['hf_of_bound'], p['hf_status'])})."
      )
  if "ours_step_s" in d:
    lines.append(
      f"- batch-1 decode reads {d['param_bytes_per_token'] / 1e6:.0f} MB of parameters per token; bound "
      f"{d['bound_bytes_per_s'] / 1e9:.1f} GB/s = {d['bound_tokens_per_s']:.1f} tokens/s. reprobe-jax "
      f"{1 / d['ours_step_s']:.1f} tokens/s = {d['ours_bytes_per_s'] / 1e9:.1f} GB/s "
      f"({_pct(d['ours_of_bound'], d['ours_status'])}); PyTorch {1 / d['hf_step_s']:.1f} tokens/s = "
      f"{d['hf_bytes_per_s'] / 1e9:.1f} GB/s ({_pct(d['hf_of_bound'], d['hf_status'])}); step time from "
      f"{d['step_time_source']}."
    )
    if "best_read_bytes_per_s" in d and d["ours_status"] == "ok":
      lines.append(
        f"- The fastest read-only kernel measured ({d['best_read_from']}, "
        f"{d['best_read_bytes_per_s'] / 1e9:.1f} GB/s) reaches {d['best_read_of_bound']:.0%} of the bound; "
        f"reprobe-jax's batch-1 step streams {d['ours_of_best_read']:.2f}x that kernel's rate."
      )
  for e in roof.get("harness_errors", []):
    lines.append(f"- **Harness error**: {e}.")
  return lines


def markdown(result: dict) -> str:
  env, rows, roof = result["environment"], result["rows"], result["roofline"]
  lines = [
    f"# reprobe-jax vs PyTorch transformers: {result['model']}",
    "",
    f"JAX {env['jax']} ({env['jax_backend']}), torch {env['torch']} ({env['torch_device']}, "
    f"{env['torch_threads']} threads), transformers {env['transformers']}; {env['cpu_count']} CPUs; "
    f"{result['repeats']} repeats, median (roofline figures: best); total {result['wall_s']:.0f} s"
    + (" (--quick)" if result["quick"] else "")
    + ".",
    "",
  ]
  lines += performance_markdown(result)
  lines += [
    "## Every measurement",
    "",
    "| measurement | shape | reprobe-jax | transformers | ratio | ours: first call / XLA compile (s) |",
    "|---|---|---|---|---|---|",
  ]
  for r in rows:
    unit = r["unit"].replace("_per_s", "/s")
    shape = ", ".join(f"{k} {v}" for k, v in r["shape"].items())
    lines.append(
      f"| {r['title']} | {shape} | {_fmt(r['ours'][r['unit']])} {unit} | {_fmt(r['hf'][r['unit']])} "
      f"{unit} | {r['ratio']:.2f}x | {r['ours']['first_call_s']:.1f} / {r['ours']['xla_compile_s']:.1f} |"
    )
    if "probe" in r:
      p = r["probe"]
      if "steps_per_s" in p:
        c = p["config"]
        inc = r["prm_incremental"]
        fastest = max(r["ours"]["steps_per_s"], r["hf"]["steps_per_s"], inc["steps_per_s"])
        lines.append(
          f"| Step scoring: PRM incremental (its own KV cache, each step appended when newest), "
          f"reprobe-jax vs our whole-text PRM | {shape} | {_fmt(inc['steps_per_s'])} steps/s | (whole "
          f"text) {_fmt(r['ours']['steps_per_s'])} steps/s | "
          f"{inc['steps_per_s'] / r['ours']['steps_per_s']:.2f}x | {inc['first_call_s']:.1f} / "
          f"{inc['xla_compile_s']:.1f} |"
        )
        lines.append(
          f"| Step scoring: probe (docs/method.md §A4, d={c['d_model']}, {c['n_layers']} layer, {p['params']:,} "
          f"params) over packed windows of captured last-layer hidden states vs the PRM's fastest path "
          f"| {shape} | {_fmt(p['steps_per_s'])} steps/s | (PRM) {_fmt(fastest)} steps/s | "
          f"{p['vs_best_prm']:.2f}x | {p['first_call_s']:.1f} / {p['xla_compile_s']:.1f} |"
        )
      else:
        lines.append(f"| Step scoring: probe over captured features | | {p['status']} | | | |")
  sc = result.get("shared_context")
  if sc is not None:
    sh = sc["shape"]
    lines += [
      "",
      f"## Shared context: {sh['continuations']} continuations of a {sh['context']}-token context",
      "",
      "Prefill the context once, branch the rows, greedy-decode "
      f"{sh['new_tokens']} tokens each; rows reading one shared prefix vs rows holding a copy of it.",
      "",
      "| rows | time (s, median) | tokens/s | KV cache bytes |",
      "|---|---|---|---|",
    ]
    for name in ("shared", "copied"):
      side = sc[name]
      lines.append(f"| {name} | {side['median_s']:.3f} | {_fmt(side['tokens_per_s'])} | {side['cache_bytes']:,} |")
    lines.append(
      f"\nShared prefix: {sc['speedup']:.2f}x the speed, {sc['memory_ratio']:.1f}x less cache memory; "
      f"greedy tokens equal {sc['parity']['tokens_equal']:.0%}, log-prob max diff "
      f"{sc['parity']['logprob_max_abs']:.1e}."
    )
  if result.get("search") is not None:
    lines += search_markdown(result["search"], env)
  if result.get("spae") is not None:
    lines += [""] + spae.markdown(result["spae"])
  if result.get("spae_long") is not None and result["spae_long"]["rows"]:
    lines += [""] + spae.long_markdown(result["spae_long"])
  lines += ["", "## Goals", "", "| goal | measured | target | status | what bounds it |", "|---|---|---|---|---|"]
  for g in result["goals"]:
    lines.append(f"| {g['goal']} | {_fmt(g['measured'])} | {g['target']} | {g['status']} | {bounded_by(g)} |")
  lines += [""] + roofline_markdown(roof)
  step = next((r for r in rows if r["name"] == "step_scoring" and "flops" in r), None)
  if step is not None:
    f = step["flops"]
    lines.append(
      f"- step scoring: the PRM does {f['prm_macs_per_step'] / 1e6:.1f} M multiply-adds per scored step "
      f"(backbone per step token and separator), the probe {f['probe_macs_per_step'] / 1e6:.1f} M (per "
      f"window token, windows [0, step end)): at equal FLOP rates the probe is {f['ratio']:.1f}x cheaper; "
      "the probe's windows grow with the step's position, the PRM's work with the step's length."
    )
  if result.get("compile") is not None:
    from bench import compile as compile_bench

    lines += [""] + compile_bench.markdown(result["compile"])
  lines += [
    "",
    "Parity (same weights, same inputs): "
    + "; ".join(f"{r['name']}: " + ", ".join(f"{k}={_fmt(v)}" for k, v in r.get("parity", {}).items()) for r in rows),
    "",
  ]
  return "\n".join(lines)


def search_markdown(search: dict, env: dict) -> list[str]:
  """The step-level beam search section: ours vs the PyTorch reference loop, beam vs Best-of-N, greedy parity."""
  c, rows, par = search["config"], {r["name"]: r for r in search["rows"]}, search["parity"]
  s = c["sampling"]
  ref, bon = rows["beam_vs_reference"], rows["beam_vs_best_of_n"]
  lines = [
    "",
    f"## Step-level beam search: B={c['beams']}, N={c['n']}, {c['max_steps']} rounds",
    "",
    f"{search['problems']} problems ({search['prompts']}), each trajectory's budget {c['max_new_tokens']} "
    f"tokens, T={s['temperature']:g}, top-k {s['top_k']}, top-p {s['top_p']:g}; scorer: {search['scorer']} "
    "(ours reads the log-probs the decode captured; the reference runs one full forward per candidate text). "
    f"Machine: {env['machine']}. Throughput counts each side's own sampled steps and generated tokens.",
    "",
    "| measurement | sampled steps | tokens | time (s, median) | steps/s | tokens/s | first call / XLA compile (s) |",
    "|---|---|---|---|---|---|---|",
  ]
  sides = [
    ("reprobe-jax beam search (all problems in one jitted search)", ref["ours"]),
    ("search-and-learn-style loop, PyTorch transformers (per problem, per beam)", ref["hf"]),
    (f"reprobe-jax Best-of-N (n={c['beams'] * c['n']})", bon["best_of_n"]),
  ]
  for what, s in sides:
    lines.append(
      f"| {what} | {s['sampled_steps']} | {s['generated_tokens']} | {s['median_s']:.2f} | "
      f"{_fmt(s['steps_per_s'])} | {_fmt(s['tokens_per_s'])} | {s['first_call_s']:.1f} / "
      f"{s['xla_compile_s']:.1f} |"
    )
  same = par["score_max_abs"]
  lines += [
    "",
    f"Beam search vs the reference loop: {ref['ratio']:.2f}x the sampled steps/s "
    f"({ref['tokens_ratio']:.2f}x the tokens/s; {ref['ratio_of_min_times']:.2f}x on the fastest repeats; "
    f"PyTorch on {ref['torch_threads']} threads). Beam search per sampled step costs {bon['cost_ratio']:.2f}x "
    "Best-of-N. Greedy "
    f"(B={par['beams']}, N={par['n']}, {par['max_steps']} rounds): both sides select the same steps on "
    f"{par['problems_equal']:.0%} of {par['problems']} problems"
    + (f", step scores within {same:.1e}." if same is not None else "."),
  ]
  sc = search.get("scorers")
  if sc is not None:
    lines += [
      "",
      "Per searched problem, the same beam search by scorer (each side's own selections):",
      "",
      "| scorer | sampled steps | s per problem (median) | scorer's share over perplexity (s) |",
      "|---|---|---|---|",
    ]
    for name, side in sc["sides"].items():
      extra = sc["scoring_seconds_per_problem"].get(name)
      lines.append(
        f"| {name} | {side['sampled_steps']} | {side['seconds_per_problem']:.2f} | "
        f"{'-' if extra is None else f'{extra:.2f}'} |"
      )
    ratio = sc["scoring_ratio"]
    lines.append(
      f"\nPRM-guided search costs {sc['per_problem_ratio']:.2f}x the probe-guided one per problem"
      + (f"; the PRM's scoring {ratio:.1f}x the probe's." if ratio is not None else ".")
    )
  return lines


def chart(result: dict, path: str) -> None:
  """Horizontal bars of throughput (log scale), reprobe-jax next to transformers for every row."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = result["rows"]
  labels = [f"{r['name']} ({r['unit'].replace('_per_s', '/s')})" for r in rows]
  ours = [r["ours"][r["unit"]] for r in rows]
  hf = [r["hf"][r["unit"]] for r in rows]
  fig, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 1.5))
  y = range(len(rows))
  ax.barh([i + 0.2 for i in y], ours, height=0.4, label="reprobe-jax")
  ax.barh([i - 0.2 for i in y], hf, height=0.4, label="transformers (PyTorch)")
  for i, r in enumerate(rows):
    ax.text(max(ours[i], hf[i]) * 1.05, i, f"{r['ratio']:.2f}x", va="center", fontsize=8)
  ax.set_yticks(list(y), labels, fontsize=8)
  ax.set_xscale("log")
  ax.set_xlim(right=max(ours + hf) * 2.5)  # room for the ratio labels
  ax.set_xlabel("throughput (higher is better)")
  ax.set_title(f"{result['model']}: reprobe-jax vs transformers ({result['environment']['jax_backend']})")
  ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write(result: dict, out_dir: str) -> dict[str, str]:
  """Writes results.json, results.md and results.png into out_dir (each through a temporary name)."""
  os.makedirs(out_dir, exist_ok=True)
  paths = {k: os.path.join(out_dir, f"results.{k}") for k in ("json", "md", "png")}
  for key, text in (("json", json.dumps(result, indent=2)), ("md", markdown(result))):
    with open(paths[key] + ".tmp", "w") as f:
      f.write(text)
    os.replace(paths[key] + ".tmp", paths[key])
  chart(result, paths["png"] + ".tmp.png")
  os.replace(paths["png"] + ".tmp.png", paths["png"])
  return paths
