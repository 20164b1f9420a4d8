"""Test-time search and step scorers under hostile input: seeds past 32 bits, sizes past what a compiled search can
hold, a scorer's arguments, a scorer's output (its type, dtype, shape and finiteness, in Best-of-N, beam search and
DVTS alike), hand-made result records, and the TTS job's stored cells and step scores. Every mistake is one typed
error naming the field, argument, scorer or file, before any work where the input allows it."""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.io.atomic import atomic_open, write_json
from reprobe_jax.jobs import tts as tts_job
from reprobe_jax.jobs import tts_report
from reprobe_jax.jobs.runs import Run
from reprobe_jax.jobs.tts_cells import SUMMARY_KEYS, check_cascade, check_cell, searched_budgets, stored_cell
from reprobe_jax.jobs.reprobe_config import ReprobeConfig
from reprobe_jax.jobs.tts_config import TTSConfig, tts_config_from_dict
from reprobe_jax.models import LanguageModel
from reprobe_jax.models.sampler import Sampler
from reprobe_jax.prm.combine import FRACTIONS
from reprobe_jax.prm.report import read_step_scores
from reprobe_jax.scorers import (
  ScoreInputs,
  StepScorer,
  UncertaintyScorer,
  get_scorer,
  register_scorer,
  score,
  score_rows,
  step_token_mask,
)
from reprobe_jax.scorers.registry import SCORERS
from reprobe_jax.trajectories import TrajectoryConfig
from reprobe_jax.tts import Candidate, PromptResult, SearchConfig
from reprobe_jax.tts.beam import beam_search
from reprobe_jax.tts.best_of_n import best_of_n
from reprobe_jax.tts.checks import prompt_seeds_for
from reprobe_jax.tts.dvts import dvts
from test_tts_search import MODEL, PROMPTS, make_tokenizer

STRATEGIES = {"best_of_n": best_of_n, "beam": beam_search, "dvts": dvts}
TINY = dict(max_steps=2, max_new_tokens=8)


def tiny(strategy: str) -> SearchConfig:
  return SearchConfig(strategy, n=2, beams=1 if strategy == "best_of_n" else 2, **TINY)


@pytest.fixture(scope="module")
def lm():
  return LanguageModel.random(MODEL, seed=0, tokenizer=make_tokenizer())


# ------------------------------------------------------------------------------------------------ one seed rule


@pytest.mark.parametrize("seed", [7 + 2**32, 2**64, -1, 1.5, True, "7", None])
def test_a_search_seed_outside_32_bits_is_refused_not_wrapped(seed):
  with pytest.raises(ConfigError, match=r"^SearchConfig\.seed: expected a seed, an int in \[0, 4294967295\], got "):
    SearchConfig(seed=seed)
  assert SearchConfig(seed=2**32 - 1).seed == 2**32 - 1


@pytest.mark.parametrize("seed", [2**70, 2**32, -1, "abc", 1.5, False])
def test_a_scorer_seed_is_one_checked_argument(seed):
  with pytest.raises(ConfigError, match=r"^scorer 'random': seed: expected a seed, an int in \[0, 4294967295\]"):
    get_scorer("random", seed=seed)
  with pytest.raises(ConfigError, match=r"^scorer 'maxprob': seed: expected a seed"):  # checked for every baseline
    UncertaintyScorer.create("maxprob", seed=seed)
  assert get_scorer("random", seed=np.int64(2**32 - 1)).name == "random"


@pytest.mark.parametrize(
  "seeds, match",
  [
    ([2**32, 0, 0], r"^prompt_seeds\[0\]: expected a seed, an int in \[0, 4294967295\], got 4294967296$"),
    ([0, -1, 0], r"^prompt_seeds\[1\]: expected a seed"),
    ([0, 0, 1.0], r"^prompt_seeds\[2\]: expected a seed"),
    ("abc", r"^prompt_seeds: expected a sequence of seeds, got 'abc'$"),
    (7, r"^prompt_seeds: expected a sequence of seeds, got 7$"),
    ([1, 2], r"^prompt_seeds: need one seed per prompt \(3\), got 2"),
  ],
)
def test_prompt_seeds_are_checked_each_by_the_seed_rule(seeds, match):
  with pytest.raises(ConfigError, match=match):
    prompt_seeds_for(PROMPTS, seeds)
  assert prompt_seeds_for(PROMPTS, [0, 1, 2**32 - 1]) == [0, 1, 2**32 - 1]


