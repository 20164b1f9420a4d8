"""`python -m bench.rl [--quick] [--model=auto|random|build|<model folder>] [--steps=3] [--warmup=3] [--out=...]`.

The RL step's time split on the built-in config (configs/rl_synthetic.py's RLConfig and probe): DAPO against SPAE,
same config and seeds otherwise. Each method runs `RLStep` directly: `--warmup` steps (a run compiles its shapes in
its first few), then `--steps` measured steps, the two methods' in turn (load on shared cores falls on both alike);
per phase (RLStep's `time_rollout`, `time_probe`, `time_update`) and for the whole step the median over the measured
steps. The update's
FLOPs are XLA's own count of the programs the step ran (`update_cost`) against this machine's measured fp32 matmul
bound (`bench.timing.matmul_peaks` at the run's start and end, the better of the two). Writes `<out>/rl.json`
(atomically: the measurements, the machine, a `goals` list as `bench.run` writes one), prints a short table;
progress on stderr.

`--model=auto` (default): the built-in SPAE target where `python train.py --config=configs/rl_synthetic.py` built
it, else `LanguageModel.random` of its shape with a tokenizer fitted to the synthetic worlds' traces (a random policy
never answers right, so its reward is a hash coin of the response, and it writes few paragraph boundaries: the
probing goals are then pending). `build`: build the target as the jobs do (minutes); a model folder: that model.
`--quick`: a tiny random model and RL config, one measured step: a smoke run, not a measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import sys
import time
import zlib

import jax
import jax.numpy as jnp

from bench import timing
from reprobe_jax.errors import ConfigError, ReprobeError
from reprobe_jax.eval.machine import describe
from reprobe_jax.io.atomic import write_json
from reprobe_jax.models.sampling import bucket

CONFIG = "configs/rl_synthetic.py"
METHODS = ("dapo", "spae")
PHASES = ("rollout", "probe", "update")
PROBE_SHARE_GOAL = 0.25  # probing at most this share of the rollout's time
SPAE_STEP_GOAL = 1.15  # an SPAE step at most this many times a DAPO step
UPDATE_BOUND_GOAL = 3.0  # the update at most this many times its FLOP bound (FLOPs / the matmul bound)
MAX_SKIPPED = 4  # steps that trained nothing (every group dropped) before the bench gives up
PROGRAMS = ("step_update",)  # RLStep's attribute holding the update's compiled program (`update_cost`)


@dataclasses.dataclass(frozen=True)
class Sizes:
  steps: int = 3  # measured steps per method (after the warm-up steps)
  warmup: int = 3  # steps that train before the measured ones: the run's shapes compile in its first few steps
  matmul_n: int = 2048  # the square matmul of the roofline
  repeats: int = 5  # best-of repeats of each roofline figure


QUICK = Sizes(steps=1, warmup=1, matmul_n=256, repeats=2)


log = functools.partial(print, file=sys.stderr, flush=True)  # progress; the table goes to stdout


def load_config():
  """configs/rl_synthetic.py's ConfigDict (read from the repository root, as train.py reads it)."""
  import importlib.util

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  spec = importlib.util.spec_from_file_location("rl_synthetic", os.path.join(root, CONFIG))
  module = importlib.util.module_from_spec(spec)
  if root not in sys.path:  # the config imports its siblings as `configs.*`
    sys.path.insert(0, root)
  spec.loader.exec_module(module)
  return module.get_config()


def configs(config, quick: bool):
  """(RLConfig, ProbeConfig) of the built-in config; --quick: 2 prompts x 4 samples of 24 tokens, 2 x 4-token probes."""
  from reprobe_jax.jobs.rl import rl_config_from_dict
  from reprobe_jax.jobs.spae import probe_config_from_dict

  cfg, pcfg = rl_config_from_dict(config.rl), probe_config_from_dict(config.probe)
  if quick:
    small = dict(prompts_per_step=2, group_size=4, prompts_per_round=2, max_refill_rounds=1, max_new_tokens=24)
    cfg = dataclasses.replace(cfg, **small, mini_batches=1, train_problems=4)
    pcfg = dataclasses.replace(pcfg, samples=2, max_tokens=4)
  return cfg, pcfg


def coin_reward(problem, text: str) -> float:
  """A random policy's reward: a hash coin of its response (it never answers right; every group would be dropped)."""
  del problem
  return float(zlib.crc32(text.encode()) & 1)


