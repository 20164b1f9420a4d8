"""The probe-guided beam search data-parallel: problems per second on 8 devices against one, the same problems and
search (an info row of the `search` section; docs/performance.md, "Beam search on 8 devices").

Each side runs in a fresh process on the same saved target: `python -m bench.sharded SIDE.json`, one with
`XLA_FLAGS=--xla_force_host_platform_device_count=8` and the target loaded on a (data=8) mesh (rows, their KV cache,
buffers and scores split over the devices, docs/scale.md), one on a single device. On a CPU the 8 devices are XLA's
virtual host devices sharing the machine's cores: no side has more compute, so the ratio measures what sharding the
program costs (the per-device programs, the collectives of the selection's gathers), not a speed-up. On 8
accelerators the same program splits the rows. No goal: it is reported as information.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile

from reprobe_jax.errors import ConfigError
from reprobe_jax.models import LanguageModel
from reprobe_jax.tts import SearchConfig


def side(spec_path: str) -> dict:
  """One side, in this process: the target from its folder (on a data mesh of every device when there are several),
  a probe at the paper's shape over the last hidden state (random weights: only its cost matters), the beam search
  timed as `bench.timing.time_call` times it."""
  import jax
  from flax import nnx

  from bench.timing import time_call
  from reprobe_jax.eval.machine import describe
  from reprobe_jax.features import FeatureSpec, model_fingerprint
  from reprobe_jax.models import load_pretrained, make_mesh
  from reprobe_jax.probe import Probe, ProbeConfig
  from reprobe_jax.probe.bundle import ProbeBundle
  from reprobe_jax.scorers import ProbeScorer
  from reprobe_jax.tts.beam import beam_search

  with open(spec_path) as f:
    spec_in = json.load(f)
  devices = jax.device_count()
  lm = load_pretrained(spec_in["model"], mesh=make_mesh(data=devices) if devices > 1 else None)
  features = FeatureSpec.from_name("hidden")
  pcfg = ProbeConfig(feature_dim=features.dim(lm.config))
  params = nnx.split(Probe(pcfg, rngs=nnx.Rngs(0)))[1]
  probe = ProbeScorer(ProbeBundle.create(pcfg, params, features, model_fingerprint(lm)))
  cfg = SearchConfig(**{k: v for k, v in spec_in["config"].items() if k != "sampling"})
  prompts = spec_in["prompts"]
  t, res = time_call(lambda: beam_search(lm, probe, prompts, cfg, mode="line"), spec_in["repeats"])
  return {
    "devices": devices,
    "machine": str(describe()),
    "median_s": t.median_s,
    "first_s": t.first_s,
    "problems_per_s": len(prompts) / t.median_s,
    "sampled_steps": sum(r.sampled_steps for r in res),
    "selections": [[list(c.response_ids) for c in r.candidates] for r in res],
    "steady_compiles": t.steady_compiles,
  }


def run(lm: LanguageModel, prompts, cfg: SearchConfig, repeats: int, *, devices: int = 8, log=print) -> dict:
  """The row: each side in its own process (the 8-device one with the XLA flag), the same saved target, prompts and
  search; problems per second of each and their ratio (8 devices / one), and whether both selected the same steps."""
  if cfg.strategy != "beam":
    raise ConfigError(f"bench.sharded times beam search; got SearchConfig.strategy={cfg.strategy!r}")
  if len(prompts) * cfg.beams * cfg.n % devices:
    raise ConfigError(f"{len(prompts)} problems x B={cfg.beams} x N={cfg.n} rows do not split over {devices} devices")
  sides = {}
  with tempfile.TemporaryDirectory(prefix="bench-sharded-") as tmp:
    lm.save_pretrained(os.path.join(tmp, "model"))
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "sampling"}
    if cfg.sampling != SearchConfig().sampling:
      raise ConfigError("bench.sharded runs the default sampling of SearchConfig")
    spec_path = os.path.join(tmp, "side.json")
    with open(spec_path, "w") as f:
      json.dump({"model": os.path.join(tmp, "model"), "prompts": prompts, "config": config, "repeats": repeats}, f)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name, count in (("one", 1), ("sharded", devices)):
      env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
      flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
      env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={count}"])
      proc = subprocess.run(
        [sys.executable, "-m", "bench.sharded", spec_path], env=env, cwd=root, capture_output=True, text=True
      )
      if proc.returncode:
        raise RuntimeError(f"bench.sharded, the {count}-device side failed:\n{proc.stderr[-4000:]}")
      sides[name] = json.loads(proc.stdout.strip().splitlines()[-1])
  one, sharded = sides["one"], sides["sharded"]
  ratio = sharded["problems_per_s"] / one["problems_per_s"]
  log(
    f"  probe-guided beam search on {devices} CPU devices: {sharded['problems_per_s']:.2f} against "
    f"{one['problems_per_s']:.2f} problems/s on one ({ratio:.2f}x; {one['machine']})"
  )
  return {
    "name": "beam_search_8_devices_vs_one",
    "info": True,  # not a goal: on a CPU the devices share its cores (module docstring)
    "measures": "the sharded program's overhead: virtual CPU devices share the cores, no side has more compute",
    "problems": len(prompts),
    "config": config,
    "one": {k: v for k, v in one.items() if k != "selections"},
    "sharded": {k: v for k, v in sharded.items() if k != "selections"},
    "ratio": ratio,
    "same_selections": one["selections"] == sharded["selections"],
  }


if __name__ == "__main__":
  print(json.dumps(side(sys.argv[1])))