# ------------------------------------------------------------------------------------------------ sizes with bounds


@pytest.mark.parametrize(
  "field, value, bound",
  [
    ("max_steps", 10**12, r"\[1, 4096\]"),
    ("n", 2**40, r"\[1, 4096\]"),
    ("beams", 2**31, r"\[1, 4096\]"),
    ("max_new_tokens", 2**31, r"\[1, 1048576\]"),
    ("lookahead", 10**6, r"\[0, 16\]"),
  ],
)
def test_a_size_past_what_a_search_can_hold_names_its_field(field, value, bound):
  with pytest.raises(ConfigError, match=rf"^SearchConfig\.{field}: expected an int in {bound}, got {value}$"):
    SearchConfig(**{field: value})


def test_rows_per_prompt_are_bounded_as_a_product():
  with pytest.raises(
    ConfigError, match=r"^SearchConfig\.n: n x beams = 1024 x 8 decode rows per prompt, at most 4096$"
  ):
    SearchConfig(n=1024, beams=8)
  with pytest.raises(ConfigError, match=r"^SearchConfig\.sampling: expected a SamplingParams, got dict$"):
    SearchConfig(sampling={"temperature": 1.0})


@pytest.mark.parametrize(
  "override, match",
  [
    ({"budgets": [10**12]}, r"^config\.tts\.budgets: expected a non-empty distinct tuple of \(an int in \[1, 4096\]\)"),
    ({"max_steps": 10**12}, r"^config\.tts\.max_steps: expected an int in \[1, 4096\]"),
    ({"lookahead": 10**9}, r"^config\.tts\.lookahead: expected an int in \[0, 16\]"),
  ],
)
def test_the_tts_grid_bounds_the_same_sizes(override, match):
  with pytest.raises(ConfigError, match=match):
    tts_config_from_dict(override)


def test_every_search_the_grid_would_make_is_checked_before_the_job_creates_anything(tmp_path):
  cfg = ReprobeConfig(trajectories=TrajectoryConfig(max_new_tokens=2**21))
  with pytest.raises(
    ConfigError,
    match=r"^config\.tts: greedy at budget 1: SearchConfig\.max_new_tokens: "
    r"expected an int in \[1, 1048576\], got 2097152$",
  ):
    tts_job.start(None, cfg, TTSConfig(), str(tmp_path / "work"))
  assert not os.path.exists(tmp_path / "work")


def test_score_rows_checks_its_batch_size():
  rows, spans = [{"logprobs": np.zeros(3, np.float32)}], [np.asarray([[0, 3]])]
  for bad in (0, -1, 2**40, 2.0, "8"):
    with pytest.raises(ConfigError, match=r"^score_rows: batch_size: expected an int in \[1, 65536\]"):
      score_rows(get_scorer("maxprob"), rows, spans, batch_size=bad)


# ------------------------------------------------------------------------------------------------ a scorer's arguments


@struct.dataclass
class Constant(StepScorer):
  """Scores every step with tokens 0.5."""

  name = "constant"

  def score(self, inputs, spans):
    n = jnp.sum(step_token_mask(spans, inputs.token_mask), axis=-1)
    return jnp.where(n > 0, 0.5, jnp.nan)


if "hostile_needs_w" not in SCORERS:
  register_scorer("hostile_needs_w", lambda *, w: Constant())
  register_scorer("hostile_not_a_scorer", lambda: "maxprob")


