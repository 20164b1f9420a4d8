"""Hostile inputs, by class: seeds (one rule, [0, 2**32), at every entry that takes one), seals (a job's own stored
files carry a sha256 and are refused when changed), and non-regular files (a named pipe never blocks a reader)."""

from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
import threading

import numpy as np
import pytest

import reprobe_jax
from reprobe_jax.errors import CheckpointError, ConfigError, DataFormatError
from reprobe_jax.fields import SEED, check_seed, check_seeds
from reprobe_jax.io import (
  atomic_open,
  check_folder,
  check_seal,
  is_sealed,
  read_json,
  read_jsonl,
  read_text,
  seal_folder,
  write_json,
  write_jsonl,
)
from reprobe_jax.jobs.runs import Run
from reprobe_jax.models import LanguageModel
from reprobe_jax.models.gguf_file import open_gguf
from reprobe_jax.models.safetensors_io import SafetensorsFile, write_safetensors
from reprobe_jax.prm.report import read_step_scores
from reprobe_jax.tasks import make_problems
from reprobe_jax.tasks.io import read_problems, write_problems

BAD_SEEDS = [2**32, 7 + 2**32, 2**64, 2**70, -1, 1.5, np.float32(3.0), True, "7", None]


def _configs_with_a_seed() -> list[type]:
  """Every dataclass in the library with a `seed` field: a new one is covered by the tests below as it lands."""
  out = {}
  for m in pkgutil.walk_packages(reprobe_jax.__path__, "reprobe_jax."):
    mod = importlib.import_module(m.name)
    for obj in vars(mod).values():
      if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == mod.__name__:
        if any(f.name == "seed" for f in dataclasses.fields(obj)):
          out[f"{obj.__module__}.{obj.__qualname__}"] = obj
  return [out[k] for k in sorted(out)]


CONFIGS = _configs_with_a_seed()
REQUIRED = {"TrainerConfig": {"steps": 1}, "PromptOrder": {"n": 3}}  # configs without a default for every field


def test_the_discovery_finds_the_configs():
  names = {c.__name__ for c in CONFIGS}
  assert {"SearchConfig", "RLConfig", "TrajectoryConfig", "ProbeTrainConfig", "TrainLMConfig"} <= names


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("seed", BAD_SEEDS, ids=repr)
def test_every_config_refuses_a_seed_past_32_bits_or_of_another_type(cls, seed):
  """Seed 7 and 7 + 2**32 used to sample the same; 2**64 and 2**70 ended in a raw OverflowError."""
  with pytest.raises(ConfigError, match=rf"^{cls.__name__}\.seed: expected a seed, an int in \[0, 4294967295\]"):
    cls(seed=seed, **REQUIRED.get(cls.__name__, {}))


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_config_takes_the_edges_of_the_seed_range(cls):
  for seed in (0, 2**32 - 1, np.uint32(2**32 - 1), np.int64(5)):
    assert cls(seed=seed, **REQUIRED.get(cls.__name__, {})).seed == seed


def test_check_seed_names_the_argument_and_returns_a_python_int():
  assert type(check_seed(np.uint32(9), "x")) is int
  assert check_seeds((1, np.int64(2)), "s") == [1, 2]
  with pytest.raises(
    ConfigError, match=r"^trajectory_seeds\[1\]: expected a seed, an int in \[0, 4294967295\], got -1$"
  ):
    check_seeds([0, -1], "trajectory_seeds")
  with pytest.raises(ConfigError, match=r"^s: expected a sequence of seeds, got 5$"):
    check_seeds(5, "s")
  with pytest.raises(ConfigError, match=r"^s: expected a sequence of seeds"):
    check_seeds("12", "s")
  assert str(SEED) == "a seed, an int in [0, 4294967295]"