def random_target(shape: dict, vocab_size: int, seed: int = 0):
  """`LanguageModel.random` of the built-in target's shape with a byte-level BPE tokenizer fitted to the synthetic
  worlds' thinking traces (think tags, paragraph ends, the chat template), as the target build fits its own."""
  from reprobe_jax.models import LanguageModel, ModelConfig
  from reprobe_jax.synthetic.tokenizer import build_tokenizer
  from reprobe_jax.tasks import make_problems
  from reprobe_jax.tasks.formats import user_prompt
  from reprobe_jax.tasks.traces import solve_many

  texts = []
  for fam in ("arithmetic", "planning", "qa"):
    for mode in ("thinking", "line"):
      ps = make_problems(fam, 40, seed, 2)
      texts += [user_prompt(p, mode) + t.text for p, t in zip(ps, solve_many(ps, mode, seed))]
  tok = build_tokenizer(texts, vocab_size)
  cfg = ModelConfig(
    family="llama",
    vocab_size=len(tok),
    **shape,
    head_dim=shape["hidden_size"] // shape["num_heads"],
    tie_word_embeddings=True,
    rms_norm_eps=1e-5,
    bos_token_id=tok.bos_token_id,
    eos_token_ids=(tok.eos_token_id,),
    pad_token_id=tok.pad_token_id,
  )
  return LanguageModel.random(cfg, seed=seed, tokenizer=tok)


QUICK_SHAPE = dict(
  hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1, max_position_embeddings=256
)


def check_model(model: str) -> None:
  """ConfigError naming --model unless it is auto, random, build or a model folder (before any work)."""
  if model not in ("auto", "random", "build") and not os.path.exists(os.path.join(model, "config.json")):
    raise ConfigError(f"--model={model}: expected auto, random, build or a model folder (with a config.json)")


def policy(config, model: str, quick: bool):
  """(LanguageModel, what it is, reward or None for the task's answer check, random weights?) for `--model`."""
  from reprobe_jax.jobs import target
  from reprobe_jax.jobs.target_config import config_from_dict
  from reprobe_jax.models import load_pretrained

  if quick:
    return random_target(QUICK_SHAPE, 300), "random weights, a tiny Llama (--quick)", coin_reward, True
  built = os.path.join(config.target.workdir, config_from_dict(config.target, "config.target").key(), "model")
  if model == "build":
    log(f"building the built-in SPAE target ({CONFIG}: target) as the jobs do")
    built = os.path.join(target.build(config_from_dict(config.target, "config.target"), config.target.workdir), "model")
  if model in ("auto", "build") and os.path.exists(os.path.join(built, "config.json")):
    return load_pretrained(built, dtype="float32"), f"the built-in SPAE target ({built})", None, False
  if model in ("auto", "random"):
    shape = {k: int(config.target.model[k]) for k in QUICK_SHAPE}
    why = "" if model == "random" else f"; no built target at {built}"
    lm = random_target(shape, int(config.target.vocab_size))
    return lm, f"random weights, the built-in SPAE target's shape{why}", coin_reward, True
  return load_pretrained(model, dtype="float32"), f"the model folder {model}", None, False


def _signature(calls) -> str:
  """The programs and argument shapes of recorded calls, as a key: calls of one signature run the same programs."""
  return repr([(n, jax.tree.map(lambda s: (s.shape, str(s.dtype)), a)) for n, a in calls])


class Recorder:
  """Wraps RLStep's compiled update program (`PROGRAMS`) and its probing phase, recording per step the argument
  shapes the update was called with (for `update_cost`) and the boundaries probed."""

  def __init__(self, step):
    self.calls: list[tuple[str, tuple]] = []
    self.boundaries = 0
    self.programs = {name: getattr(step, name) for name in PROGRAMS}  # as the step compiled them
    for name, fn in self.programs.items():
      setattr(step, name, self._wrap(name, fn))
    inner = step._probe

    def probe(*args, **kwargs):
      out = inner(*args, **kwargs)
      self.boundaries += 0 if out is None else sum(len(c) for c in out.cuts)
      return out

    step._probe = probe

  def _wrap(self, name, fn):
    def call(*args):
      weak = lambda x: getattr(x, "weak_type", False)  # noqa: E731
      self.calls.append((name, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=weak(x)), args)))
      return fn(*args)

    return call

  def take(self):
    out, self.calls, self.boundaries = (self.calls, self.boundaries), [], 0
    return out