@pytest.mark.parametrize(
  "name, kwargs, match",
  [
    ("maxprob", {"bogus": 1}, r"^scorer 'maxprob': unknown argument\(s\) \['bogus'\]; it accepts \['seed'\]$"),
    ("random", {"sed": 1}, r"^scorer 'random': unknown argument\(s\) \['sed'\]; it accepts \['seed'\]$"),
    (
      "probe",
      {"pth": "x"},
      r"^scorer 'probe': unknown argument\(s\) \['pth'\]; it accepts \['bundle', 'model_fingerprint', 'path'\]$",
    ),
    ("probe", {"bundle": 3}, r"^scorer 'probe': bundle: expected a ProbeBundle, got int 3$"),
    ("probe", {"path": 3}, r"^scorer 'probe': path: expected a folder path, got int 3$"),
    ("probe", {"path": "x", "model_fingerprint": 5}, r"^scorer 'probe': model_fingerprint: expected a string"),
    ("prm", {"path": "x", "bogus": 1}, r"^scorer 'prm': unknown argument\(s\) \['bogus'\]; it accepts \[.*'separator'"),
    ("prm", {"prm": "a PRM"}, r"^scorer 'prm': prm: expected a PRM, got str 'a PRM'$"),
    ("prm", {"path": 7}, r"^scorer 'prm': path: expected a folder path or hub id, got int 7$"),
    ("hostile_needs_w", {}, r"^scorer 'hostile_needs_w': missing argument\(s\) \['w'\]; it accepts \['w'\]$"),
    ("hostile_needs_w", {"v": 1, "w": 1}, r"^scorer 'hostile_needs_w': unknown argument\(s\) \['v'\]; it accepts"),
    ("hostile_not_a_scorer", {}, r"^scorer 'hostile_not_a_scorer': its factory returned str 'maxprob', not a Step"),
  ],
)
def test_every_scorers_arguments_are_checked_by_the_registry(name, kwargs, match):
  with pytest.raises(ConfigError, match=match):
    get_scorer(name, **kwargs)


# ------------------------------------------------------------------------------------------------ a scorer's output


@struct.dataclass
class Flat(StepScorer):
  """Returns [B] (one score per row) where [B, S] is due."""

  name = "flat"

  def score(self, inputs, spans):
    return jnp.sum(step_token_mask(spans, inputs.token_mask), axis=(1, 2)).astype(jnp.float32)


@struct.dataclass
class Listy(StepScorer):
  """Returns a Python list of arrays."""

  name = "listy"

  def score(self, inputs, spans):
    return [jnp.zeros(spans.shape[:2])]


@struct.dataclass
class Ints(StepScorer):
  """Returns int32 scores (no NaN for an empty step)."""

  name = "ints"

  def score(self, inputs, spans):
    return jnp.sum(step_token_mask(spans, inputs.token_mask), axis=-1).astype(jnp.int32)


@struct.dataclass
class Raises(StepScorer):
  """Raises while it is traced."""

  name = "raises"

  def score(self, inputs, spans):
    raise RuntimeError("boom")


@pytest.mark.parametrize(
  "scorer, match",
  [
    (Flat(), r"^scorer 'flat': score must return scores \[B, S\]: one score per step span of each row, here \[2, 3\]"),
    (Listy(), r"^scorer 'listy': score must return an array of scores \[2, 3\], got list"),
    (Ints(), r"^scorer 'ints': score must return floating-point scores .*got dtype int32$"),
    (Raises(), r"^scorer 'raises' cannot score this target .*: boom$"),
  ],
)
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_a_misshapen_scorer_output_is_refused_before_any_decoding(lm, monkeypatch, scorer, match, strategy):
  monkeypatch.setattr(Sampler, "prefill", lambda *a, **k: pytest.fail("decoding started with a broken scorer"))
  with pytest.raises(ConfigError, match=match):
    STRATEGIES[strategy](lm, scorer, PROMPTS, tiny(strategy))


def test_the_jitted_score_checks_the_output_too():
  inputs = ScoreInputs(token_mask=jnp.ones((2, 4), bool), logprobs=jnp.zeros((2, 4)))
  spans = jnp.asarray([[[0, 2], [2, 4]]] * 2, jnp.int32)
  with pytest.raises(ConfigError, match=r"^scorer 'flat': score must return scores \[B, S\].*here \[2, 2\]; got \[2\]"):
    score(Flat(), inputs, spans)
  with pytest.raises(ConfigError, match=r"^scorer 'ints': score must return floating-point scores"):
    score(Ints(), inputs, spans)


@struct.dataclass
class BatchDependent(Constant):
  """Right on the 2 rows a search's checks trace it with, one score too many on any other batch: caught where the
  scores enter the compiled search, while it is traced (before the loop runs)."""

  name = "batch_dependent"

  def score(self, inputs, spans):
    out = super().score(inputs, spans)
    return out if spans.shape[0] == 2 else jnp.concatenate([out, out[:1]])