@pytest.mark.parametrize("seed", [2**32, -1, 1.5])
def test_the_sampler_refuses_a_seed_before_prefilling(synthetic_lm, seed):
  smp = synthetic_lm.sampler()
  with pytest.raises(ConfigError, match=r"^seed: expected a seed"):
    smp.prefill([[3, 4, 5]], max_new_tokens=2, seed=seed)
  with pytest.raises(ConfigError, match=r"^prompt_seeds\[0\]: expected a seed"):
    smp.prefill([[3, 4, 5]], max_new_tokens=2, prompt_seeds=[seed])


def test_a_random_model_refuses_a_seed_past_32_bits(synthetic_lm):
  with pytest.raises(ConfigError, match=r"^LanguageModel\.random seed: expected a seed"):
    LanguageModel.random(synthetic_lm.config, seed=2**40)


# Seals: a stored file changed after it was written is refused, naming it.


def _flip(path, offset: int = 0) -> None:
  data = bytearray(open(path, "rb").read())
  data[offset] ^= 0x01
  open(path, "wb").write(bytes(data))


def test_a_sealed_json_file_is_refused_when_changed_missing_its_seal_or_with_a_bad_seal(tmp_path):
  path = tmp_path / "cell.json"
  write_json(path, {"accuracy": 0.5}, seal=True)
  assert read_json(path, "tts cell", sealed=True) == {"accuracy": 0.5}
  path.write_text('{"accuracy": 7.0}')  # same length, other content
  with pytest.raises(DataFormatError, match=r"cell\.json: tts cell does not match its seal"):
    read_json(path, "tts cell", sealed=True)
  assert read_json(path, "tts cell") == {"accuracy": 7.0}  # unsealed reads (user files) do not look
  (tmp_path / "cell.json.sha256").write_text("not a digest\n")
  with pytest.raises(DataFormatError, match=r"cell\.json\.sha256: the seal of tts cell holds no sha256 digest"):
    read_json(path, "tts cell", sealed=True)
  os.remove(tmp_path / "cell.json.sha256")
  with pytest.raises(DataFormatError, match=r"cell\.json: tts cell has no seal \(cell\.json\.sha256 is missing\)"):
    read_json(path, "tts cell", sealed=True)


def test_a_sealed_jsonl_file_with_one_flipped_bit_is_refused(tmp_path):
  path = tmp_path / "rows.jsonl"
  write_jsonl(path, [{"a": i} for i in range(5)], seal=True)
  assert [o for _, o in read_jsonl(path, sealed=True)] == [{"a": i} for i in range(5)]
  _flip(path, 7)
  with pytest.raises(DataFormatError, match=r"rows\.jsonl: JSONL file does not match its seal"):
    read_jsonl(path, sealed=True)


def test_a_failed_sealed_write_keeps_the_old_file_and_its_seal(tmp_path):
  path = tmp_path / "a.json"
  write_json(path, [1], seal=True)
  with pytest.raises(RuntimeError):
    with atomic_open(path, seal=True) as f:
      f.write("[2")
      raise RuntimeError("killed")
  assert read_json(path, kind=list, sealed=True) == [1]


def test_rewriting_a_sealed_file_reseals_it(tmp_path):
  path = tmp_path / "a.json"
  write_json(path, [1], seal=True)
  write_json(path, [1, 2], seal=True)
  assert read_json(path, kind=list, sealed=True) == [1, 2]


def test_a_stage_is_redone_when_its_seal_is_missing_and_refused_when_its_file_changed(tmp_path):
  run, calls = Run(str(tmp_path)), []

  def make():
    calls.append(1)
    write_problems(run.path("p.jsonl"), make_problems("arithmetic", 3, 0, 1), seal=True)

  assert run.stage("p", ["p.jsonl"], make) and len(calls) == 1
  assert not run.stage("p", ["p.jsonl"], make) and len(calls) == 1
  os.remove(run.path("p.jsonl.sha256"))  # a job killed between the file and its seal
  assert run.stage("p", ["p.jsonl"], make) and len(calls) == 2
  assert len(read_problems(run.path("p.jsonl"), sealed=True)) == 3
  _flip(run.path("p.jsonl"), 3)
  assert not run.stage("p", ["p.jsonl"], make)
  with pytest.raises(DataFormatError, match=r"p\.jsonl: JSONL file does not match its seal"):
    read_problems(run.path("p.jsonl"), sealed=True)