def update_cost(step, tx, calls, programs) -> dict:
  """XLA's FLOP count of one RL step's update: the one program `update.make_step_update` builds (old and reference
  log-probs, every mini-batch's update), as the step called it (`calls`: (program, abstract arguments) from
  `Recorder`; `programs`: the step's own compiled programs by name).

  XLA's cost analysis counts a loop body once, not once per trip, so the count is `update.update_flops`'s (the same
  program with its loops unrolled); `as_compiled` is XLA's count of the program as the step ran it."""
  from reprobe_jax.rl import update as update_lib

  cfg = step.cfg
  flops = lambda c: float((c[0] if isinstance(c, (list, tuple)) else c).get("flops", 0.0))  # noqa: E731
  total, raw, per, seen = 0.0, 0.0, {}, {}
  for name, args in calls:
    key = _signature([(name, args)])
    if key not in seen:  # steps of one shape: one compilation
      params, _, tokens, _, resp = args[:5]
      unrolled = update_lib.update_flops(
        step.policy.static_graph,
        tx,
        cfg.loss_config(),
        params,
        rows=tokens.shape[0],
        prompt_len=tokens.shape[1] - resp.shape[1],
        response_len=resp.shape[1],
        mini_batches=cfg.mini_batches,
        micro_batches=cfg.micro_batches,
      )
      seen[key] = (unrolled, flops(programs[name].lower(*args).compile().cost_analysis()))
    f, r = seen[key]
    total, raw, per[name] = total + f, raw + r, per.get(name, 0.0) + f
  return {"flops": total, "by_program": per, "as_compiled": raw, "calls": [n for n, _ in calls]}


class Method:
  """One method's `RLStep` and train state; `step()` runs the next step and records its phases, total, XLA compiles,
  boundaries probed and update FLOPs: the first step that trains is the warm-up, one that trained nothing (every
  group dropped) 'skipped', the rest 'measured'."""

  def __init__(self, lm, cfg, pcfg, steps: int, reward, warmup: int = 1):
    self.warmup = warmup
    from reprobe_jax.rl.loop import RLStep, check_run
    from reprobe_jax.train.optimizer import make_optimizer

    self.name = cfg.advantage
    prompts = check_run(lm, cfg, pcfg, reward=reward)
    self.tx, _ = make_optimizer(cfg.optimizer, (steps + 1 + MAX_SKIPPED) * cfg.mini_batches)
    self.rl_step = RLStep(lm, cfg, pcfg, prompts, self.tx, reward=reward)
    self.rec = Recorder(self.rl_step)
    self.params = jax.tree.map(jnp.array, lm.params)  # a copy: the update donates its inputs
    self.opt_state = self.tx.init(self.params)
    self.rows, self.costs = [], {}

  def measured(self) -> int:
    return sum(r["role"] == "measured" for r in self.rows)

  def step(self) -> None:
    i = len(self.rows)
    c0 = timing.COMPILE_CLOCK.count
    t0 = time.perf_counter()
    self.params, self.opt_state, m = self.rl_step(self.params, self.opt_state, i, None, None)
    jax.block_until_ready(self.params)
    total = time.perf_counter() - t0
    compiles = timing.COMPILE_CLOCK.count - c0
    calls, boundaries = self.rec.take()
    key = _signature(calls)
    if key not in self.costs:
      self.costs[key] = {**update_cost(self.rl_step, self.tx, calls, self.rec.programs), "shapes": len(self.costs)}
    warm = sum(r["role"] == "warm-up" for r in self.rows) < self.warmup
    role = "skipped" if m["skipped"] else "warm-up" if warm else "measured"  # a skipped step ran no update
    r = {
      "step": i,
      "role": role,
      **{p: float(m[f"time_{p}"]) for p in PHASES},
      "total": total,
      "xla_compiles": compiles,
      "boundaries": boundaries,
      "update_flops": self.costs[key]["flops"],
      "update_flops_as_compiled": self.costs[key]["as_compiled"],
      "update_shapes": self.costs[key]["shapes"],  # which of the update's argument shapes so far (0, 1, ...)
      "metrics": {k: float(v) for k, v in m.items()},
    }
    self.rows.append(r)
    log(
      f"  {self.name} step {i} ({role}): rollout {r['rollout']:.2f} s, probing {r['probe']:.2f} s, update "
      f"{r['update']:.2f} s ({r['update_flops'] / 1e9:.1f} GFLOP), total {total:.2f} s; {boundaries} boundaries, "
      f"{compiles} compiles"
    )
    if sum(r["role"] == "skipped" for r in self.rows) > MAX_SKIPPED:
      raise ReprobeError(f"bench.rl: {self.name}: {MAX_SKIPPED + 1} steps trained nothing (every group was dropped)")

  def summary(self) -> dict:
    """Medians over the measured steps that compiled nothing (a step that meets a new update shape, e.g. a longer
    batch's response columns, spends seconds compiling once in a run: not the step's cost); over every measured step
    when each compiled something (`steady_steps` says how many were read)."""
    measured = [r for r in self.rows if r["role"] == "measured"]
    timed = [r for r in measured if r["xla_compiles"] == 0] or measured
    keys = PHASES + ("total", "update_flops")
    return {
      "steady_steps": len(timed),
      "median": {k: statistics.median(r[k] for r in timed) for k in keys},
      "min": {k: min(r[k] for r in timed) for k in keys},  # the least disturbed step, a cross-check on shared cores
      "steps": self.rows,
      "steady_compiles": sum(r["xla_compiles"] for r in measured),
      "boundaries_per_step": statistics.median(r["boundaries"] for r in timed),
    }