def test_an_output_that_goes_wrong_only_at_the_real_batch_is_caught_inside_the_search(lm):
  with pytest.raises(
    ConfigError, match=r"^scorer 'batch_dependent': score_newest must return scores \[B\]: .*here \[4\]; got \[5\]"
  ):
    beam_search(lm, BatchDependent(), PROMPTS, tiny("beam"))


@struct.dataclass
class OnRow1(Constant):
  """Scores every step with tokens of row 1 of each prompt's rows `value` (a traced leaf: NaN, -inf and a finite
  value share one compiled search), 0.5 elsewhere."""

  value: jax.Array = struct.field(default_factory=lambda: jnp.float32(math.nan))
  name = "on_row_1"

  def score(self, inputs, spans):
    out = super().score(inputs, spans)
    row = jnp.arange(spans.shape[0])[:, None] == 1
    return jnp.where(row & ~jnp.isnan(out), self.value, out)


# DVTS runs the search beam search runs (`tts.search`), with groups of width 1: slow only for its own compile.
@pytest.mark.parametrize("strategy", ["best_of_n", "beam", pytest.param("dvts", marks=pytest.mark.slow)])
def test_a_nan_or_inf_score_of_a_step_with_tokens_is_refused_not_ranked(lm, strategy):
  """NaN would rank a candidate last and -inf first, silently: refused naming the scorer, in every strategy."""
  for bad in (math.nan, -math.inf):
    with pytest.raises(
      ConfigError, match=rf"^scorer 'on_row_1' gave \d+ step\(s\) with tokens a NaN or infinite score \({strategy}, in "
    ):
      STRATEGIES[strategy](lm, OnRow1(jnp.float32(bad)), PROMPTS, tiny(strategy))
  assert len(STRATEGIES[strategy](lm, OnRow1(jnp.float32(0.25)), PROMPTS, tiny(strategy))) == len(PROMPTS)


# ------------------------------------------------------------------------------------------------ result records


@pytest.mark.parametrize(
  "fields, match",
  [
    ({"steps": ((0, 1), (1, 2)), "step_scores": (0.5,)}, r"^Candidate: 2 steps but 1 step scores"),
    ({"steps": ((0, 3),), "step_scores": (0.5,)}, r"^Candidate\.steps\[0\]: expected a span .* <= 2, got \(0, 3\)$"),
    ({"steps": ((1, 0),), "step_scores": (0.5,)}, r"^Candidate\.steps\[0\]: expected a span"),
    ({"steps": ((-1, 1),), "step_scores": (0.5,)}, r"^Candidate\.steps\[0\]: expected a span"),
    ({"steps": ([0, 1],), "step_scores": (0.5,)}, r"^Candidate\.steps\[0\]: expected a span"),
    ({"steps": [(0, 1)], "step_scores": (0.5,)}, r"^Candidate\.steps: expected a tuple, got list"),
    ({"step_scores": (math.inf,)}, r"^Candidate\.step_scores\[0\]: expected a finite number or NaN"),
    ({"step_scores": ("0.5",)}, r"^Candidate\.step_scores\[0\]: expected a finite number or NaN"),
    ({"response_ids": (5, -1)}, r"^Candidate\.response_ids\[1\]: expected a token id >= 0, got int -1$"),
    ({"response_ids": (5, True)}, r"^Candidate\.response_ids\[1\]: expected a token id"),
    ({"finish_reason": "done"}, r"^Candidate\.finish_reason: expected one of .*'answer'\), got 'done'$"),
  ],
)
def test_a_candidate_checks_its_own_fields(fields, match):
  good = dict(response_ids=(5, 6), steps=((0, 2),), step_scores=(0.25,), finish_reason="eos")
  Candidate(**good)
  Candidate(**{**good, "step_scores": (math.nan,)})  # NaN: a step with no tokens
  with pytest.raises(ConfigError, match=match):
    Candidate(**{**good, **fields})


