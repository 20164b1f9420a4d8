"""The prepared GPU check (bench/gpu_check.sh, bench/gpu.py): its quick path runs every step on a CPU (slow), its
summary holds every step with a status and a reason, a figure above its bound fails it, bad arguments are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # bench/ sits next to the package, which plain `pytest` does not put on sys.path

from bench import gpu, report  # noqa: E402
from reprobe_jax.errors import ConfigError  # noqa: E402

SCRIPT = os.path.join(ROOT, "bench", "gpu_check.sh")


def _table(md: str) -> dict[str, tuple[str, str]]:
  """summary.md's step table: {step: (status, detail)}."""
  rows = {}
  for line in md.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 4 and cells[0] in gpu.STEPS + ("bounds",):
      rows[cells[0]] = (cells[1], cells[3])
  return rows


def _script(*args, env=None, timeout=60):
  return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.mark.slow  # the whole quick check: a few minutes on 2 cores
def test_quick_check_on_a_cpu_records_every_step_with_a_status(tmp_path):
  out = tmp_path / "out"
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHON": sys.executable}
  env.pop("OUT", None)
  done = _script("--quick", str(out), env=env, timeout=900)
  md = (out / "summary.md").read_text()
  rows = _table(md)
  assert set(rows) == set(gpu.STEPS) | {"bounds"}, md
  for step, (status, detail) in rows.items():
    assert status in gpu.STATUSES, (step, status)
    assert status == "ran" or detail, f"{step} is {status} without a reason"
  failed = [s for s, (status, _) in rows.items() if status == "failed"]
  assert done.returncode == (1 if failed else 0), (done.returncode, failed, done.stdout[-3000:])
  # Every step's code path ran; only Gemma 3 is left to the full run.
  assert not failed, (failed, done.stdout[-3000:])
  assert rows["bench_gemma3"][0] == "skipped"
  assert md.startswith("# GPU check: ") and md in done.stdout
  summary = json.loads((out / "summary.json").read_text())
  assert [s["step"] for s in summary["steps"]] == list(gpu.STEPS) + ["bounds"]
  assert summary["bound_checks"] and all(c["status"] == "ok" for c in summary["bound_checks"])
  # What the device tool brings back: at most 8 files, none deeper than 2 folders.
  assert sorted(os.listdir(out)) == ["detail.tar.gz", "log.txt", "steps.tsv", "summary.json", "summary.md"]
  with tarfile.open(out / "detail.tar.gz") as tar:
    names = set(tar.getnames())
  for name in ("bench_smollm2/results.json", "rl/rl.json", "roofline/roofline.json", "parity_f32.xml"):
    assert f"detail/{name}" in names, name


def test_summary_holds_every_step_and_a_missing_record_is_a_failure(tmp_path):
  (tmp_path / "steps.tsv").write_text(
    "setup\tran\t3\tinstalled: none\n"
    "parity_f32\tfailed\t70\ttimed out after 70 s; last: ....\n"
    "bench_gemma3\tskipped\t0\tGemma 3 270M's GGUF is not installed\n"
  )
  assert gpu.write_summary(str(tmp_path)) == 1
  rows = _table((tmp_path / "summary.md").read_text())
  assert rows["setup"] == ("ran", "installed: none")
  assert rows["parity_f32"] == ("failed", "timed out after 70 s; last: ....")
  assert rows["bench_gemma3"][0] == "skipped"
  for step in ("parity_bf16", "bench_smollm2", "rl", "roofline"):
    assert rows[step] == ("failed", "no record: the script stopped before it")
  assert rows["bounds"][0] == "skipped"


def test_a_figure_above_its_bound_fails_the_check(tmp_path):
  (tmp_path / "steps.tsv").write_text("".join(f"{s}\tran\t1\tok\n" for s in gpu.STEPS))
  detail = tmp_path / "detail"
  (detail / "roofline").mkdir(parents=True)
  (detail / "bench_smollm2").mkdir()
  roof = {"f32_bound": 50e12, "f32_bound_from": "torch float32 8192^3", "bf16_bound": 700e12}
  roof |= {"bf16_bound_from": "jax bfloat16 8192^3", "bandwidth_bound": 3e12, "bandwidth_bound_from": "copy (jax)"}
  (detail / "roofline" / "roofline.json").write_text(json.dumps(roof))
  prefill = {"ours_flops_per_s": 60e12, "hf_flops_per_s": 20e12}  # ours above the f32 bound: a harness error
  decode = {"ours_bytes_per_s": 1e12, "hf_bytes_per_s": 0.5e12}
  res = {"model": "smollm2", "source": "SmolLM2.gguf", "environment": {"jax_backend": "gpu", "torch_device": "cuda"}}
  res |= {"rows": [], "roofline": {"prefill_plain": prefill, "decode_b1": decode, "harness_errors": []}}
  (detail / "bench_smollm2" / "results.json").write_text(json.dumps(res))
  assert gpu.write_summary(str(tmp_path)) == 1
  md = (tmp_path / "summary.md").read_text()
  assert _table(md)["bounds"] == ("failed", "1 of 4 figures above their bound (harness errors)")
  checks = {c["figure"]: c for c in json.loads((tmp_path / "summary.json").read_text())["bound_checks"]}
  assert checks["bench_smollm2 prefill_plain reprobe-jax FLOP rate"]["status"] == report.HARNESS_ERROR
  assert checks["bench_smollm2 prefill_plain PyTorch FLOP rate"]["fraction"] == pytest.approx(0.4)
  assert checks["bench_smollm2 batch-1 decode reprobe-jax weight-read rate"]["fraction"] == pytest.approx(1 / 3)
  assert "**Harness error**: bench_smollm2 prefill_plain reprobe-jax FLOP rate: measured 60 TFLOP/s" in md


def test_a_malformed_steps_file_is_named(tmp_path):
  (tmp_path / "steps.tsv").write_text("setup\tran\t3\tok\nrl\tfinished\t3\tok\n")
  with pytest.raises(ConfigError, match=r"steps.tsv:2: expected .*ran\|skipped\|failed"):
    gpu.read_steps(str(tmp_path / "steps.tsv"))
  assert gpu.main(["summary", str(tmp_path / "nowhere")]) == 1


def test_the_script_refuses_bad_arguments_before_any_work(tmp_path):
  done = _script("--fast", str(tmp_path))
  assert done.returncode == 2 and "unknown flag --fast" in done.stderr
  done = _script(str(tmp_path / "no" / "such" / "out"))
  assert done.returncode == 2 and f"parent {tmp_path / 'no' / 'such'} does not exist" in done.stderr
  done = _script(str(tmp_path / "a"), str(tmp_path / "b"))
  assert done.returncode == 2 and "one output folder expected" in done.stderr
  assert os.listdir(tmp_path) == []


def test_bench_run_refuses_bad_batches_and_device_counts(capsys):
  from bench import run

  assert run.parse_batches("1, 32,256") == (1, 32, 256)
  for bad in ("0", "1,x", ""):
    with pytest.raises(ConfigError, match="--decode-batches"):
      run.parse_batches(bad)
  assert run.main(["--model=tiny", "--sharded-devices=-1", "--quick"]) == 1
  assert "--sharded-devices: expected 0 (none) or a device count, got -1" in capsys.readouterr().err
