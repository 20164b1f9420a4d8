"""A Hugging Face `datasets` dataset as a source of every format (reprobe_jax.tasks.hf_source): a folder written by
`save_to_disk` (a Dataset, or a DatasetDict with its split named), and a hub id read from the local `datasets`
cache without a network, each read into the records its JSONL file gives, and each bad row refused naming the
source, the row and the field. Skipped without the `hf` extra, except the refusal when `datasets` is missing."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from test_tasks_datasets import GOOD_PB, NATALIA, NATALIA_ANSWER, PROCESSBENCH_TABLE, _with, prm_line, step, write_lines

from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.tasks.data import DataConfig, load_data
from reprobe_jax.tasks.datasets import read_dataset
from reprobe_jax.tasks.hf_source import is_hf_source

GSM = [{"question": NATALIA, "answer": NATALIA_ANSWER}] + [
  {"question": f"Tom has {n} apples and eats 2. How many are left?", "answer": f"{n} - 2 = {n - 2}\n#### {n - 2}"}
  for n in range(3, 12)
]
PB = [
  {"id": f"math-{i}", "generator": "Qwen2-7B-Instruct", "problem": f"Problem {i}", "steps": [f"s{k}" for k in range(n)]}
  | {"final_answer_correct": label == -1, "label": label}
  for i, (label, n, _, _) in enumerate(PROCESSBENCH_TABLE)
]


@pytest.fixture
def hf():
  return pytest.importorskip("datasets")


def save(hf, folder, rows=None, **splits) -> str:
  """`rows` as a Dataset, or each keyword as a split of a DatasetDict, saved with save_to_disk."""
  if rows is not None:
    hf.Dataset.from_list(rows).save_to_disk(str(folder))
  else:
    hf.DatasetDict({k: hf.Dataset.from_list(v) for k, v in splits.items()}).save_to_disk(str(folder))
  return str(folder)


def fields(records, *names):
  return [tuple(getattr(r, n) for n in names) for r in records]


def test_a_saved_gsm8k_dataset_reads_as_its_jsonl_file_does(hf, tmp_path):
  folder = save(hf, tmp_path / "gsm8k_dir", GSM)
  assert is_hf_source(folder) and not is_hf_source(str(tmp_path))
  data = read_dataset(folder, "gsm8k")
  reference = read_dataset(write_lines(tmp_path / "gsm8k.jsonl", GSM), "gsm8k")
  names = ("question", "answer", "solution", "source")
  assert fields(data.problems, *names) == fields(reference.problems, *names) and len(data.problems) == 10
  assert [p.id for p in data.problems[:2]] == ["gsm8k_dir-0", "gsm8k_dir-1"]  # rows count from 0, as dataset[i]
  assert (data.path, data.format, data.problems[0].answer) == (folder, "gsm8k", "72")


def test_a_processbench_dataset_dict_reads_the_named_split(hf, tmp_path):
  folder = save(hf, tmp_path / "pb", gsm8k=PB[:1], math=PB)  # Qwen/ProcessBench's shape: one split per source
  data = read_dataset(f"{folder}::math", "processbench")
  reference = read_dataset(write_lines(tmp_path / "math.jsonl", PB), "processbench")
  names = ("id", "problem_id", "steps", "step_labels", "final_answer_correct", "meta")
  assert fields(data.solutions, *names) == fields(reference.solutions, *names) and len(data.solutions) == len(
    PROCESSBENCH_TABLE
  )
  assert [s.step_labels for s in data.solutions] == [labels for _, _, labels, _ in PROCESSBENCH_TABLE]
  assert len(read_dataset(f"{folder}::gsm8k", "processbench").solutions) == 1
  with pytest.raises(ConfigError, match=r"pb: the dataset has the splits gsm8k, math; name one as '.*pb::<split>'"):
    read_dataset(folder, "processbench")
  with pytest.raises(ConfigError, match="no split 'omnimath'; the dataset has gsm8k, math"):
    read_dataset(f"{folder}::omnimath", "processbench")
  only = save(hf, tmp_path / "one", test=PB)
  assert len(read_dataset(only, "processbench").solutions) == len(PB)  # a single split needs no name


def test_prm800k_nested_records_survive_arrow(hf, tmp_path):
  lines = [
    prm_line(steps=[step(("Wrong.", -1), ("Right: 1 + 1.", 1), chosen=1), step(("# Answer\n\n2", 1))]),
    prm_line(problem="What is 2*3?", answer="6", steps=[step(("6", None), human=None)], finish="give_up"),
  ]
  data = read_dataset(save(hf, tmp_path / "prm", lines), "prm800k")
  reference = read_dataset(write_lines(tmp_path / "prm.jsonl", lines), "prm800k")
  names = ("question", "steps", "step_labels", "final_answer_correct")
  assert fields(data.solutions, *names) == fields(reference.solutions, *names) and len(data.solutions) == 2
  assert [p.answer for p in data.problems] == ["2", "6"]


def test_load_data_splits_a_folder_as_it_splits_the_file(hf, tmp_path):
  folder = save(hf, tmp_path / "gsm8k_dir", train=GSM[:3], test=GSM)
  cfg = DataConfig(path=f"{folder}::test", format="gsm8k", seed=3, val=0.2, test=0.3)
  splits = load_data(cfg)
  assert {s: len(p) for s, p in splits.problems.items()} == {"train": 5, "val": 2, "test": 3}
  reference = load_data(
    DataConfig(path=write_lines(tmp_path / "g.jsonl", GSM), format="gsm8k", seed=3, val=0.2, test=0.3)
  )
  questions = {s: sorted(p.question for p in ps) for s, ps in splits.problems.items()}
  assert sum(map(len, questions.values())) == 10 and all(p.domain == "math" for p in splits.problems["test"])
  assert sorted(q for qs in questions.values() for q in qs) == sorted(r["question"] for r in GSM)
  assert load_data(cfg).ids() == splits.ids()  # the same config, the same splits
  assert {s: len(p) for s, p in reference.problems.items()} == {"train": 5, "val": 2, "test": 3}


BAD_ROWS = [
  # (format, rows, message parts after the source)
  ("gsm8k", [GSM[0], _with(GSM[1], answer="It is 72.")], ["[row 1]: field 'answer' has no '####"]),
  ("gsm8k", [GSM[0], _with(GSM[1], question="")], ["[row 1]: field 'question' must be a non-empty string"]),
  (
    "processbench",
    [GOOD_PB, _with(GOOD_PB, id="g-1", label=2)],
    ["[row 1]: record 'g-1': field 'label' must be -1 (no wrong step) or a step index in 0..1, got 2"],
  ),
  (
    "processbench",
    [GOOD_PB, _with(GOOD_PB, id="gsm8k-0")],
    ["[row 1]: record 'gsm8k-0': field 'id' repeats", "[row 0]"],
  ),
  (
    "prm800k",
    [prm_line(steps=[step(("ok", 1))]), prm_line(steps=[step(("ok", 1)), step(("a", 2))])],
    ["[row 1]: field 'label.steps[1].completions[0].rating' must be -1, 0 or 1 (or null), got 2"],
  ),
]


@pytest.mark.parametrize("format, rows, parts", BAD_ROWS, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_ROWS)])
def test_a_bad_row_is_refused_naming_the_row_and_field(hf, tmp_path, format, rows, parts):
  folder = save(hf, tmp_path / "bad", rows)
  with pytest.raises(DataFormatError) as e:
    read_dataset(folder, format)
  for part in parts:
    assert f"{folder}{part}" in str(e.value) or part in str(e.value), str(e.value)
  assert str(e.value).startswith(f"{folder}{parts[0]}"), str(e.value)
  with pytest.raises(DataFormatError, match=r"bad\[row 1\]"):  # load_data reads every record before it splits
    load_data(DataConfig(path=folder, format=format))


def test_folders_that_hold_no_saved_dataset_are_refused(hf, tmp_path):
  empty = str(tmp_path / "empty")
  hf.Dataset.from_dict({"question": [], "answer": []}).save_to_disk(empty)
  with pytest.raises(DataFormatError, match=r"empty: (cannot read the saved Hugging Face dataset|.* holds no records)"):
    read_dataset(empty, "gsm8k")
  plain = tmp_path / "plain"
  plain.mkdir()
  with pytest.raises(DataFormatError, match="must be a regular file, but it is a folder"):
    read_dataset(plain, "gsm8k")
  with pytest.raises(DataFormatError, match="a folder, but not one `save_to_disk` wrote"):
    read_dataset(f"{plain}::test", "gsm8k")
  with pytest.raises(ConfigError, match="at most one '::split' suffix"):
    read_dataset(f"{empty}::a::b", "gsm8k")


def _cache_hub_dataset(hf, tmp_path, repo_id: str, config: str, rows: list[dict]) -> str:
  """The local `datasets` cache as `load_dataset(repo_id, config)` leaves it
  (<cache>/<owner>___<name>/<config>/<version>/<hash>/{dataset_info.json, <name>-<split>.arrow}), built from a JSONL
  file with no network: the JSON builder writes the Arrow files and its info, moved where the hub's would be."""
  from datasets.packaged_modules.json.json import Json

  owner, name = repo_id.split("/")
  builder = Json(
    cache_dir=str(tmp_path / "build"),
    dataset_name=name,
    config_name=config,
    data_files={"test": write_lines(tmp_path / "rows.jsonl", rows)},
  )
  builder.download_and_prepare()
  cache = tmp_path / "hf_cache"
  shutil.copytree(builder.cache_dir, cache / f"{owner}___{name}" / config / "0.0.0" / "0123456789abcdef")
  assert (
    json.loads((cache / f"{owner}___{name}" / config / "0.0.0" / "0123456789abcdef" / "dataset_info.json").read_text())[
      "config_name"
    ]
    == config
  )
  return str(cache)


