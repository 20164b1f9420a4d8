"""Multi-process jobs: joining one (settings, the environment, errors that name what is wrong, in seconds) and two
local CPU processes of 4 devices each agreeing with one process of 8 devices on a sharded forward, `generate`, a
probe training step (and the Trainer's checkpoints) and feature extraction into one store.

The two-process check runs the same script (`_WORKER`) three times: once alone with 8 forced host devices (the
reference), then as processes 0 and 1 of a job with 4 each, joined through `maybe_initialize_distributed` on
127.0.0.1 (gloo collectives); each writes what it computed, and this process compares and reads the stores back.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from reprobe_jax.errors import DistributedError
from reprobe_jax.models import sharding
from reprobe_jax.models.sharding import DistributedConfig, maybe_initialize_distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CLUSTER_ENV = (
  "JAX_COORDINATOR_ADDRESS",
  "JAX_NUM_PROCESSES",
  "JAX_PROCESS_ID",
  "JAX_LOCAL_DEVICE_IDS",
  "SLURM_JOB_ID",
  "SLURM_NTASKS",
  "SLURM_NPROCS",
  "TPU_WORKER_HOSTNAMES",
  "MEGASCALE_COORDINATOR_ADDRESS",
)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(devices: int) -> dict:
  """A child's environment: the worktree's package first, CPU only, `devices` forced host devices, no cluster."""
  env = {k: v for k, v in os.environ.items() if k not in _CLUSTER_ENV}
  env["PYTHONPATH"] = os.pathsep.join([ROOT, os.path.join(ROOT, "tests")] + [p for p in [env.get("PYTHONPATH")] if p])
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env["JAX_PLATFORMS"] = "cpu"
  return env


# ------------------------------------------------------------------------------------------------ settings


def test_settings_come_from_the_config_else_the_environment():
  environ = {
    "JAX_COORDINATOR_ADDRESS": "10.0.0.1:8476",
    "JAX_NUM_PROCESSES": "4",
    "JAX_PROCESS_ID": " 3 ",
    "JAX_LOCAL_DEVICE_IDS": "0,1",
  }
  got = sharding._settings(DistributedConfig(process_id=2, where="--"), environ)
  assert got == {
    "coordinator_address": ("10.0.0.1:8476", "JAX_COORDINATOR_ADDRESS"),
    "num_processes": (4, "JAX_NUM_PROCESSES"),
    "process_id": (2, "--process_id"),
    "local_device_ids": ((0, 1), "JAX_LOCAL_DEVICE_IDS"),
  }
  assert sharding._settings(DistributedConfig(local_device_ids=("2", "3")), {}) == {
    "local_device_ids": ((2, 3), "DistributedConfig.local_device_ids")
  }  # the CLI's list flag gives strings


def test_one_host_is_left_alone():
  assert maybe_initialize_distributed(DistributedConfig(), environ={}) is False
  for environ in (
    {"TPU_WORKER_HOSTNAMES": "localhost"},  # a single-host TPU VM names only itself
    {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"},  # a SLURM job of one task
    {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:1", "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"},
  ):
    assert maybe_initialize_distributed(DistributedConfig(), environ=environ) is False, environ
  assert sharding._detected_cluster({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "16"}) == "a SLURM job of 16 tasks"
  assert sharding._detected_cluster({"TPU_WORKER_HOSTNAMES": "w0,w1,w2,w3"}) == "a Cloud TPU pod slice"


@pytest.mark.parametrize(
  "given, environ, match",
  [
    ({}, {"JAX_COORDINATOR_ADDRESS": "localhost"}, r"JAX_COORDINATOR_ADDRESS='localhost': expected 'host:port'"),
    ({"coordinator_address": "h:99999"}, {}, r"DistributedConfig.coordinator_address='h:99999'"),
    ({}, {"JAX_NUM_PROCESSES": "two"}, r"JAX_NUM_PROCESSES='two': expected an int >= 1"),
    ({"num_processes": 0, "where": "--"}, {}, r"--num_processes=0: expected an int >= 1"),
    ({"process_id": -1, "where": "--"}, {}, r"--process_id=-1: expected an int >= 0"),
    ({"process_id": True}, {}, r"DistributedConfig.process_id=True: expected an int >= 0"),
    ({}, {"JAX_LOCAL_DEVICE_IDS": "0,0"}, r"JAX_LOCAL_DEVICE_IDS='0,0': expected distinct"),
    ({"local_device_ids": ("0", "x")}, {}, r"DistributedConfig.local_device_ids=\('0', 'x'\): expected distinct"),
    ({"timeout_s": 0}, {}, r"DistributedConfig.timeout_s: expected an int >= 1"),
  ],
)
def test_malformed_settings_are_named(given, environ, match):
  """A given field is refused where the config is made; an environment variable where it is read."""
  with pytest.raises(DistributedError, match=match):
    maybe_initialize_distributed(DistributedConfig(**given), environ=environ)


def test_process_id_out_of_range_and_missing_settings_are_named():
  with pytest.raises(DistributedError, match=r"--process_id=2 is outside \[0, 2\) \(--num_processes=2\)"):
    maybe_initialize_distributed(DistributedConfig("127.0.0.1:1234", 2, 2, where="--"), environ={})
  environ = {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "4"}
  with pytest.raises(DistributedError, match=r"JAX_PROCESS_ID=4 is outside \[0, 4\) \(JAX_NUM_PROCESSES=4\)"):
    maybe_initialize_distributed(environ=environ)
  with pytest.raises(
    DistributedError,
    match=r"JAX_COORDINATOR_ADDRESS=127.0.0.1:1234 given, "
    r"--num_processes \(or JAX_NUM_PROCESSES\), --process_id \(or "
    r"JAX_PROCESS_ID\) not",
  ):
    maybe_initialize_distributed(DistributedConfig(where="--"), environ={"JAX_COORDINATOR_ADDRESS": "127.0.0.1:1234"})


def test_unreachable_coordinator_fails_within_the_timeout(monkeypatch):
  monkeypatch.setattr(sharding, "_backends_started", lambda: False)  # this test process has run jax already
  address = f"127.0.0.1:{_free_port()}"  # nobody listens there
  t0 = time.monotonic()
  with pytest.raises(DistributedError, match=rf"process 1 of 2: no coordinator at {address} within 1 s"):
    maybe_initialize_distributed(DistributedConfig(address, 2, 1, timeout_s=1), environ={})
  assert time.monotonic() - t0 < 3


def _meet(claims, timeout_s=1):
  """Runs `_rendezvous` for each (num_processes, process_id) claim in its own thread; {index: 'ok' or message}."""
  address, out = f"127.0.0.1:{_free_port()}", {}

  def one(i, n, pid):
    try:
      sharding._rendezvous(address, n, pid, timeout_s)
      out[i] = "ok"
    except DistributedError as e:
      out[i] = str(e)

  threads = [threading.Thread(target=one, args=(i, *c)) for i, c in enumerate(claims)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(10)
  return out


def test_rendezvous_lets_a_complete_job_through():
  assert _meet([(3, 2), (3, 0), (3, 1)]) == {0: "ok", 1: "ok", 2: "ok"}


def test_rendezvous_names_a_wrong_count_a_mismatch_and_a_taken_id():
  t0 = time.monotonic()
  out = _meet([(3, 0), (3, 1)])  # num_processes=3, two started: both hear it after the timeout
  assert time.monotonic() - t0 < 3
  assert "process 0: 2 of num_processes=3 processes reached the coordinator" in out[0]
  assert "process id(s) [2] did not" in out[0]
  assert out[1].startswith("process 1 of 3: the coordinator at 127.0.0.1:") and "process id(s) [2] did not" in out[1]
  out = _meet([(2, 0), (3, 1)])
  assert (
    out[0] == "process 0: process 1 was started with num_processes=3, process 0 with 2; every process needs the "
    "same count"
  )
  assert "refused the job: process 1 was started with num_processes=3" in out[1]
  out = _meet([(3, 0), (3, 1), (3, 1)])
  assert "two processes were started with process_id=1" in out[0]


def test_cli_stops_a_misconfigured_job_in_one_line_within_seconds():
  """train.py started as 2 processes of a job of 3 (the third never comes), and as process 1 of a job whose
  coordinator is absent: each prints one line `error: ...` and exits 1 about the timeout (15 s and 1 s) after
  jax's import."""
  config = "--config=configs/target_synthetic.py"
  # The job of 3 waits 15 s: its two processes import jax at different times under load (on CI process 1 came
  # more than 1 s after process 0's wait began), and the test is about the message, not the race.
  job = [config, f"--coordinator_address=127.0.0.1:{_free_port()}", "--distributed_timeout=15", "--num_processes=3"]
  lonely = [
    config,
    f"--coordinator_address=127.0.0.1:{_free_port()}",
    "--distributed_timeout=1",
    "--num_processes=2",
    "--process_id=1",
  ]
  t0 = time.monotonic()
  procs = [
    subprocess.Popen(
      [sys.executable, "train.py", *argv],
      cwd=ROOT,
      env=_env(1),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for argv in (job + ["--process_id=0"], job + ["--process_id=1"], lonely)
  ]
  errs = [p.communicate(timeout=200)[1] for p in procs]
  elapsed = time.monotonic() - t0
  lines = [[line for line in err.splitlines() if line.startswith("error: ")] for err in errs]
  for p, err, said in zip(procs, errs, lines):
    assert p.returncode == 1 and len(said) == 1, err[-3000:]
  assert lines[0][0].startswith("error: process 0: 2 of num_processes=3 processes reached the coordinator")
  assert "refused the job" in lines[1][0] and "process id(s) [2] did not" in lines[1][0]
  assert lines[2][0].startswith("error: process 1 of 2: no coordinator at 127.0.0.1:")
  # jax's own start-up would wait 300 s, then abort without a message. Alone this takes a few seconds; the bound
  # leaves room for three jax imports beside another test worker on 2 cores (30 s is tight there).
  assert elapsed < 120, elapsed


# ------------------------------------------------------------------------------------------------ two processes

_JOIN = textwrap.dedent("""
    import sys
    import numpy as np
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from jax.sharding import NamedSharding, PartitionSpec as P
    from reprobe_jax.models.sharding import barrier, failed_processes, make_mesh, maybe_initialize_distributed, to_host

    assert maybe_initialize_distributed()  # from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID
    assert maybe_initialize_distributed() is False  # once
    me = jax.process_index()
    assert (jax.process_count(), jax.device_count(), jax.local_device_count()) == (2, 8, 4)
    mesh = make_mesh(data=8)
    rows = np.arange(24.0).reshape(8, 3)  # each process puts its own 4 rows on its 4 devices
    x = jax.make_array_from_callback((8, 3), NamedSharding(mesh, P("data")), lambda at: rows[at])
    doubled = jax.jit(lambda a: 2 * a)(x)
    total = jax.jit(lambda a: (2 * a).sum(axis=0), out_shardings=NamedSharding(mesh, P()))(x)
    assert not doubled.is_fully_addressable
    np.testing.assert_array_equal(to_host(doubled), 2 * rows)
    # column sums of arange(24) in rows of 3: 0 + 3 + ... + 21 = 84, then 92 and 100; doubled
    assert to_host(total).tolist() == [168.0, 184.0, 200.0]
    barrier("test")
    assert failed_processes(me == 1) == [1] and failed_processes(False) == []
    print("JOINED", me)
""")


def test_two_processes_join_from_the_environment(tmp_path):
  """The real jax.distributed start-up behind the rendezvous, from the environment variables alone: a sum over an
  array whose rows live on both processes, `to_host`, `barrier` and `failed_processes`."""
  script = tmp_path / "join.py"
  script.write_text(_JOIN)
  port = _free_port()
  procs = []
  for i in (0, 1):
    env = dict(_env(4), JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i))
    procs.append(
      subprocess.Popen(
        [sys.executable, str(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
      )
    )
  for i, p in enumerate(procs):
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and f"JOINED {i}" in out, f"process {i}: exit {p.returncode}\n{err[-5000:]}"


_WORKER = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import optax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from conftest import make_word_tokenizer
    from test_probe_train import _examples
    from reprobe_jax.features import FeatureSpec, FeatureStore, extract
    from reprobe_jax.features import extraction
    from reprobe_jax.models import CaptureSpec, LanguageModel, ModelConfig, SamplingParams, load_pretrained
    from reprobe_jax.models.sharding import DistributedConfig, make_mesh, maybe_initialize_distributed, to_host
    from reprobe_jax.probe import ProbeConfig
    from reprobe_jax.probe.data import pack_shape, pack_steps
    from reprobe_jax.probe.train import new_probe, probe_loss
    from reprobe_jax.train.trainer import Trainer, TrainerConfig, make_train_step
    from reprobe_jax.trajectories import Trajectory

    role, out, port = sys.argv[1], sys.argv[2], sys.argv[3]
    if role != "alone":
      assert maybe_initialize_distributed(DistributedConfig(f"127.0.0.1:{port}", 2, int(role), timeout_s=60))
    me, many = jax.process_index(), jax.process_count() > 1
    assert jax.device_count() == 8 and jax.local_device_count() == (4 if many else 8), jax.devices()
    results = {}

    # ---- the same random model on every process; the sharded copy spans both processes' devices
    cfg = ModelConfig(family="llama", vocab_size=101, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=128, eos_token_ids=(2,), pad_token_id=0)
    local = LanguageModel.random(cfg, seed=0, tokenizer=make_word_tokenizer())
    local.save_pretrained(os.path.join(out, f"model_{role}"))  # one folder per process: saves are not shared
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    lm = load_pretrained(os.path.join(out, f"model_{role}"), mesh=mesh)

    # ---- (a) forward
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 100, size=(8, 12)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, :3] = mask[5, :7] = 0  # left padding
    fwd = lm.forward(ids, mask, capture=CaptureSpec(hidden_layers=(1,)))
    results["forward_spans"] = not fwd.logits.is_fully_addressable
    results["logits"], results["hidden_1"] = to_host((fwd.logits, fwd.hidden_states[1]))

    # ---- (b) generate: greedy, and seeded sampling with 2 rows per prompt; the decode state spans processes
    prompts = [[1, 5, 9, 33], [1, 7], [1, 60, 61, 62, 63, 4], [1, 64, 65], [1, 8], [1, 9, 10], [1, 11], [1, 12, 13]]
    greedy = lm.generate(prompts, SamplingParams(temperature=0.0), max_new_tokens=8)
    sampled = lm.generate(prompts, SamplingParams(1.0, top_k=20), max_new_tokens=8, n=2, seed=3)
    smp = lm.sampler(SamplingParams(temperature=0.0))
    state = smp.decode(smp.prefill(prompts, max_new_tokens=8))
    results["state_spans"] = not state.tokens.is_fully_addressable
    read = [r.tokens + [0] * (8 - len(r.tokens)) for r in smp.read(state)]  # padded with 0 as generate pads
    results.update(greedy_tokens=greedy.tokens, greedy_logprobs=greedy.logprobs, sampled_tokens=sampled.tokens,
                   sampled_logprobs=sampled.logprobs, read_tokens=np.asarray(read))

    # ---- (c) two probe training steps: parameters replicated, the batch's trajectories split over 8 devices
    exs = _examples(16, 0)
    pcfg = ProbeConfig(feature_dim=8, d_model=16, n_layers=1, n_heads=2, ff_dim=32, dropout=0.1)
    graphdef, params, rest = new_probe(pcfg, 0)
    # SGD: an update proportional to the gradient (Adam would blow the rounding noise of gradients that are 0 in
    # exact arithmetic, such as the attention's key bias, up to whole steps)
    tx = optax.sgd(0.5)
    step = make_train_step(probe_loss(graphdef, 3.0), tx)
    shape = pack_shape([exs], 16, labelled_only=True)
    feats, pack, labels, _ = pack_steps(exs, shape, 8, labelled_only=True)
    flat = make_mesh(data=8, fsdp=1, tensor=1)
    rows_split, everywhere = NamedSharding(flat, P("data")), NamedSharding(flat, P())
    def place(x, sharding):  # each process puts its own devices' parts (device_put would compare the processes'
      return jax.make_array_from_callback(x.shape, sharding, lambda at: x[at])  # copies: NaN != NaN)
    batch = {"features": place(feats, rows_split), "pack": jax.tree.map(lambda x: place(x, everywhere), pack),
             "labels": place(labels, everywhere)}
    p = jax.tree.map(lambda x: place(x, everywhere), to_host(params))
    o = tx.init(p)
    for i in range(2):
      p, o, metrics = step(p, o, batch, jax.random.fold_in(jax.random.key(0), i), rest)
    results["batch_spans"] = not batch["features"].is_fully_addressable
    results["probe_params"] = np.concatenate([np.ravel(x) for x in jax.tree.leaves(to_host(p))])
    results["probe_loss"] = to_host(metrics["loss"])

    # ---- (c') the Trainer on process-local state: orbax saves it from every process, and a second fit restores it
    def batches(i):
      return {"features": feats, "pack": pack, "labels": labels}
    tx = optax.adamw(1e-2)  # its state (moments and a count) is saved and restored too
    loop = TrainerConfig(steps=2, checkpoint_every=1, log_every=1)
    first = Trainer(probe_loss(graphdef, 3.0), tx, loop, os.path.join(out, "trainer")).fit(params, batches,
                                                                                           frozen=rest)
    again = Trainer(probe_loss(graphdef, 3.0), tx, loop, os.path.join(out, "trainer")).fit(
        new_probe(pcfg, 0)[1], batches, frozen=rest)  # resumes at step 2: nothing left to run
    results["trainer_params"] = np.concatenate([np.ravel(x) for x in jax.tree.leaves(to_host(first.params))])
    results["trainer_restored"] = np.concatenate([np.ravel(x) for x in jax.tree.leaves(to_host(again.params))])
    results["trainer_loss"] = np.asarray(first.metrics["loss"])

    # ---- (d) feature extraction, with the sharded model (every process runs every forward) and with the local one
    # (each process computes the shards it writes); 7 records in shards of 2: shards 0 and 2 are process 0's
    written = []
    real = extraction._atomic_bytes
    def logged(path, data):
      written.append(os.path.basename(path))
      real(path, data)
    extraction._atomic_bytes = logged
    recs = [Trajectory(f"t{i}", "", "", "line", (),
                       prompt_ids=tuple(rng.integers(3, 100, int(rng.integers(2, 7))).tolist()),
                       response_ids=tuple(rng.integers(3, 100, int(rng.integers(2, 9))).tolist())) for i in range(7)]
    spec = FeatureSpec.from_name("hidden+logit", hidden_layers=(0, -1))
    for name, model in (("store_sharded", lm), ("store_local", local)):
      written.clear()
      store = extract(model, recs, spec, os.path.join(out, name), shard_size=2, batch_size=4)
      assert sorted(store.ids) == sorted(r.id for r in recs)
      with open(os.path.join(out, f"{name}_writes_{role}.json"), "w") as f:
        json.dump(sorted(set(written)), f)
    if me == 0:
      np.savez(os.path.join(out, "results.npz"), **results)
    print("WORKER OK", role)
""")


def _run_worker(tmp_path, roles, devices):
  """Runs the worker once per role at the same time; each role's folder (shared by a job's processes) holds what
  the job computed."""
  script = tmp_path / "worker.py"
  script.write_text(_WORKER)
  port = str(_free_port())
  out = tmp_path / ("job" if len(roles) > 1 else "alone")
  out.mkdir()
  procs = [
    subprocess.Popen(
      [sys.executable, str(script), role, str(out), port],
      cwd=ROOT,
      env=_env(devices),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for role in roles
  ]
  for role, p in zip(roles, procs):
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0 and f"WORKER OK {role}" in stdout, (
      f"{role}: exit {p.returncode}\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-8000:]}"
    )
  return out


@pytest.mark.slow  # 70 s on 2 CPU cores, 4 minutes when they are busy: mostly compiling for 8 devices, 3 times
def test_two_processes_agree_with_one(tmp_path):
  from reprobe_jax.features import FeatureStore

  alone = _run_worker(tmp_path, ["alone"], 8)
  job = _run_worker(tmp_path, ["0", "1"], 4)
  a, b = np.load(alone / "results.npz"), np.load(job / "results.npz")
  # The arrays really spanned both processes (and did not on one).
  for k in ("forward_spans", "state_spans", "batch_spans"):
    assert bool(b[k]) and not bool(a[k]), k
  # (a) a sharded forward
  np.testing.assert_allclose(b["logits"], a["logits"], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(b["hidden_1"], a["hidden_1"], atol=1e-5, rtol=1e-5)
  assert a["logits"].shape == (8, 12, 101)
  # (b) generate, and the sampler's rows read back from both processes
  for k in ("greedy_tokens", "sampled_tokens", "read_tokens"):
    np.testing.assert_array_equal(b[k], a[k], err_msg=k)
  np.testing.assert_array_equal(b["read_tokens"], b["greedy_tokens"])
  assert a["sampled_tokens"].shape == (16, 8)
  for k in ("greedy_logprobs", "sampled_logprobs"):
    np.testing.assert_allclose(b[k], a[k], atol=1e-5, err_msg=k)
  # (c) the probe's parameters after two steps, and the Trainer's (its checkpoint restored to the same values)
  np.testing.assert_allclose(b["probe_params"], a["probe_params"], atol=1e-6)
  np.testing.assert_allclose(b["probe_loss"], a["probe_loss"], rtol=1e-6)
  np.testing.assert_allclose(b["trainer_params"], a["trainer_params"], atol=1e-6)
  np.testing.assert_array_equal(b["trainer_restored"], b["trainer_params"])
  np.testing.assert_allclose(b["trainer_loss"], a["trainer_loss"], rtol=1e-6)
  # Training moved the parameters: the comparison above could fail.
  from reprobe_jax.probe import ProbeConfig
  from reprobe_jax.probe.train import new_probe
  import jax

  start = np.concatenate(
    [
      np.ravel(x)
      for x in jax.tree.leaves(
        jax.device_get(
          new_probe(ProbeConfig(feature_dim=8, d_model=16, n_layers=1, n_heads=2, ff_dim=32, dropout=0.1), 0)[1]
        )
      )
    ]
  )
  assert np.abs(b["probe_params"] - start).max() > 1e-3
  # (d) one store per model, its shards written by disjoint processes (shard k by process k % 2), the manifest by
  # process 0 alone; this one process reads every record back, equal to the one-process store's.
  for name in ("store_sharded", "store_local"):
    w0, w1 = (set(json.loads((job / f"{name}_writes_{i}.json").read_text())) for i in (0, 1))
    assert w0 == {"shard_00000.npz", "shard_00002.npz", "manifest.json"}, w0
    assert w1 == {"shard_00001.npz", "shard_00003.npz"}, w1
    whole, ref = FeatureStore(str(job / name)), FeatureStore(str(alone / name))
    assert whole.manifest["complete"] and [s["file"] for s in whole.manifest["shards"]] == [
      f"shard_{k:05d}.npz" for k in range(4)
    ]
    assert sorted(whole.ids) == [f"t{i}" for i in range(7)] == sorted(ref.ids)
    assert whole.manifest["model_fingerprint"] == ref.manifest["model_fingerprint"]
    for tid in ref.ids:
      np.testing.assert_allclose(whole[tid], ref[tid], atol=1e-5, rtol=1e-5, err_msg=f"{name} {tid}")