def measure(lm, cfg, pcfg, sizes: Sizes, reward) -> dict[str, dict]:
  """Every method of METHODS: each warmed up, then their measured steps in turn (DAPO's step i, SPAE's step i, ...),
  so that load from other processes on shared cores falls on both alike. {method: `Method.summary()`}."""
  total = sizes.steps + sizes.warmup - 1
  runs = [Method(lm, dataclasses.replace(cfg, advantage=name), pcfg, total, reward, sizes.warmup) for name in METHODS]
  for m in runs:
    log(f"{m.name}: {sizes.warmup} warm-up step(s)")
    while sum(r["role"] == "warm-up" for r in m.rows) < sizes.warmup:
      m.step()
  log(f"{' and '.join(METHODS)} in turn: {sizes.steps} measured steps each")
  while any(m.measured() < sizes.steps for m in runs):
    for m in runs:
      if m.measured() < sizes.steps:
        m.step()
  return {m.name: m.summary() for m in runs}


def goals(methods: dict, random_weights: bool) -> list[dict]:
  """The three goals as bench.run writes its own (goal, measured, target, status: met / missed / pending); on random
  weights the probing goals are pending (few paragraph boundaries: probing time is not what a target's is)."""
  spae, dapo = methods["spae"]["median"], methods["dapo"]["median"]
  why = "random weights: few paragraph boundaries to probe (build the target or pass --model)"
  rows = [
    (
      f"SPAE probing <= {PROBE_SHARE_GOAL:.0%} of the rollout's time",
      spae["probe"] / spae["rollout"],
      PROBE_SHARE_GOAL,
    ),
    (f"an SPAE step <= {SPAE_STEP_GOAL:g}x a DAPO step", spae["total"] / dapo["total"], SPAE_STEP_GOAL),
    (
      f"the update within {UPDATE_BOUND_GOAL:g}x of its FLOP bound (worse method)",
      max(methods[m]["update_of_bound"] for m in METHODS),
      UPDATE_BOUND_GOAL,
    ),
  ]
  out = [{"goal": g, "measured": v, "target": t, "status": "met" if v <= t else "missed"} for g, v, t in rows]
  if random_weights:
    for g in out[:2]:
      g["status"], g["note"] = "pending", why
  return out