def test_a_hub_id_reads_the_local_cache_and_never_downloads(hf, tmp_path, monkeypatch):
  cache = _cache_hub_dataset(hf, tmp_path, "openai/gsm8k", "main", GSM)
  monkeypatch.setattr(hf.config, "HF_DATASETS_CACHE", cache)
  monkeypatch.setattr(hf.config, "HF_ENDPOINT", "http://127.0.0.1:9")  # any look-up on the network would fail
  monkeypatch.chdir(tmp_path)  # 'openai/gsm8k' is no local path here
  assert is_hf_source("openai/gsm8k") and not is_hf_source("data/test.jsonl")
  for path in ("openai/gsm8k::test", "openai/gsm8k::main::test", "openai/gsm8k"):
    data = read_dataset(path, "gsm8k")
    assert [p.answer for p in data.problems] == [r["answer"].rpartition("#### ")[2] for r in GSM], path
  assert read_dataset("openai/gsm8k::test", "gsm8k").problems[0].id == "gsm8k-test-0"
  assert len(load_data(DataConfig(path="openai/gsm8k::test", format="gsm8k")).problems["train"]) == 7
  with pytest.raises(
    DataFormatError, match=r"'openai/gsm8k_missing' is not in the local cache .*nothing is downloaded"
  ):
    read_dataset("openai/gsm8k_missing::test", "gsm8k")
  with pytest.raises(DataFormatError, match="Available configs in the cache: \\['main'\\]"):
    read_dataset("openai/gsm8k::socratic::test", "gsm8k")
  with pytest.raises(DataFormatError, match="cannot read"):  # a missing file is still a missing file
    read_dataset("data/test.jsonl", "gsm8k")


def test_without_the_extra_a_dataset_folder_says_how_to_install_it(tmp_path, monkeypatch):
  folder = tmp_path / "gsm8k_dir"
  folder.mkdir()
  (folder / "state.json").write_text("{}")
  monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
  with pytest.raises(ConfigError, match=r"needs the `datasets` package: pip install 'reprobe-jax\[hf\]'"):
    read_dataset(folder, "gsm8k")
  with pytest.raises(ConfigError, match=r"gsm8k_dir: reading .* pip install 'reprobe-jax\[hf\]'"):
    load_data(DataConfig(path=f"{folder}::test", format="gsm8k"))
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ConfigError, match=r"^data/gsm8k \(no local file or folder, so a hub id\): reading"):
    read_dataset("data/gsm8k", "gsm8k")  # a mistyped folder reads as a hub id: the message says so
  with pytest.raises(DataFormatError, match=r"^gsm8k\.jsonl: no such file or folder, and not a Hugging Face hub id"):
    read_dataset("gsm8k.jsonl::test", "gsm8k")  # neither: not found, whether or not the extra is installed