def test_a_prompt_result_checks_its_candidates_and_costs():
  c = Candidate((5,), ((0, 1),), (0.5,), "eos")
  PromptResult((c,), 1, 2)
  with pytest.raises(ConfigError, match=r"^PromptResult\.candidates: expected a tuple of Candidates, got list"):
    PromptResult([c], 1, 2)
  with pytest.raises(ConfigError, match=r"^PromptResult\.candidates: expected a tuple of Candidates"):
    PromptResult((c, "x"), 1, 2)
  with pytest.raises(ConfigError, match=r"^PromptResult\.sampled_steps: expected an int >= 0, got int -1$"):
    PromptResult((c,), -1, 2)
  with pytest.raises(ConfigError, match=r"^PromptResult\.generated_tokens: expected an int >= 0, got float 2\.5$"):
    PromptResult((c,), 1, 2.5)


# ------------------------------------------------------------------------------------------------ budgets too small


def test_a_grid_whose_budgets_give_a_step_search_nothing_to_run_is_refused():
  with pytest.raises(
    ConfigError,
    match=r"^config\.tts\.budgets: strategy 'beam' needs a budget >= 2 .*got \(1,\); add a budget >= 2 or drop "
    r"\['beam', 'dvts'\] from config\.tts\.strategies$",
  ):
    tts_config_from_dict({"budgets": [1]})
  with pytest.raises(ConfigError, match=r"^config\.tts\.budgets: strategy 'dvts' needs a budget >= 2"):
    tts_config_from_dict({"budgets": [1], "strategies": ["best_of_n", "dvts"]})
  assert tts_config_from_dict({"budgets": [1], "strategies": ["best_of_n"]}).budgets == (1,)
  # Budget 1 beside larger ones is Best-of-1 for a step search: its cells skip it, and the table says why.
  cfg = tts_config_from_dict({"budgets": [1, 4]})
  assert searched_budgets(cfg.budgets) == [4]
  summary = {k: 0.5 for k in SUMMARY_KEYS} | {"problems": 2, "mixed_problems": 0}
  metrics = {
    "results": {"qa": {"greedy": {"1": summary}, "beam[maxprob]": {"4": summary}}},
    "config": {"budgets": [1, 4]},
  }
  assert "Beam search and DVTS have no N = 1 entry" in tts_report.table_markdown(metrics)


# ------------------------------------------------------------------------------------------------ stored cells


def _summary(**changes) -> dict:
  out = {k: 0.5 for k in SUMMARY_KEYS}
  out.update(problems=4, mixed_problems=1, sampled_steps=12.0, generated_tokens=80.0, seconds_per_problem=0.1)
  return {**out, **changes}


def _cascade(**changes) -> dict:
  kind = {"accuracy": [0.5] * len(FRACTIONS), "prm_calls": list(FRACTIONS)}
  return {"budget": 4, "fractions": list(FRACTIONS), "steps": 10, "prm": kind, "fusion": kind, **changes}


def _store(tmp_path, cell, check, key="qa.beam.maxprob"):
  """Stores `cell` as the job would (sealed), then reads it back through `stored_cell`."""
  run = Run(str(tmp_path))
  stored_cell(run, key, lambda: cell, check)
  return lambda: stored_cell(run, key, lambda: pytest.fail("a stored cell was made again"), check)


@pytest.mark.parametrize(
  "cell, match",
  [
    ({"4": _summary(best=7.0)}, r"4\.best: expected a number in \[0, 1\], found float 7\.0$"),
    ({"4": _summary(majority=math.nan)}, r"4\.majority: expected a number in \[0, 1\], found float nan$"),
    ({"4": _summary(problems=-2)}, r"4\.problems: expected an int >= 1, found int -2$"),
    ({"4": _summary(mixed_problems=True)}, r"4\.mixed_problems: expected an int >= 0, found bool True$"),
    ({"4": _summary(sampled_steps=math.inf)}, r"4\.sampled_steps: expected a finite number >= 0, found float inf$"),
    ({"4": _summary(selection_auroc=1.5)}, r"4\.selection_auroc: expected a number in \[0, 1\] or NaN"),
    ({"4": {k: v for k, v in _summary().items() if k != "pass@n"}}, r"4: expected the keys .*missing \['pass@n'\]"),
    ({"4": _summary(), "16": _summary()}, r"budgets: expected the keys \['4'\]; missing \[\], unexpected \['16'\]$"),
    ({"4": [0.5]}, r"4: expected a JSON object, found list"),
  ],
)
def test_a_stored_cell_is_checked_value_by_value(tmp_path, cell, match):
  read = _store(tmp_path, {"4": _summary()}, check_cell([4]))
  assert read() == {"4": _summary()}
  path = os.path.join(tmp_path, "cells", "qa.beam.maxprob.json")
  write_json(path, cell, seal=True)  # a sealed file holding what no cell can hold
  with pytest.raises(DataFormatError, match=rf"^{path}: {match}"):
    read()