def table(result: dict) -> list[str]:
  """The short table (docs/performance.md, "The RL step")."""
  peak = result["roofline"]["peak_flops_per_s"]
  lines = [
    "| method | rollout (s) | probing (s) | update (s) | step (s) | update GFLOP | update bound (s) | "
    "update / bound | boundaries probed | XLA compiles |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for name in METHODS:
    m = result["methods"][name]
    d = m["median"]
    lines.append(
      f"| {name.upper()} | {d['rollout']:.2f} | {d['probe']:.2f} | {d['update']:.2f} | {d['total']:.2f} | "
      f"{d['update_flops'] / 1e9:.1f} | {d['update_flops'] / peak:.3f} | {m['update_of_bound']:.1f}x | "
      f"{m['boundaries_per_step']:g} | {m['steady_compiles']} |"
    )
  env, roof = result["environment"], result["roofline"]
  steady = ", ".join(f"{n.upper()} {result['methods'][n].get('steady_steps', '?')}" for n in METHODS)
  lines += [
    "",
    f"Medians over the measured steps that compiled nothing ({steady}) of {result['sizes']['steps']}, after "
    f"{result['sizes']['warmup']} warm-up step(s); XLA compiles: during all measured steps."
    f" Matmul bound {peak / 1e9:.0f} GFLOP/s ({roof['peak_from']}); 1-min load {env['load_start'][0]:.2f} at "
    f"start, {env['load_end'][0]:.2f} at end.",
  ]
  lines += ["", "| goal | measured | target | status |", "|---|---|---|---|"]
  for g in result["goals"]:
    val = "-" if g["measured"] is None else f"{g['measured']:.3g}"
    lines.append(f"| {g['goal']} | {val} | {g['target']:g} | {g['status']} |")
  return lines


def run(model: str, out_dir: str, sizes: Sizes, *, quick: bool) -> dict:
  """Measures both methods and the roofline; writes `<out_dir>/rl.json`; returns the result."""
  t_start = time.perf_counter()
  check_model(model)
  config = load_config()
  cfg, pcfg = configs(config, quick)
  mach = describe()
  env = dict(
    jax=jax.__version__, jax_backend=jax.default_backend(), machine=str(mach), machine_detail=mach.long(), cpu=mach.cpu
  )
  env.update(threads=timing.threads(), load_start=list(os.getloadavg()))
  log(f"machine: {env['machine_detail']}; 1-min load {env['load_start'][0]:.2f}")
  lm, source, reward, random_weights = policy(config, model, quick)
  log(f"policy: {source}")
  rows = cfg.prompts_per_step * cfg.group_size
  length = bucket(64) + -(-cfg.max_new_tokens // 64) * 64  # the update's columns at most (prompt bucket + response)
  shapes = timing.gemm_shapes(lm.config, (rows // cfg.mini_batches * length, rows * length))
  log(f"roofline: fp32 matmul on {len(shapes)} GEMM shapes and {sizes.matmul_n}^3, best of {sizes.repeats}")
  peaks = timing.matmul_peaks(shapes, sizes.matmul_n, sizes.repeats)
  methods = measure(lm, cfg, pcfg, sizes, reward)
  if not quick:
    log("roofline, second pass")
    peaks = timing.best_of(peaks, timing.matmul_peaks(shapes, sizes.matmul_n, sizes.repeats))
  peak = peaks["peak_flops_per_s"]
  log(f"  matmul bound {peak / 1e9:.0f} GFLOP/s ({peaks['peak_from']})")
  for m in methods.values():
    timed = [r for r in m["steps"] if r["role"] == "measured"]
    for r in m["steps"]:
      r["update_bound_s"] = r["update_flops"] / peak
      r["update_of_bound"] = r["update"] / r["update_bound_s"] if r["update_flops"] > 0 else None
    m["update_of_bound"] = statistics.median(r["update_of_bound"] for r in timed)
  env["load_end"] = list(os.getloadavg())
  result = {
    "quick": quick,
    "config": CONFIG,
    "model": {
      "source": source,
      "random_weights": random_weights,
      "reward": "a hash coin of the response text" if reward is not None else "the task's answer check",
      "params": int(sum(x.size for x in jax.tree.leaves(lm.params))),
      "config": {k: getattr(lm.config, k) for k in ("vocab_size", "hidden_size", "num_layers", "num_heads")},
    },
    "rl_config": {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("advantage", "data")},
    "probe_config": dataclasses.asdict(pcfg),
    "sizes": dataclasses.asdict(sizes),
    "environment": env,
    "roofline": peaks,
    "methods": methods,
    "goals": goals(methods, random_weights),
  }
  result["wall_s"] = time.perf_counter() - t_start
  path = os.path.join(out_dir, "rl.json")
  write_json(path, result, indent=2)
  log(f"wrote {path} in {result['wall_s']:.0f} s")
  return result


def parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m bench.rl", description=__doc__.split("\n\n")[1])
  p.add_argument("--model", default="auto", help="auto (default), random, build, or a model folder")
  p.add_argument("--steps", type=int, default=None, help=f"measured steps per method (default {Sizes.steps})")
  p.add_argument("--warmup", type=int, default=None, help=f"warm-up steps per method (default {Sizes.warmup})")
  p.add_argument("--out", default="bench_results", help="writes rl.json here (default: bench_results/)")
  p.add_argument("--quick", action="store_true", help="a tiny random model and RL config: a smoke run")
  return p.parse_args(argv)


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  sizes = QUICK if args.quick else Sizes()
  try:
    if args.steps is not None:
      if args.steps < 1:
        raise ConfigError(f"--steps: expected >= 1 measured steps, got {args.steps}")
      sizes = dataclasses.replace(sizes, steps=args.steps)
    if args.warmup is not None:
      if args.warmup < 1:
        raise ConfigError(f"--warmup: expected >= 1 warm-up steps, got {args.warmup}")
      sizes = dataclasses.replace(sizes, warmup=args.warmup)
    result = run(args.model, args.out, sizes, quick=args.quick)
  except ReprobeError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  env = result["environment"]
  print(f"The RL step, {result['model']['source']}; {env['machine_detail']}; median of {sizes.steps} step(s):\n")
  print("\n".join(table(result)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