def test_a_stage_that_writes_without_a_seal_is_a_bug_named_at_once(tmp_path):
  run = Run(str(tmp_path))
  with pytest.raises(RuntimeError, match=r"did not write \['x\.json'\] with their seals"):
    run.stage("x", ["x.json"], lambda: write_json(run.path("x.json"), {}))


def test_a_sealed_folder_names_its_damaged_or_unsealed_file(tmp_path):
  folder = tmp_path / "model"
  (folder / "sub").mkdir(parents=True)
  (folder / "config.json").write_text("{}")
  write_safetensors(str(folder / "sub" / "model.safetensors"), {"w": np.ones((2, 2), np.float32)})
  check_folder(folder, required=False)  # a folder made elsewhere: nothing to check
  with pytest.raises(DataFormatError, match=r"config\.json: folder file config\.json has no seal"):
    check_folder(folder)
  seal_folder(folder, last="config.json")
  assert is_sealed(folder / "config.json") and is_sealed(folder / "sub" / "model.safetensors")
  check_folder(folder)
  _flip(folder / "sub" / "model.safetensors", 40)
  with pytest.raises(DataFormatError, match=r"model\.safetensors: trained target file sub/model\.safetensors does not"):
    check_folder(folder, "trained target", required=False)  # sealed files are checked even when not required


def test_stored_step_scores_are_checked_against_their_seal(tmp_path):
  path = tmp_path / "step_scores.npz"
  with atomic_open(path, "wb", seal=True) as f:
    np.savez(f, **{"val/labels": np.zeros(2), "val/domain": np.array(["a", "a"])})
  _flip(path, 60)
  with pytest.raises(DataFormatError, match=r"step_scores\.npz: step-scores file does not match its seal"):
    read_step_scores(str(path))


# Non-regular files: refused at once, never read (a named pipe blocks a reader forever).


def _returns_within(fn, seconds: float = 20.0):
  """Runs `fn` in a thread; the exception it raised, or a failure if it still runs after `seconds`."""
  box = {}

  def target():
    try:
      fn()
    except BaseException as e:  # noqa: BLE001 (handed to the test)
      box["error"] = e

  t = threading.Thread(target=target, daemon=True)
  t.start()
  t.join(seconds)
  if t.is_alive():
    pytest.fail(f"still blocked after {seconds} s (a named pipe was opened for reading)")
  return box.get("error")


@pytest.mark.parametrize(
  "reader, error, match",
  [
    (
      lambda p: read_text(p, "prompt file"),
      DataFormatError,
      "prompt file must be a regular file, but it is a named pipe",
    ),
    (lambda p: read_json(p, "probe config"), DataFormatError, "probe config must be a regular file"),
    (lambda p: read_jsonl(p), DataFormatError, "JSONL file must be a regular file"),
    (lambda p: check_seal(p, "cell"), DataFormatError, "cell must be a regular file"),
    (SafetensorsFile, CheckpointError, "safetensors file must be a regular file, but it is a named pipe"),
    (open_gguf, CheckpointError, "GGUF file must be a regular file, but it is a named pipe"),
  ],
  ids=["text", "json", "jsonl", "seal", "safetensors", "gguf"],
)
def test_a_named_pipe_is_refused_without_blocking(tmp_path, reader, error, match):
  pipe = tmp_path / "model.safetensors"
  os.mkfifo(pipe)
  e = _returns_within(lambda: reader(str(pipe)))
  assert isinstance(e, error) and match in str(e), e


@pytest.mark.parametrize("reader", [read_text, SafetensorsFile, open_gguf], ids=["text", "safetensors", "gguf"])
def test_a_folder_in_place_of_a_file_is_named(tmp_path, reader):
  (tmp_path / "x").mkdir()
  with pytest.raises((DataFormatError, CheckpointError), match=r"must be a regular file, but it is a folder"):
    reader(str(tmp_path / "x"))
