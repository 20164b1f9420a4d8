"""SPAE, the probe bundle and the CLI's flag names under hostile input: every mistake is one typed error naming the
argument (and index), the flag the user typed, or the file, line and field, found before any work is done; stored
rows and bundles are sealed and checked when read back, and no file read blocks."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import types

import ml_collections
import numpy as np
import pytest

from configs import reprobe_synthetic, rl_synthetic, spae_synthetic, target_synthetic, tts_synthetic
from reprobe_jax.errors import CacheFullError, CheckpointError, ConfigError, DataFormatError
from reprobe_jax.features import FeatureSpec
from reprobe_jax.io import write_jsonl, write_seal
from reprobe_jax.jobs import rl as rl_job
from reprobe_jax.jobs import spae as job
from reprobe_jax.jobs import spae_report
from reprobe_jax.jobs import target_config
from reprobe_jax.jobs.bands import check_seeds as check_config_seeds
from reprobe_jax.jobs.cli import job_section, reprobe_setup
from reprobe_jax.models import SamplingParams
from reprobe_jax.probe import ProbeBundle, load_probe, save_probe
from reprobe_jax.probe import ProbeConfig as ProbeModelConfig
from reprobe_jax.probe.train import new_probe
from reprobe_jax.rl.advantages import AdvantageConfig
from reprobe_jax.spae.decode import decode_thinking, trajectory_seed
from reprobe_jax.spae.potential import ProbeConfig, StepPotentials, saturated, step_potential
from reprobe_jax.spae.prober import Prober, cut_keys
from reprobe_jax.tasks import make_problems
from reprobe_jax.trajectories import prompt_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def probing(synthetic_lm):
  """(lm, prober, prompt ids, response ids, answers) of two short thinking trajectories (nothing probed here)."""
  lm = synthetic_lm
  problems = make_problems("arithmetic", 2, 11, 1)
  prompts = lm.encode([prompt_text(lm, p, "thinking") for p in problems])
  tok = lm.tokenizer
  responses = [tok("<think>\nStep 1: 3 + 4 = 7.\n\n", add_special_tokens=False)["input_ids"] for _ in problems]
  return lm, Prober(lm, ProbeConfig(samples=2, max_tokens=3)), prompts, responses, [p.answer for p in problems]


# ------------------------------------------------------------------------------------------------ seed arguments


@pytest.mark.parametrize(
  "seeds, i", [([0, -1], 1), ([0, 2**32], 1), ([0, 1.0], 1), ([np.float64(3.0), 0], 0), ([True, 0], 0), ([0, "1"], 1)]
)
def test_potentials_trajectory_seeds_are_seeds(probing, seeds, i):
  lm, prober, prompts, responses, answers = probing
  with pytest.raises(ConfigError, match=rf"^potentials: trajectory_seeds\[{i}\]: expected a seed, an int in \[0, "):
    prober.potentials(prompts, responses, answers, seeds)


def test_every_seed_argument_of_spae_has_the_one_check(probing):
  lm, prober, prompts, _, answers = probing
  kw = dict(sampling=SamplingParams(temperature=0.6), max_new_tokens=8)
  with pytest.raises(ConfigError, match=r"^decode_thinking: prompt_seeds\[1\]: expected a seed"):
    decode_thinking(lm, prober, prompts, answers, [0, 2**32], **kw)
  with pytest.raises(ConfigError, match=r"^decode_thinking: prompt_seeds\[0\]: expected a seed"):
    decode_thinking(lm, prober, prompts, answers, [np.float32(1), 0], **kw)
  with pytest.raises(ConfigError, match=r"^decode_thinking: seed: expected a seed.*got -1$"):
    decode_thinking(lm, prober, prompts, answers, [0, 1], seed=-1, **kw)
  with pytest.raises(ConfigError, match=r"^decode_thinking: seed: expected a seed.*got 1\.5$"):
    decode_thinking(lm, prober, prompts, answers, [0, 1], seed=1.5, **kw)
  with pytest.raises(ConfigError, match=r"^decode_thinking: prompt_seeds: expected a sequence of seeds"):
    decode_thinking(lm, prober, prompts, answers, 7, **kw)
  with pytest.raises(ConfigError, match=r"^trajectory_seed: prompt_seed: expected a seed.*got 1\.5$"):
    trajectory_seed(1.5, 0, 2)  # was truncated to 1
  assert trajectory_seed(2**32 - 1, 1, 2) == (2 * (2**32 - 1) + 1) % 2**32
  with pytest.raises(ConfigError, match=r"^cut_keys: trajectory_seeds\[0\]: expected a seed"):
    cut_keys(0, [-1], np.zeros((1, 1), np.int32))
  with pytest.raises(ConfigError, match=r"^cut_keys: seed: expected a seed"):
    cut_keys(2**32, [0], np.zeros((1, 1), np.int32))
  state = types.SimpleNamespace(batch=2)  # the seeds are checked before the state is used
  cuts = np.zeros((2, 1), np.int32)
  with pytest.raises(ConfigError, match=r"^Prober\.probe_state: trajectory_seeds\[1\]: expected a seed"):
    prober.probe_state(state, cuts, cuts, prober.answer_ids(answers), [0, 2**40])


# ------------------------------------------------------------------------------------------------ typed arguments


@pytest.mark.parametrize("answer", [b"7", None, 7, 7.0, ["7"]])
def test_answers_must_be_strings(probing, answer):
  lm, prober, prompts, responses, answers = probing
  with pytest.raises(ConfigError, match=r"^potentials: answers\[1\]: expected the ground-truth answer as a string"):
    prober.potentials(prompts, responses, [answers[0], answer], [0, 1])
  with pytest.raises(ConfigError, match=r"^decode_thinking: answers\[1\]: expected the ground-truth answer"):
    decode_thinking(lm, prober, prompts, [answers[0], answer], [0, 1], sampling=SamplingParams(0.6), max_new_tokens=8)
  with pytest.raises(ConfigError, match=r"^potentials: answers: expected a sequence of answer strings"):
    prober.potentials(prompts, responses, "77", [0, 1])


@pytest.mark.parametrize(
  "change, match",
  [
    (lambda r: [r[0], r[1] + [10**9]], r"^potentials: response_ids\[1\]\[\d+\]: token id 1000000000 is outside"),
    (lambda r: [r[0], [-1] + r[1]], r"^potentials: response_ids\[1\]: token ids\[0\] must be an integer"),
    (lambda r: [r[0], r[1] + [2.0]], r"^potentials: response_ids\[1\]: token ids\[\d+\] must be an integer"),
    (lambda r: [r[0], "abc"], r"^potentials: response_ids\[1\]: token ids must be a sequence of integers"),
    (lambda r: [r[0], r[1] + [2**70]], r"^potentials: response_ids\[1\]: token ids\[\d+\] must be an integer"),
  ],
)
def test_response_ids_are_token_ids_of_the_model(probing, change, match):
  lm, prober, prompts, responses, answers = probing
  with pytest.raises(ConfigError, match=match):
    prober.potentials(prompts, change([list(r) for r in responses]), answers, [0, 1])


def test_other_arguments_are_named(probing):
  lm, prober, prompts, responses, answers = probing
  with pytest.raises(ConfigError, match=r"^potentials: prompt_ids\[0\]\[0\]: token id"):
    prober.potentials([[10**6], prompts[1]], responses, answers, [0, 1])
  with pytest.raises(ConfigError, match=r"^potentials: names: expected one name per trajectory \(2\)"):
    prober.potentials(prompts, responses, answers, [0, 1], names=["only one"])
  kw = dict(sampling=SamplingParams(0.6))
  with pytest.raises(ConfigError, match=r"^decode_thinking: max_new_tokens: expected an int >= 1, got 0$"):
    decode_thinking(lm, prober, prompts, answers, [0, 1], max_new_tokens=0, **kw)
  with pytest.raises(ConfigError, match=r"^decode_thinking: samples: expected an int >= 1, got 2\.0$"):
    decode_thinking(lm, prober, prompts, answers, [0, 1], max_new_tokens=8, samples=2.0, **kw)
  with pytest.raises(ConfigError, match=r"^decode_thinking: prober: expected a Prober of this model"):
    decode_thinking(lm, "prober", prompts, answers, [0, 1], max_new_tokens=8, **kw)


# ------------------------------------------------------------------------------------------------ eps_sat


@pytest.mark.parametrize("eps", [1.0, 1.5, -1.01, float("nan"), True])
def test_eps_sat_must_be_a_threshold_phi_can_cross(eps):
  with pytest.raises(ConfigError, match=r"^ProbeConfig\.eps_sat: expected a finite number in \[-1\.0, 1\.0\)"):
    ProbeConfig(eps_sat=eps)
  with pytest.raises(ConfigError, match=r"^config\.probe\.eps_sat: expected a "):
    job.probe_config_from_dict({"eps_sat": eps})
  with pytest.raises(ConfigError, match=r"eps_sat: expected a finite number in \[-1\.0, 1\.0\)"):
    AdvantageConfig(eps_sat=eps)
  with pytest.raises(ConfigError, match=r"^StepPotentials\.eps_sat"):
    StepPotentials.of([3], [1.0], [1.0], eps)


def test_eps_sat_bounds_are_exactly_the_reachable_ones():
  # Phi is in [-1, 1] (docs/method.md §B1): its corners are reached, and each allowed threshold leaves both outcomes
  corners = step_potential(np.array([1.0, 0.0]), np.array([1.0, 1.0]))
  assert corners.tolist() == [1.0, -1.0]
  for eps in (np.nextafter(1.0, 0.0), -1.0):
    assert ProbeConfig(eps_sat=float(eps)).eps_sat == eps
    assert saturated(corners, eps).tolist() == [True, False]
  with pytest.raises(ConfigError, match=r"^config\.probe\.suffix: expected a non-empty string"):
    job.probe_config_from_dict({"suffix": ""})


# ------------------------------------------------------------------------------------------------ stored rows


def _row(**change) -> dict:
  row = {
    "prompt_index": 0,
    "sample": 0,
    "response_ids": [5, 6, 7, 8, 9],
    "finish_reason": "eos",
    "truncated_at": None,
    "cuts": [1, 3],
    "acc": [0.25, None],
    "conf": [0.5, None],
  }
  row.update(change)
  return row


LIMITS = job.RowLimits(problems=2, samples=1, vocab=50, truncated=False, eps_sat=0.9)


def _rows_file(tmp_path, rows):
  path = str(tmp_path / "rows_arithmetic_plain.jsonl")
  write_jsonl(path, rows, seal=True)
  return path


def test_a_good_rows_file_reads_back(tmp_path):
  path = _rows_file(tmp_path, [_row(), _row(prompt_index=1, response_ids=[], cuts=[], acc=[], conf=[])])
  (l1, r1), (l2, r2) = job.read_rows(path, LIMITS)
  assert (l1, l2) == (1, 2) and r1.response_ids == (5, 6, 7, 8, 9) and len(r2.potentials) == 0
  np.testing.assert_allclose(r1.potentials.phi[:1], [1.5 * 0.125 + 0.125 - 0.5])
  assert np.isnan(r1.potentials.phi[1])


@pytest.mark.parametrize(
  "row, match",
  [
    (_row(acc=[5.0, None]), r":1: field 'acc\[0\]': expected a finite number in \[0\.0, 1\.0\], got float 5\.0"),
    (_row(conf=[-0.1, None]), r":1: field 'conf\[0\]': expected a finite number in \[0\.0, 1\.0\]"),
    (_row(acc=[True, None]), r":1: field 'acc\[0\]'.*got bool True"),
    (_row(acc=[0.5, 0.5]), r":1: field 'acc\[1\]': expected null exactly where the other"),
    (_row(acc=[0.5]), r":1: field 'acc': expected one value per cut \(2\)"),
    (_row(conf="0.5"), r":1: field 'conf': expected a list"),
    (
      _row(response_ids=[5, 10**9, 7, 8, 9]),
      r":1: field 'response_ids\[1\]': expected a token id, an int in \[0, 49\]",
    ),
    (_row(response_ids=[5, -3, 7, 8, 9]), r":1: field 'response_ids\[1\]': expected a token id.*got int -3"),
    (_row(response_ids=[5, 6.0, 7, 8, 9]), r":1: field 'response_ids\[1\]'.*got float 6\.0"),
    (_row(cuts=[1, 5]), r":1: field 'cuts\[1\]': expected an int in \[2, 4\], got int 5"),
    (_row(cuts=[3, 1]), r":1: field 'cuts\[1\]': expected an int in \[4, 4\]"),
    (_row(prompt_index=2), r":1: field 'prompt_index': expected an int in \[0, 1\], got int 2"),
    (_row(sample=-1), r":1: field 'sample': expected an int in \[0, 0\]"),
    (_row(finish_reason="done"), r":1: field 'finish_reason': expected one of 'length', 'eos'"),
    (_row(truncated_at=0), r":1: field 'truncated_at': expected one of None, got int 0"),
    (
      {k: v for k, v in _row().items() if k != "cuts"},
      r":1: a row has the fields .*; missing \['cuts'\], unknown \[\]",
    ),
    (_row(phi=[0.1, None]), r":1: a row has the fields .*; missing \[\], unknown \['phi'\]"),
    ([1, 2], r":1: expected a row \(a JSON object\), got list"),
  ],
)
def test_every_stored_row_is_checked(tmp_path, row, match):
  path = _rows_file(tmp_path, [row, _row(prompt_index=1)])  # sealed as written: only the values are wrong
  with pytest.raises(DataFormatError, match=rf"^{re.escape(path)}{match}"):
    job.read_rows(path, LIMITS)


def test_truncation_and_the_rows_set_are_checked(tmp_path):
  trunc = dataclasses.replace(LIMITS, truncated=True)
  path = _rows_file(tmp_path, [_row(truncated_at=1), _row(prompt_index=1, truncated_at=None)])
  assert [r.truncated_at for _, r in job.read_rows(path, trunc)] == [1, None]
  path = _rows_file(tmp_path, [_row(truncated_at=2), _row(prompt_index=1)])
  with pytest.raises(DataFormatError, match=r":1: field 'truncated_at': expected an int in \[0, 1\], got int 2"):
    job.read_rows(path, trunc)
  path = _rows_file(tmp_path, [_row(), _row()])
  with pytest.raises(DataFormatError, match=r":2: problem 0 sample 0 again \(first on line 1\)"):
    job.read_rows(path, LIMITS)
  path = _rows_file(tmp_path, [_row()])
  with pytest.raises(DataFormatError, match=r"rows_arithmetic_plain\.jsonl: 1 rows, expected 2 \(2 problems x 1"):
    job.read_rows(path, LIMITS)


def test_a_damaged_rows_file_is_refused_by_its_seal(tmp_path):
  path = _rows_file(tmp_path, [_row(), _row(prompt_index=1)])
  data = open(path, "rb").read()
  with open(path, "wb") as f:  # the last line cut short, as a full disk or a copy would leave it
    f.write(data[:-20])
  with pytest.raises(DataFormatError, match=r"does not match its seal"):
    job.read_rows(path, LIMITS)
  write_seal(path)  # sealed again: the cut line itself is named
  with pytest.raises(DataFormatError, match=rf"^{re.escape(path)}:2: invalid JSON"):
    job.read_rows(path, LIMITS)
  os.remove(path + ".sha256")
  with pytest.raises(DataFormatError, match=r"has no seal"):
    job.read_rows(path, LIMITS)
  with open(path, "w") as f:  # NaN is no JSON; Python's reader takes it
    f.write(json.dumps(_row()).replace("0.25", "NaN") + "\n" + json.dumps(_row(prompt_index=1)) + "\n")
  write_seal(path)
  with pytest.raises(DataFormatError, match=r":1: field 'acc\[0\]'.*got float nan"):
    job.read_rows(path, LIMITS)


SMALL = dict(problems=1, domains=("arithmetic",), difficulties=(1,), samples=2, max_new_tokens=12, batch_size=2)


@pytest.fixture(scope="module")
def spae_run(synthetic_lm, tmp_path_factory):
  """A finished tiny SPAE job: (workdir, its run folder, cfg, pcfg)."""
  cfg, pcfg = job.SPAEJobConfig(**SMALL), ProbeConfig(samples=2, max_tokens=3)
  workdir = str(tmp_path_factory.mktemp("spae"))
  folder = job.evaluate(synthetic_lm, cfg, pcfg, workdir)["directory"]
  return workdir, folder, cfg, pcfg


@pytest.mark.parametrize(
  "field, value, match",
  [
    ("acc", 5.0, r"field 'acc\[0\]': expected a finite number in \[0\.0, 1\.0\], got float 5\.0"),
    ("response_ids", 10**9, r"field 'response_ids\[0\]': expected a token id, an int in \[0, \d+\], got int 10+$"),
  ],
)
def test_the_job_reports_nothing_from_a_resealed_row_out_of_range(
  synthetic_lm, spae_run, tmp_path, field, value, match
):
  workdir, folder, cfg, pcfg = spae_run
  copy = str(tmp_path / "w")
  shutil.copytree(workdir, copy)
  path = os.path.join(copy, os.path.basename(folder), "rows_arithmetic_plain.jsonl")
  rows = [json.loads(line) for line in open(path)]
  row = rows[-1]
  row["response_ids"] = (row["response_ids"] or [5])[:]
  if field == "acc":  # one probed boundary at the first token, its Acc past 1
    row.update(cuts=[0], acc=[value], conf=[0.5])
  else:
    row["response_ids"][0] = value
  write_jsonl(path, rows, seal=True)  # a row changed and sealed again: its values are still checked
  with pytest.raises(DataFormatError, match=rf"^{re.escape(path)}:{len(rows)}: {match}"):
    job.evaluate(synthetic_lm, cfg, pcfg, copy)


def test_the_job_refuses_a_damaged_rows_file_and_a_changed_boundary(synthetic_lm, spae_run, tmp_path):
  workdir, folder, cfg, pcfg = spae_run
  copy = str(tmp_path / "w")
  shutil.copytree(workdir, copy)
  path = os.path.join(copy, os.path.basename(folder), "rows_arithmetic_truncated.jsonl")
  with open(path, "a") as f:
    f.write('{"prompt_index": 0')
  with pytest.raises(DataFormatError, match=rf"^{re.escape(path)}: rows_arithmetic_truncated\.jsonl does not match"):
    job.evaluate(synthetic_lm, cfg, pcfg, copy)
  rows = [json.loads(line) for line in open(path) if line.endswith("\n")]
  row = rows[0]
  if row["cuts"]:  # in range, but no longer the response's own boundaries
    row.update(cuts=row["cuts"][:-1], acc=row["acc"][:-1], conf=row["conf"][:-1], truncated_at=None)
  else:
    row.update(response_ids=row["response_ids"] or [5], cuts=[0], acc=[0.5], conf=[0.5])
  write_jsonl(path, rows, seal=True)
  with pytest.raises(DataFormatError, match=rf"^{re.escape(path)}:1: trajectory of .* the potentials have"):
    job.evaluate(synthetic_lm, cfg, pcfg, copy)


def test_the_seeds_report_needs_every_seeds_groups():
  one = {"groups": {"in_domain": {"plain": {k: 0.5 for k, *_ in spae_report.COLUMNS}}}}
  assert "0.5 +- 0.0" in spae_report.seeds_markdown([one, one])
  with pytest.raises(ConfigError, match=r"^seeds_markdown: no seed's metrics"):
    spae_report.seeds_markdown([])
  with pytest.raises(ConfigError, match=r"^seeds_markdown: seed 1's metrics have no in_domain plain decoding"):
    spae_report.seeds_markdown([one, {"groups": {}}])


def test_a_job_that_cannot_fit_creates_nothing(synthetic_lm, tmp_path):
  cfg = job.SPAEJobConfig(**{**SMALL, "max_new_tokens": synthetic_lm.config.max_position_embeddings})
  with pytest.raises(CacheFullError, match="max_position_embeddings"):
    job.evaluate(synthetic_lm, cfg, ProbeConfig(), str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w")


# ------------------------------------------------------------------------------------------------ probe bundle


@pytest.fixture()
def bundle_dir(tmp_path):
  cfg = ProbeModelConfig(feature_dim=8, d_model=8, n_heads=2, ff_dim=8)
  _, params, _ = new_probe(cfg, 0)
  path = tmp_path / "p"
  save_probe(ProbeBundle.create(cfg, params, FeatureSpec()), str(path))
  return path


def _load_with_a_writer(path, timeout=20.0):
  """load_probe(path) in a thread; if it blocks on a named pipe, a writer unblocks it and the test fails."""
  out = {}

  def run():
    try:
      out["value"] = load_probe(str(path))
    except Exception as e:  # noqa: BLE001 (handed to the test)
      out["error"] = e

  t = threading.Thread(target=run, daemon=True)
  t.start()
  t.join(timeout)
  if t.is_alive():
    for name in ("config.json", "model.safetensors"):
      fifo = path / name
      if fifo.exists() and not fifo.is_file():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    t.join(5)
    pytest.fail("load_probe blocked on a named pipe")
  if "error" in out:
    raise out["error"]
  return out["value"]


@pytest.mark.parametrize("name, what", [("model.safetensors", "probe weights"), ("config.json", "probe config")])
def test_a_named_pipe_in_a_probe_folder_is_refused_not_waited_on(bundle_dir, name, what):
  os.remove(bundle_dir / name)
  os.mkfifo(bundle_dir / name)
  with pytest.raises(CheckpointError, match=rf"{name}: {what} must be a regular file, but it is a named pipe"):
    _load_with_a_writer(bundle_dir)


def test_a_folder_in_place_of_the_weights_is_refused(bundle_dir):
  os.remove(bundle_dir / "model.safetensors")
  os.mkdir(bundle_dir / "model.safetensors")
  with pytest.raises(CheckpointError, match=r"model\.safetensors: probe weights must be a regular file, but it is a"):
    load_probe(str(bundle_dir))


def test_a_bundle_changed_after_saving_is_refused(bundle_dir):
  weights = bundle_dir / "model.safetensors"
  data = bytearray(weights.read_bytes())
  data[-5] ^= 0xFF  # one parameter's byte: the file still parses, every shape and dtype still right
  weights.write_bytes(bytes(data))
  with pytest.raises(DataFormatError, match=r"model\.safetensors: probe weights does not match its seal"):
    load_probe(str(bundle_dir))
  write_seal(weights)
  cfg = bundle_dir / "config.json"
  meta = json.loads(cfg.read_text())
  meta["probe"]["dropout"] = 0.5
  cfg.write_text(json.dumps(meta))
  with pytest.raises(DataFormatError, match=r"config\.json: probe config does not match its seal"):
    load_probe(str(bundle_dir))
  write_seal(cfg)
  os.remove(str(weights) + ".sha256")
  with pytest.raises(DataFormatError, match=r"model\.safetensors: probe weights has no seal .*save it again"):
    load_probe(str(bundle_dir))


def test_a_bundle_of_the_unsealed_format_still_loads(bundle_dir, caplog):
  for name in ("config.json", "model.safetensors"):
    os.remove(bundle_dir / (name + ".sha256"))
  meta = json.loads((bundle_dir / "config.json").read_text())
  (bundle_dir / "config.json").write_text(json.dumps({**meta, "format_version": 1}))
  with caplog.at_level(logging.WARNING):
    back = load_probe(str(bundle_dir))
  assert back.config.feature_dim == 8 and "has no seals; save it again" in caplog.text
  save_probe(back, str(bundle_dir))  # saving it again seals it
  assert json.loads((bundle_dir / "config.json").read_text())["format_version"] == 2
  assert load_probe(str(bundle_dir)).config == back.config
  for version in (2.0, True, 3):
    (bundle_dir / "config.json").write_text(json.dumps({**meta, "format_version": version}))
    write_seal(bundle_dir / "config.json")
    with pytest.raises(CheckpointError, match=r"versions 1 to 2"):
      load_probe(str(bundle_dir))


def test_save_probe_replaces_only_a_probe_folder(bundle_dir, tmp_path):
  bundle = load_probe(str(bundle_dir))
  (tmp_path / "notes").mkdir()
  (tmp_path / "notes" / "todo.txt").write_text("keep me")
  with pytest.raises(ConfigError, match=r"notes: cannot save a probe there: the folder holds \['todo\.txt'\]"):
    save_probe(bundle, str(tmp_path / "notes"))
  assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
  (tmp_path / "file").write_text("x")
  with pytest.raises(ConfigError, match=r"file: cannot save a probe there: it exists and is not a folder"):
    save_probe(bundle, str(tmp_path / "file"))
  with pytest.raises(ConfigError, match=r"probe folder: expected a path, got None"):
    load_probe(None)
  save_probe(bundle, str(bundle_dir))  # a probe folder is replaced


# ------------------------------------------------------------------------------------------------ CLI flag names


def _with(make, **top):
  c = make()
  for k, v in top.items():
    c[k] = v
  return c


# Each job's first reading of its config, as its entry in train.py / eval.py does it (reprobe_setup checks the
# whole ReProbe config before the target is built; target_config for target_synthetic).
JOB_READS = {
  "reprobe": (reprobe_synthetic.get_config, reprobe_setup),
  "tts": (tts_synthetic.get_config, reprobe_setup),
  "target_synthetic": (target_synthetic.get_config, target_config.config_from_dict),
  "spae": (spae_synthetic.get_config, lambda c: job_section(c, "spae", job.job_config_from_dict)),
  "rl": (rl_synthetic.get_config, lambda c: job_section(c, "rl", rl_job.rl_config_from_dict, ("advantage", "seed"))),
}


@pytest.mark.parametrize("name", sorted(JOB_READS))
@pytest.mark.parametrize("seed", [-1, 2**32, 1.5])
def test_a_bad_seed_flag_is_named_as_typed(name, seed):
  make, read = JOB_READS[name]
  with pytest.raises(ConfigError, match=r"^config\.seed: expected "):
    read(_with(make, seed=seed) if isinstance(seed, int) else _float_seed(make, seed))


def _float_seed(make, seed):
  c = make()
  d = c.to_dict()
  d["seed"] = seed  # a ConfigDict keeps a field's type; a mapping as the CLI could hand it
  return ml_collections.ConfigDict(d, type_safe=False)


def test_lifted_fields_are_named_where_written_and_sections_where_theirs():
  c = rl_synthetic.get_config()
  c.advantage = "ppo"
  with pytest.raises(ConfigError, match=r"^config\.advantage: expected one of 'grpo', 'dapo', 'rf_b', 'spae'"):
    job_section(c, "rl", rl_job.rl_config_from_dict, ("advantage", "seed"))
  c = rl_synthetic.get_config()
  c.rl.steps = 0
  with pytest.raises(ConfigError, match=r"^config\.rl\.steps: expected an int >= 1, got 0$"):
    job_section(c, "rl", rl_job.rl_config_from_dict, ("advantage", "seed"))
  c = spae_synthetic.get_config()
  c.seed = 5
  assert job_section(c, "spae", job.job_config_from_dict).seed == 5
  c.spae = ml_collections.ConfigDict({"samples": 0})
  with pytest.raises(ConfigError, match=r"^config\.spae\.samples: expected an int >= 1, got 0$"):
    job_section(c, "spae", job.job_config_from_dict)
  c = spae_synthetic.get_config().to_dict()
  c["spae"] = 3
  with pytest.raises(ConfigError, match=r"^config\.spae: expected a mapping of fields, got 3$"):
    job_section(c, "spae", job.job_config_from_dict)
  for read, section in ((job.job_config_from_dict, "spae"), (job.probe_config_from_dict, "probe")):
    with pytest.raises(ConfigError, match=rf"^config\.{section}: expected a mapping of \w+ fields, got \[1\]$"):
      read([1])


@pytest.mark.parametrize("seeds", [(0, -1), (0, 2**32), (0, 1.5), (0, [1]), (0,)])
def test_a_bad_seeds_flag_is_named_as_typed(seeds):
  with pytest.raises(
    ConfigError, match=r"^config\.seeds: expected two or more distinct seeds, each a seed, an int in \[0, "
  ):
    check_config_seeds(seeds)


def test_eval_py_names_the_seed_flag_and_writes_nothing(tmp_path):
  workdir = tmp_path / "w"
  proc = subprocess.run(
    [
      sys.executable,
      "eval.py",
      "--config=configs/spae_synthetic.py",
      "--config.seed=-1",
      f"--config.workdir={workdir}",
      f"--config.target.workdir={workdir}/target",
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert (
    proc.stderr.strip().splitlines()[-1] == "error: config.seed: expected a seed, an int in [0, 4294967295], got -1"
  )
  assert not workdir.exists()


@pytest.mark.slow  # one process per job entry (about 7 s each on 2 cores)
@pytest.mark.parametrize(
  "script, config, job_name",
  [
    ("train.py", "rl_synthetic", "rl"),
    ("train.py", "rl_synthetic", "rl_compare"),
    ("train.py", "target_synthetic", "target_synthetic"),
    ("train.py", "reprobe_synthetic", "reprobe"),
    ("eval.py", "reprobe_synthetic", "reprobe"),
    ("eval.py", "tts_synthetic", "tts"),
  ],
)
def test_every_entry_names_the_seed_flag(tmp_path, script, config, job_name):
  workdir = tmp_path / "w"
  argv = [
    f"--config=configs/{config}.py",
    f"--config.job={job_name}",
    "--config.seed=-1",
    f"--config.workdir={workdir}",
  ]
  if config != "target_synthetic":
    argv.append(f"--config.target.workdir={workdir}/target")
  proc = subprocess.run([sys.executable, script, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert (
    proc.stderr.strip().splitlines()[-1].startswith("error: config.seed: expected a seed, an int in [0, 4294967295]")
  )
  assert not workdir.exists()