def test_a_stored_cell_changed_after_it_was_written_is_refused(tmp_path):
  read = _store(tmp_path, {"4": _summary()}, check_cell([4]))
  path = os.path.join(tmp_path, "cells", "qa.beam.maxprob.json")
  with open(path) as f:
    text = f.read()
  with open(path, "w") as f:
    f.write(text.replace("0.5", "7.0", 1))
  with pytest.raises(DataFormatError, match=rf"^{path}: tts cell does not match its seal"):
    read()
  with open(path, "w") as f:
    json.dump([1, 2], f)
  os.remove(path + ".sha256")  # no seal: a write cut short, made again
  run = Run(str(tmp_path))
  assert stored_cell(run, "qa.beam.maxprob", lambda: {"4": _summary(best=0.25)}, check_cell([4]))["4"]["best"] == 0.25
  write_json(path, [1, 2], seal=True)
  with pytest.raises(DataFormatError, match=rf"^{path}: tts cell must hold a JSON object, got list$"):
    read()


@pytest.mark.parametrize(
  "changes, match",
  [
    ({"budget": 8}, r"budget: expected the largest budget 4, found int 8$"),
    ({"fractions": [0.0, 1.0]}, r"fractions: expected \["),
    ({"steps": -1}, r"steps: expected an int >= 0, found int -1$"),
    (
      {"prm": {"accuracy": [7.0] * len(FRACTIONS), "prm_calls": list(FRACTIONS)}},
      r"prm\.accuracy\[0\]: expected a number in \[0, 1\]",
    ),
    (
      {"fusion": {"accuracy": [0.5]}},
      r"fusion: expected the keys \['accuracy', 'prm_calls'\]; missing \['prm_calls'\]",
    ),
    ({"prm": {"accuracy": [0.5], "prm_calls": [0.0]}}, r"prm\.accuracy: expected a list of \d+ numbers"),
  ],
)
def test_a_stored_cascade_is_checked_value_by_value(tmp_path, changes, match):
  key = "qa.cascade.fusion"
  read = _store(tmp_path, _cascade(), check_cascade(4), key)
  assert read() == _cascade()
  path = os.path.join(tmp_path, "cells", f"{key}.json")
  write_json(path, _cascade(**changes), seal=True)
  with pytest.raises(DataFormatError, match=rf"^{path}: {match}"):
    read()


def _step_scores(path, labels=(0.0, 1.0, math.nan), prm=(0.1, 0.9, math.nan)):
  arrays = {}
  for split in ("val", "test"):
    arrays[f"{split}/labels"] = np.asarray(labels, np.float32)
    arrays[f"{split}/domain"] = np.asarray(["qa"] * len(labels))
    arrays[f"{split}/score/prm"] = np.asarray(prm, np.float32)
  with atomic_open(path, "wb", seal=True) as f:  # as the ReProbe job writes them
    np.savez(f, **arrays)


def test_the_stored_step_scores_the_tts_job_reads_are_checked(tmp_path):
  path = str(tmp_path / "step_scores.npz")
  _step_scores(path)
  assert set(read_step_scores(path)) == {"val", "test"}
  _step_scores(path, labels=(0.0, 2.0, 1.0))
  with pytest.raises(DataFormatError, match=rf"^{path}: val/labels: expected 0, 1 or NaN, found \[2\.0\]$"):
    read_step_scores(path)
  _step_scores(path, prm=(0.1, 5.0, -math.inf))
  with pytest.raises(DataFormatError, match=rf"^{path}: val/score/prm: expected a probability .*found \[5\.0, -inf\]$"):
    read_step_scores(path)
