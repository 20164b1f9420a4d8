"""The benchmark harness runs end to end: `bench.run --quick` on the tiny random Llama writes every row (slow); the
roofline's pieces on stubs and the tiny config (fast): GEMM shapes, best-of timing, bounds, harness errors, the
machine line, compile figures.

Checks structure and sanity only (positive numbers, parity between the frameworks); it asserts no speed, since
timings on shared CI cores mean nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np
import pytest
from conftest import require_cpu_kernels

pytest.importorskip("torch")
pytest.importorskip("matplotlib")  # the `bench` extra
slow = pytest.mark.slow  # a whole bench run (a few minutes); .ci/run runs the slow tests after the suite

# bench/ sits next to the package at the repository root, which plain `pytest` does not put on sys.path.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROWS = ["prefill_capture", "prefill_plain", "decode_b1", "decode_b8", "decode_b32", "step_scoring"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
  import torch

  from bench import run

  out = tmp_path_factory.mktemp("bench")
  sizes = dataclasses.replace(run.QUICK, bandwidth_mib=16, matmul_n=256)
  # One PyTorch thread: on busy shared cores, OpenMP barriers of tiny ops wait out whole scheduler ticks, which
  # would make this smoke test slow, not wrong.
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    run.run("tiny", str(out), sizes, quick=True, log=lambda *_: None)
  finally:
    torch.set_num_threads(threads)
  with open(out / "results.json") as f:
    return json.load(f), out


@slow
def test_every_row_has_positive_numbers(result):
  res, _ = result
  rows = {r["name"]: r for r in res["rows"]}
  assert list(rows) == ROWS
  for name, r in rows.items():
    for side in ("ours", "hf"):
      s = r[side]
      assert s[r["unit"]] > 0 and s["median_s"] > 0 and s["first_call_s"] > 0, (name, side, s)
      assert len(s["times_s"]) >= 5 and all(t > 0 for t in s["times_s"]), (name, side)
      assert s["steady_compiles"] == 0, f"{name}: reprobe-jax recompiled in steady state"
    assert r["ratio"] > 0
  probe = rows["step_scoring"]["probe"]
  assert probe.get("steps_per_s", 0) > 0 or probe["status"].startswith("pending"), probe


@slow
def test_both_frameworks_compute_the_same_thing(result):
  res, _ = result
  p = {r["name"]: r["parity"] for r in res["rows"]}
  assert p["prefill_plain"]["logits_rel"] < 1e-4
  assert p["prefill_capture"]["hidden_last_rel"] < 1e-4
  assert p["prefill_capture"]["attn_window_max_abs"] < 1e-4
  assert p["prefill_capture"]["top_probs_max_abs"] < 1e-4
  assert p["step_scoring"]["step_reward_max_abs"] < 1e-4
  for b in (1, 8, 32):
    assert p[f"decode_b{b}"]["greedy_rows_equal"] == 1.0


@slow
def test_shared_context_row(result):
  res, out = result
  sc = res["shared_context"]
  for side in ("shared", "copied"):
    assert sc[side]["median_s"] > 0 and sc[side]["steady_compiles"] == 0
  assert sc["parity"]["tokens_equal"] == 1.0 and sc["parity"]["logprob_max_abs"] < 1e-4
  # The copied side holds the context once per row; the shared side once in all.
  assert sc["copied"]["cache_bytes"] > sc["shared"]["cache_bytes"]
  assert "## Shared context" in (out / "results.md").read_text()


@slow
def test_roofline_goals_and_reports(result):
  res, out = result
  roof = res["roofline"]
  m = roof["matmul"]
  assert m["square"]["jax_flops_per_s"] > 0 and m["square"]["numpy_flops_per_s"] > 0
  assert len(m["shapes"]) == 5 * 4  # 5 distinct weight shapes of the tiny Llama at prefill M and decode M 1, 8, 32
  assert m["threads"]["torch_intra_op"] >= 1
  assert all(v > 0 for by in roof["bandwidth"]["kinds"].values() for v in by.values())
  assert roof["prefill_plain"]["ours_flops_per_s"] > 0
  assert roof["decode_b1"]["ours_bytes_per_s"] > 0 and roof["decode_b1"]["param_bytes_per_token"] > 0
  for name in ("prefill_plain", "prefill_capture", "decode_b1"):
    for side in ("ours", "hf"):
      f = roof[name][f"{side}_of_bound"]
      assert (f is None) == (roof[name][f"{side}_status"] == "harness-error") and (f is None or 0 < f <= 1)
  # the 13 of bench.run (the PRM's whole-text scoring and the two per-problem search costs among them) + the
  # long-thinking SPAE goal (sizes.spae_lengths) + no harness errors
  assert len(res["goals"]) == 15
  goals = {g["goal"] for g in res["goals"]}
  assert "PRM step scoring (whole text) >= 1.0x PyTorch" in goals
  assert "probe-guided beam search >= 5x cheaper per problem than PRM-guided" in goals
  assert "probe-guided beam search <= 1.2x Perplexity-guided per problem" in goals
  assert all(
    g["status"] in ("met", "missed", "harness-error") or g["status"].startswith("pending") for g in res["goals"]
  )
  phases = {p["batch"]: p for p in res["decode_phases"]}
  assert sorted(phases) == [1, 8, 32]
  for p in phases.values():
    assert p["ours_first_token_s"] > 0 and p["hf_first_token_s"] > 0 and p["first_token_ratio"] > 0
    assert (p["step_ratio"] is None) == (p["ours_step_s"] is None) and (p["step_ratio"] is None or p["step_ratio"] > 0)
  md = (out / "results.md").read_text()
  assert "| Greedy decode, batch 32" in md and "## Goals" in md and "## Compile time" in md
  assert "Greedy decode by phase" in md
  assert md.split("## Performance\n\n")[1].startswith("Machine: ")
  assert [r["function"] for r in res["compile"]["rows"]] == ["prefill forward", "greedy decode loop"]
  assert (out / "results.png").stat().st_size > 1000


@slow
def test_search_rows(result):
  res, out = result
  s = res["search"]
  rows = {r["name"]: r for r in s["rows"]}
  assert list(rows) == ["beam_vs_reference", "beam_vs_best_of_n"]
  ref, bon = rows["beam_vs_reference"], rows["beam_vs_best_of_n"]
  c = s["config"]
  for name, side in (("ours", ref["ours"]), ("reference", ref["hf"]), ("best_of_n", bon["best_of_n"])):
    for key in ("sampled_steps", "generated_tokens", "steps_per_s", "tokens_per_s", "median_s", "first_call_s"):
      assert side[key] > 0, (name, key, side)
    assert side["steady_compiles"] == 0, f"{name} recompiled in steady state"
    # Round 0 samples B x N steps per problem; no side samples more than B x N per round.
    assert (
      s["problems"] * c["beams"] * c["n"]
      <= side["sampled_steps"]
      <= (s["problems"] * c["beams"] * c["n"] * c["max_steps"])
    ), (name, side["sampled_steps"])
  assert bon["beam"] == ref["ours"]  # one timing of our beam search serves both comparisons
  assert ref["ratio"] > 0 and ref["ratio_of_min_times"] > 0 and bon["cost_ratio"] > 0
  assert "## Step-level beam search" in (out / "results.md").read_text()
  sc = s["scorers"]  # the same search guided by the probe, the PRM and perplexity
  assert set(sc["sides"]) == {"probe", "prm", "perplexity"}
  for name, side in sc["sides"].items():
    assert side["seconds_per_problem"] > 0 and side["steady_compiles"] == 0, (name, side)
    assert s["problems"] * c["beams"] * c["n"] <= side["sampled_steps"], (name, side["sampled_steps"])
  assert sc["per_problem_ratio"] > 0 and "Per searched problem" in (out / "results.md").read_text()
  dp = s["sharded"]  # the info row: the probe-guided search on 8 virtual CPU devices against one, same problems
  assert dp["info"] and dp["ratio"] > 0 and dp["same_selections"], dp
  assert (dp["one"]["devices"], dp["sharded"]["devices"]) == (1, 8) and dp["sharded"]["steady_compiles"] == 0


@slow
def test_beam_search_and_the_reference_loop_select_the_same_steps(result):
  # Greedy, same scorer: our jitted search and the per-problem PyTorch loop pick the same steps (at least on one
  # problem: a near-tie between the frameworks' logits may flip a token elsewhere), with the same step scores.
  par = result[0]["search"]["parity"]
  assert par["n"] == 1 and par["beams"] <= 2 and par["problems"] >= 2
  assert par["problems_equal"] >= 1 / par["problems"]
  assert par["score_max_abs"] < 1e-4
  assert all(k >= 1 for k in par["steps_selected"])


@slow
def test_spae_section(result):
  res, out = result
  sp = res["spae"]
  assert sp["source"] == "random words" and sp["boundaries"] >= sp["trajectories"] >= 2
  for side in ("ours", "reference"):
    s = sp[side]
    assert s["boundaries_per_s"] > 0 and s["median_s"] > 0 and s["steady_compiles"] == 0, (side, s)
  assert sp["parity"]["equal"] and sp["ratio"] > 0
  assert sp["prefill_tokens"]["reference"] > sp["prefill_tokens"]["ours"]  # the prefix re-sent per boundary
  assert sp["ours_probe_slots"] >= sp["boundaries"]
  assert "## SPAE step potentials" in (out / "results.md").read_text()


@slow
def test_spae_long_section(result):
  res, out = result
  long = res["spae_long"]
  assert [r["length"] for r in long["rows"]] == list(res["sizes"]["spae_lengths"])
  for r in long["rows"]:
    assert r["source"] == "random-word paragraphs" and r["boundaries"] >= 2 and r["parity"]["equal"]
    assert r["response_tokens_mean"] <= r["length"] and r["ratio"] > 0
    assert r["token_positions"]["reference"] > r["token_positions"]["ours"] > r["token_positions"]["probe"]
    assert r["reference"]["boundaries_timed"] == r["boundaries"] and r["reference"]["steady_compiles"] == 0
  assert "## SPAE step potentials on long thinking" in (out / "results.md").read_text()
  assert any("thinking" in g["goal"] for g in res["goals"])


@slow
def test_spae_loop_gives_the_batched_potentials(tmp_path):
  # Fast on its own (~30 s, nearly all XLA compiles): the per-boundary loop (a fresh prefill of the truncated
  # trajectory, one boundary per probe call) draws the batched path's random streams, so both give the same Acc and
  # Conf at every boundary, and another seed does not. bench.run's section (test_spae_section) times both.
  import jax

  from bench import spae
  from bench.pair import build_random
  from reprobe_jax.models import LanguageModel, load_pretrained
  from reprobe_jax.spae.potential import ProbeConfig
  from reprobe_jax.spae.prober import Prober

  base = load_pretrained(build_random(str(tmp_path)))  # bench.run's tiny random Llama, without a tokenizer
  # weights x4: peaked next-token distributions, so Conf differs between samples (near 0.003 everywhere otherwise)
  lm = spae.with_tokenizer(LanguageModel(base.config, base.graphdef, jax.tree.map(lambda x: 4 * x, base.params), None))
  data = spae.thinking_set(lm, 2, source="random words")
  prober = Prober(lm, ProbeConfig(samples=2, max_tokens=3, batch_size=2))
  ours, ref = spae.batched(prober, data), spae.per_boundary(prober, data)
  assert [len(o) for o in ours] == [len(r) for r in ref] == [2, 3]
  par = spae.parity(ours, ref)
  assert par["equal"] and par["conf_max_abs"] < 1e-4 and par["acc_max_abs"] < 1e-6, par
  conf = np.concatenate([o.conf for o in ours])
  assert np.isfinite(conf).all() and np.ptp(conf) > 0.05
  other = spae.per_boundary(Prober(lm, ProbeConfig(samples=2, max_tokens=3, seed=1)), data)
  assert not spae.parity(ours, other)["equal"]
  assert spae.probe_slots(prober.boundaries(data.response_ids), [len(r) for r in data.response_ids], 2) == 2 * 4
  assert spae.probe_slots(prober.boundaries(data.response_ids), [len(r) for r in data.response_ids], 1) == 4 + 4
  # long thinking of random-word paragraphs: the loop timed on every other boundary gives those boundaries' numbers
  long = spae.long_set(lm, 1, 80, seed=3)
  assert long.source == "random-word paragraphs" and len(long.response_ids[0]) <= 80
  cuts = prober.boundaries(long.response_ids)[0]
  assert len(cuts) >= 3 and np.all(np.diff(cuts) >= spae.PARAGRAPH_TOKENS[0])
  strided = spae.per_boundary(prober, long, stride=2)
  assert np.array_equal(strided[0].cuts, cuts[::2])
  assert spae.parity(spae.every(spae.batched(prober, long), 2), strided)["equal"]


@slow
def test_spae_long_set_holds_solver_paragraphs(synthetic_lm):
  # The built-in worlds' tokenizer: paragraphs of the solver's thinking sentences, a boundary every 15-25 tokens,
  # up to the requested length; the loop re-sends a prefix that grows with L, ours feeds it once.
  from bench import spae
  from reprobe_jax.spae.prober import Prober

  data = spae.long_set(synthetic_lm, 2, 300)
  assert data.source == "solver paragraphs" and data.response_ids[0] != data.response_ids[1]
  prober = Prober(synthetic_lm)
  for ids, cuts in zip(data.response_ids, prober.boundaries(data.response_ids)):
    assert 300 - spae.PARAGRAPH_TOKENS[1] - 2 <= len(ids) <= 300
    text = synthetic_lm.tokenizer.decode(list(ids))
    assert text.startswith("<think>") and text.rstrip().endswith("</think>") and "Step" in text
    gaps = np.diff(np.concatenate([[-1], cuts]))
    assert len(cuts) >= 10 and gaps[1:].min() >= spae.PARAGRAPH_TOKENS[0] - 1 and gaps.max() <= 40, gaps
  tp = spae.token_positions(prober, data, prober.boundaries(data.response_ids))
  assert tp["reference"] > 5 * tp["ours"] - 5 * tp["probe"]  # context re-sent at every boundary
  with pytest.raises(spae.ConfigError, match="holds no paragraph"):
    spae.long_set(synthetic_lm, 1, 12)


@slow
def test_cli_rejects_a_missing_model(tmp_path, capsys):
  from bench import run

  assert run.main([f"--model={tmp_path / 'nope'}", f"--out={tmp_path}", "--quick"]) == 1
  assert "nope" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- roofline (fast)


def _tiny_config():
  # bench.pair.build_random's Llama: hidden 64, intermediate 128, 4 heads of 16, 2 KV heads, vocab 512, 2 layers.
  from reprobe_jax.models.config import ModelConfig

  return ModelConfig(
    family="llama",
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
  )


def test_gemm_shapes_match_the_config_by_hand():
  from bench.timing import Gemm, forward_flops, gemm_shapes

  cfg = _tiny_config()
  # q: 64 -> 4 * 16 = 64, o: 64 -> 64 (one shape); k, v: 64 -> 2 * 16 = 32; gate, up: 64 -> 128; down: 128 -> 64;
  # LM head 64 -> 512. Prefill M = batch 2 * seq 32 = 64, then decode M = 1.
  per_m = [
    ("q_proj/o_proj", 64, 64),
    ("k_proj/v_proj", 64, 32),
    ("gate_proj/up_proj", 64, 128),
    ("down_proj", 128, 64),
    ("lm_head", 64, 512),
  ]
  assert gemm_shapes(cfg, [64, 1]) == [Gemm(n, m, k, o) for m in (64, 1) for n, k, o in per_m]
  assert gemm_shapes(cfg, [64])[-1].flops == 2 * 64 * 64 * 512 == 4_194_304
  # Each projection once per layer plus the head is the weight part of a one-token forward: 2 * (64*64 * 2 +
  # 64*32 * 2 + 64*128 * 3) * 2 layers + 2 * 64*512 = 2 * 36864 * 2 + 65536 = 212992; attention at seq 1 adds
  # 2 layers * 4 * 4 heads * 16 * 1 = 512.
  count = {"q_proj/o_proj": 2, "k_proj/v_proj": 2, "gate_proj/up_proj": 2, "down_proj": 1, "lm_head": 1}
  weights = sum(g.flops * count[g.name] * (1 if g.name == "lm_head" else cfg.num_layers) for g in gemm_shapes(cfg, [1]))
  assert weights == 212_992 and forward_flops(cfg, 1, 1) == 212_992 + 512
  # SmolLM2-135M (hidden 576, 9 heads of 64, 3 KV heads, intermediate 1536, vocab 49152): q and o are 576 x 576,
  # k and v 576 x 192.
  smol = cfg.replace(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    sliding_windows=(),
  )
  assert [(g.name, g.k, g.n) for g in gemm_shapes(smol, [8])] == [
    ("q_proj/o_proj", 576, 576),
    ("k_proj/v_proj", 576, 192),
    ("gate_proj/up_proj", 576, 1536),
    ("down_proj", 1536, 576),
    ("lm_head", 576, 49152),
  ]


def test_best_time_is_the_fastest_sample_not_the_median(monkeypatch):
  from bench import timing

  # perf_counter readings: warm-up 0 -> 1 s (one call per sample), then samples of 3 s, 2 s and 4 s.
  clock = iter([0.0, 1.0, 10.0, 13.0, 20.0, 22.0, 30.0, 34.0])
  monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
  assert timing.best_time(lambda: None, 3) == 2.0  # the median would be 3.0


def test_the_bounds_are_the_max_over_what_was_measured():
  from bench import timing

  shapes = timing.gemm_shapes(_tiny_config(), [4])
  peaks = timing.matmul_peaks(shapes, 64, 2)
  figures = [r[k] for r in peaks["shapes"] + [peaks["square"]] for k in r if k.endswith("_flops_per_s")]
  assert len(figures) == 2 * 5 + 3 and min(figures) > 0 and peaks["peak_flops_per_s"] == max(figures)
  assert peaks["statistic"] == "best" and peaks["threads"]["xla_intra_op"] >= 1
  bw = timing.bandwidth(2**20, 2)
  rates = [v for by in bw["kinds"].values() for v in by.values()]
  assert len(rates) == 7 and min(rates) > 0 and bw["bound_bytes_per_s"] == max(rates)
  assert bw["bytes"] == 2**20  # 256 rows of the GEMV's 1024 floats


def test_two_passes_keep_the_better_figure_and_recompute_the_bounds():
  from bench import timing

  row = lambda name, m, **rates: {"name": name, "m": m, "k": 8, "n": 8, "flops": 1.0, **rates}
  pass_of = lambda head, square: timing._peak_summary(
    {"repeats": 5, "passes": 1, "threads": {}, "shapes": [head], "square": square}
  )
  first = pass_of(
    row("lm_head", 1, jax_flops_per_s=1.0, torch_flops_per_s=4.0),
    row("square", 8, jax_flops_per_s=3.0, torch_flops_per_s=2.0, numpy_flops_per_s=1.0),
  )
  second = pass_of(
    row("lm_head", 1, jax_flops_per_s=5.0, torch_flops_per_s=1.0),
    row("square", 8, jax_flops_per_s=2.0, torch_flops_per_s=2.0, numpy_flops_per_s=6.0),
  )
  assert first["peak_flops_per_s"] == 4.0 and first["peak_from"] == "torch lm_head M=1"
  both = timing.best_of(first, second)
  assert both["shapes"][0]["jax_flops_per_s"] == 5.0 and both["shapes"][0]["torch_flops_per_s"] == 4.0
  assert (both["square"]["jax_flops_per_s"], both["square"]["numpy_flops_per_s"]) == (3.0, 6.0)
  assert (both["peak_flops_per_s"], both["peak_from"], both["jax_peak_flops_per_s"]) == (6.0, "numpy 8^3", 5.0)
  assert both["repeats"] == 10 and both["passes"] == 2
  bw = lambda copy_np, copy_jax, read_jax: timing._bandwidth_summary(
    {
      "bytes": 4096,
      "repeats": 5,
      "passes": 1,
      "kinds": {"copy": {"numpy": copy_np, "jax": copy_jax}, "read": {"jax": read_jax}},
    }
  )
  merged = timing.best_of(bw(1.0, 2.0, 3.0), bw(4.0, 1.0, 2.0))
  assert merged["kinds"] == {"copy": {"numpy": 4.0, "jax": 2.0}, "read": {"jax": 3.0}}
  assert (merged["bound_bytes_per_s"], merged["bound_from"]) == (4.0, "copy (numpy)")


def _stub_roofline():
  from bench import report

  # Prefill: 80 GFLOP in 0.5 s = 160 GFLOP/s (ours) and in 2 s = 40 GFLOP/s (PyTorch) against a 100 GFLOP/s bound.
  # Decode: 300 MB per token in 10 ms = 30 GB/s (ours) and in 40 ms = 7.5 GB/s (PyTorch) against 20 GB/s.
  rows = {
    "prefill_plain": {"ours": {"median_s": 0.5}, "hf": {"median_s": 2.0}},
    "decode_b1": {
      "ours": {"tokens_per_s": 100.0},
      "hf": {"tokens_per_s": 25.0},
      "decode_step_s": {"ours": 0.01, "hf": 0.04, "valid": True},
    },
  }
  peaks = {
    "peak_flops_per_s": 100e9,
    "peak_from": "jax 2048^3",
    "repeats": 5,
    "shapes": [],
    "threads": {"xla_intra_op": 2, "torch_intra_op": 2, "torch_inter_op": 2, "affinity_cpus": 2, "xla_flags": ""},
    "square": {"name": "square", "m": 8, "k": 8, "n": 8, "jax_flops_per_s": 100e9, "torch_flops_per_s": 90e9},
  }
  bw = {
    "bytes": 2**20,
    "kinds": {"copy": {"jax": 20e9}, "read": {"jax": 10e9}, "gemv": {}},
    "bound_bytes_per_s": 20e9,
    "bound_from": "copy (jax)",
  }
  return report.roofline(rows, peaks, bw, {"prefill_plain": 80e9}, 300_000_000, "cpu")


def test_a_fraction_above_one_is_a_harness_error():
  import re

  from bench import report

  roof = _stub_roofline()
  p, d = roof["prefill_plain"], roof["decode_b1"]
  assert p["ours_of_bound"] is None and p["ours_status"] == "harness-error"
  assert p["hf_of_bound"] == pytest.approx(0.4) and p["hf_status"] == "ok"
  assert d["ours_of_bound"] is None and d["ours_status"] == "harness-error"
  assert d["hf_of_bound"] == pytest.approx(0.375)
  assert len(roof["harness_errors"]) == 2 and "160 GFLOP/s is above its bound 100 GFLOP/s" in roof["harness_errors"][0]
  assert "30 GB/s is above its bound 20 GB/s" in roof["harness_errors"][1]
  goals = {g["goal"]: g for g in report.goals({}, roof)}
  assert goals["batch-1 decode >= 70% of the memory-bandwidth bound"]["status"] == "harness-error"
  errors = goals["no measured figure above its roofline bound (harness errors)"]
  assert errors["measured"] == 2 and errors["status"] == "harness-error"
  md = "\n".join(report.roofline_markdown(roof))
  assert md.count("**Harness error**") == 2
  assert all(int(x) <= 100 for x in re.findall(r"(\d+)%", md))
  assert report.bounded(5.0, 5.0, "x", "y", "u", 1.0) == {"fraction": 1.0, "status": "ok"}  # equal is within
  assert report.bounded(1.0, 0.0, "x", "y", "u", 1.0)["status"] == "harness-error"  # no bound measured


def test_goals_say_what_bounds_them_worked_example():
  """gemm_ratio by hand: one layer of q/o (2 GEMMs of 2 GFLOP each) and an LM head of 4 GFLOP, at M = 1024 (the
  M = 1 entries are not the prefill's and are left out). JAX: q/o at 100 GFLOP/s, head at 50; PyTorch: 200 and 100.
  Times: ours 2 * 2/100 + 4/50 = 0.12 s, theirs 2 * 2/200 + 4/100 = 0.06 s: 0.5x; without the head 0.02/0.04."""
  from bench import report

  g = 1e9
  shapes = [
    {"name": "q_proj/o_proj", "m": 1024, "flops": 2 * g, "jax_flops_per_s": 100 * g, "torch_flops_per_s": 200 * g},
    {"name": "lm_head", "m": 1024, "flops": 4 * g, "jax_flops_per_s": 50 * g, "torch_flops_per_s": 100 * g},
    {"name": "q_proj/o_proj", "m": 1, "flops": 1.0, "jax_flops_per_s": 1.0, "torch_flops_per_s": 1e9},
  ]
  assert report.gemm_ratio({"shapes": shapes}, layers=1)["gemm_ratio"] == pytest.approx(0.5)
  shapes[1]["torch_flops_per_s"] = 50 * g  # the head even: ours 0.12 s, theirs 0.02 + 0.08 = 0.10 s
  assert report.gemm_ratio({"shapes": shapes}, layers=1)["gemm_ratio"] == pytest.approx(0.10 / 0.12)
  no_head = report.gemm_ratio({"shapes": shapes}, layers=3, with_head=False)
  assert no_head["gemm_ratio"] == pytest.approx(0.5) and "LM head left out" in no_head["gemm_ratio_from"]
  assert report.gemm_ratio({}, layers=1) is None

  rows = {name: {"ratio": 0.9} for name in ("prefill_plain", "decode_b1")}
  rows["step_scoring"] = {"ratio": 0.9, "probe": {"steps_per_s": 1.0, "vs_best_prm": 30.0}}
  side = lambda s: {"seconds_per_problem": s}
  search = {
    "rows": [{"name": "beam_vs_reference", "ratio": 3.0}, {"name": "beam_vs_best_of_n", "cost_ratio": 1.5}],
    "scorers": {"sides": {"probe": side(2.2), "prm": side(4.0), "perplexity": side(2.0)}, "per_problem_ratio": 4 / 2.2},
  }
  long = lambda n: {"rows": [{"length": n, "ratio": 21.0}]}
  got = {x["goal"]: x for x in report.goals(rows, {"matmul": {"shapes": shapes}}, search, None, long(96), layers=1)}
  assert got["plain prefill >= 1.0x PyTorch"]["gemm_ratio"] == pytest.approx(0.10 / 0.12)
  assert "gemm_ratio" not in got["batch-1 greedy decode >= 1.5x HF generate"]  # decode runs other kernels
  per_problem = got["probe-guided beam search >= 5x cheaper per problem than PRM-guided"]
  assert per_problem["ceiling"] == pytest.approx(2.0) and per_problem["status"] == "missed"
  assert "at most 2" in report.bounded_by(per_problem) and report.bounded_by({"goal": "x"}) == ""
  name = "batched SPAE potentials >= 20x one request per boundary on thinking of 1024+ tokens"
  assert got[name]["status"].startswith("pending: the longest thinking measured is 96 tokens")
  assert got[name]["measured"] is None
  got = {x["goal"]: x for x in report.goals(rows, {}, None, None, long(2048))}
  assert got[name]["status"] == "met" and got[name]["length"] == 2048


def test_decode_phases_split_the_end_to_end_ratio():
  from bench import report

  # 32 rows x 32 new tokens: ours 3 s to the first token + 40 ms per step; PyTorch 3 s + 160 ms per step.
  row = lambda step, valid: {
    "shape": {"batch": 32, "prompt": 64, "new_tokens": 32},
    "ratio": 1.9,
    "decode_step_s": {"ours": 0.04, "hf": step, "valid": valid, "from_new_tokens": [17, 32]},
    "first_token_s": {"ours": 3.0, "hf": 3.3},
  }
  rows = {
    "decode_b32": row(0.16, True),
    "decode_b8": {**row(0.1, False), "shape": {"batch": 8, "prompt": 64, "new_tokens": 32}},
    "decode_b1": {"shape": {"batch": 1}, "ratio": 2.0},
    "prefill_plain": {"ratio": 1.0},
  }
  phases = {p["batch"]: p for p in report.decode_phases(rows)}
  assert sorted(phases) == [8, 32]  # batch 1 has no phase measurements; prefill is not a decode row
  p = phases[32]
  assert p["step_ratio"] == pytest.approx(4.0) and p["first_token_ratio"] == pytest.approx(1.1)
  assert p["end_to_end_ratio"] == 1.9 and p["ours_step_s"] == 0.04
  assert phases[8]["step_ratio"] is None and phases[8]["ours_step_s"] is None  # an invalid difference is no figure
  md = "\n".join(report.decode_phases_markdown(list(phases.values())))
  assert "decode loop timed alone over 32 new tokens" in md and "its 17- and 32-new-token `generate` runs" in md
  assert "| 32 | 1.90x | 40.0 ms | 160.0 ms | 4.00x | 3.00 s | 3.30 s | 1.10x |" in md
  assert "| 8 | 1.90x | - | - | - |" in md
  assert report.decode_phases_markdown([]) == []


def test_the_roofline_names_the_fastest_read_kernel():
  from bench import report

  rows = {
    "decode_b1": {
      "ours": {"tokens_per_s": 50.0},
      "hf": {"tokens_per_s": 25.0},
      "decode_step_s": {"ours": 0.02, "hf": 0.04, "valid": True},
    }
  }
  peaks = {"peak_flops_per_s": 100e9, "peak_from": "jax 2048^3"}
  # 300 MB per token in 20 ms = 15 GB/s; bound 40 GB/s (a copy); fastest read kernel 20 GB/s (torch GEMV).
  bw = {
    "kinds": {"copy": {"jax": 40e9}, "read": {"jax": 10e9, "torch": 18e9}, "gemv": {"torch": 20e9}},
    "bound_bytes_per_s": 40e9,
    "bound_from": "copy (jax)",
  }
  d = report.roofline(rows, peaks, bw, {}, 300_000_000, "cpu")["decode_b1"]
  assert d["ours_of_bound"] == pytest.approx(0.375)
  assert (d["best_read_bytes_per_s"], d["best_read_from"]) == (20e9, "gemv (torch)")
  assert d["best_read_of_bound"] == pytest.approx(0.5) and d["ours_of_best_read"] == pytest.approx(0.75)


def test_every_report_names_the_machine():
  from bench import report
  from reprobe_jax.eval.machine import Machine, extensions_from_flags

  assert extensions_from_flags({"fpu", "avx", "avx2", "fma", "sse4_2"}) == ("avx2", "fma")  # a Zen 3 EPYC
  assert extensions_from_flags({"avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}) == (
    "avx2",
    "fma",
    "avx512f",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
  )
  epyc = Machine("AMD EPYC 7B13", "AVX2", 2, "cpu", ("avx2", "fma"), 32 * 2**20)
  assert epyc.long() == "AMD EPYC 7B13; 2 cores; extensions: avx2 fma; last-level cache 32 MiB; JAX backend cpu"
  env = {
    "jax": "0",
    "jax_backend": "cpu",
    "torch": "0",
    "torch_device": "cpu",
    "torch_threads": 2,
    "transformers": "0",
    "cpu_count": 2,
    "machine": str(epyc),
    "machine_detail": epyc.long(),
    "threads": {"xla_intra_op": 2, "torch_intra_op": 2},
    "load_start": [1.5, 1.0, 1.0],
    "load_end": [2.25, 1.0, 1.0],
  }
  result = {
    "model": "tiny",
    "environment": env,
    "rows": [],
    "roofline": _stub_roofline(),
    "goals": [],
    "quick": True,
    "repeats": 5,
    "wall_s": 1.0,
  }
  line = (
    "Machine: AMD EPYC 7B13; 2 cores; extensions: avx2 fma; last-level cache 32 MiB; JAX backend cpu; "
    "1-min load average 1.50 at start, 2.25 at end; XLA intra-op threads 2, torch threads 2."
  )
  assert report.machine_line(env) == line
  md = report.markdown(result)
  assert md.split("## Performance\n\n")[1].startswith(line + "\n\n| measurement |")
  assert "**Harness error**" in md.split("## Every measurement")[0]  # in the Performance table's block


def test_compile_figures_of_an_abstract_model():
  from bench import compile as compile_bench

  cfg = compile_bench.qwen3_8b_config()
  # per layer: 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128 = 192,946,432;
  # x 36 layers + untied embedding and head 2 * 151936 * 4096 + final norm 4096 = 8,190,735,360.
  assert cfg.num_params == 8_190_735_360 and cfg.qk_norm and not cfg.tie_word_embeddings
  import jax

  _, params = compile_bench.abstract_model(cfg)
  leaves = jax.tree.leaves(params)
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)  # nothing allocated
  assert sum(x.size for x in leaves) == cfg.num_params
  tiny = _tiny_config()
  graph, params = compile_bench.abstract_model(tiny)
  rows = compile_bench.measure(
    "tiny",
    tiny,
    graph,
    params,
    real=False,
    batch=2,
    seq=16,
    decode_batch=1,
    prompt_len=16,
    new_tokens=8,
    log=lambda *_: None,
  )
  assert [r["function"] for r in rows] == ["prefill forward", "greedy decode loop"]
  assert all(r["lower_s"] > 0 and r["compile_s"] > 0 and r["first_call_s"] is None for r in rows)
  assert rows[1]["shape"] == {"batch": 1, "prompt": 16, "new_tokens": 16}  # generate's power-of-two buckets
  md = "\n".join(compile_bench.markdown({"rows": rows, "persistent_cache": None}))
  assert "| tiny | greedy decode loop |" in md and "- (abstract weights)" in md


def test_chain_refuses_an_unknown_dtype():
  from bench import chain

  with pytest.raises(SystemExit, match="--dtype must be one of float32, bfloat16"):
    chain.main(["--dtype=float16"])


def test_chain_split_k_is_the_same_product():
  """bench.chain --split-k times x @ w as a batch of two half-K dots: the same product up to the order of the sum,
  and a plain dot where K is odd."""
  import jax.numpy as jnp
  from bench import chain

  rng = np.random.default_rng(0)
  for m, k, n in ((1, 576, 192), (8, 1536, 576), (3, 7, 5)):
    x, w = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    got = np.asarray(chain.split_k_matmul(jnp.asarray(x), jnp.asarray(w)))
    assert got.shape == (m, n)
    np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_xla_options_compare_runs_both_sides_and_restores_the_entries(tiny_llama_dir):
  """bench.xla_options times the decode entries and their *_in_jit twins on the same prompts, and leaves
  `decoding.prefill` / `decoding.decode` as they were; on a greedy tiny model both sides give the same tokens."""
  from bench import xla_options as xb
  from reprobe_jax.models import decoding, load_pretrained
  from reprobe_jax.models.xla_options import DECODE_COMPILER_OPTIONS

  before = decoding.prefill, decoding.decode
  lm = load_pretrained(tiny_llama_dir)
  r = xb.compare(lm, np.array([[1, 10, 11, 12], [1, 20, 21, 22]]), n_new=6, rounds=1)
  assert (decoding.prefill, decoding.decode) == before
  assert set(r) == {"options", "defaults", "same_tokens"} and r["same_tokens"] is True
  assert all(r[s]["total_s"] > 0 for s in ("options", "defaults"))
  if not DECODE_COMPILER_OPTIONS:
    with pytest.raises(SystemExit, match="options are off"):
      xb.main(["--model=tiny"])
  with pytest.raises(SystemExit, match="--batches must list positive"):
    xb.main(["--batches=0"])


def test_chain_packed_is_the_same_product_and_refuses_what_the_kernel_cannot_take():
  """bench.chain --packed times x @ w through the CPU decode kernel on packed weights: the same product."""
  import jax.numpy as jnp
  from bench import chain
  from reprobe_jax import kernels

  require_cpu_kernels()
  rng = np.random.default_rng(0)
  for m, k, n in ((1, 576, 192), (8, 1536, 576), (32, 576, 1536)):
    x, w = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    got = np.asarray(chain.packed_matmul(jnp.asarray(x), kernels.pack(jnp.asarray(w))))
    np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4 * np.sqrt(k))
  with pytest.raises(SystemExit, match="--packed runs the float32 kernel"):
    chain.main(["--packed", "--dtype=bfloat16"])
  with pytest.raises(SystemExit, match="--packed takes at most 128 rows"):
    chain.main(["--packed", "--m=1,1024"])


def test_attention_bench_sides_compute_the_same_and_bad_lists_are_refused():
  import jax.numpy as jnp
  from bench import attention as ab

  with pytest.raises(SystemExit, match="--batches and --slots must list positive integers"):
    ab.main(["--slots=0"])
  require_cpu_kernels()
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((6, ab.GROUPS, ab.HEAD), dtype=np.float32))
  k, v = (jnp.asarray(rng.standard_normal((6, 40, ab.HEAD), dtype=np.float32)) for _ in range(2))
  np.testing.assert_allclose(np.asarray(ab.attention_kernel(q, k, v)), np.asarray(ab.attention_xla(q, k, v)), atol=1e-5)


def test_decode_loop_step_times_the_loop_alone_and_says_when_rows_ended_early(tiny_llama_dir):
  """The batch-1 roofline's step: our decode loop timed apart from its prefill, over n_new - 1 forwards; valid only
  when every row decoded all n_new tokens (EOS is off, as on the generate side)."""
  from bench import cases
  from bench.cases import decode_loop_step
  from reprobe_jax.models import load_pretrained

  lm = load_pretrained(tiny_llama_dir)
  assert lm.tokenizer is not None and lm.tokenizer.eos_token_id is not None  # an EOS from the tokenizer is off too
  assert not cases._without_eos(lm).eos_mask().any() and lm.eos_mask().any()
  r = decode_loop_step(lm, np.array([[1, 10, 11, 12]]), 8, 5)
  assert r["valid"] is True and r["forwards"] == 7 and len(r["times_s"]) == 5
  assert r["step_s"] == pytest.approx(min(r["times_s"]) / 7)
  assert lm.config.eos_token_ids  # the caller's model keeps its EOS ids


# ------------------------------------------------------------------------------------------------ bench.rl


@slow
def test_rl_quick_writes_both_methods_and_the_goals(tmp_path, capsys):
  from bench import rl

  assert rl.main(["--quick", f"--out={tmp_path}"]) == 0
  with open(tmp_path / "rl.json") as f:
    res = json.load(f)
  assert res["quick"] and res["environment"]["cpu"] and res["model"]["random_weights"]
  for name in rl.METHODS:
    m = res["methods"][name]
    roles = [s["role"] for s in m["steps"]]
    assert roles.count("warm-up") == 1 and roles.count("measured") == 1, roles
    d = m["median"]
    assert d["rollout"] > 0 and d["update"] > 0 and d["total"] >= d["rollout"] + d["update"], d
    assert d["update_flops"] > 0 and m["update_of_bound"] > 0
  assert [g["status"] for g in res["goals"]][:2] == ["pending", "pending"]  # random weights: nothing to probe
  assert res["goals"][2]["status"] in ("met", "missed") and res["goals"][2]["target"] == rl.UPDATE_BOUND_GOAL
  assert all(set(g) >= {"goal", "measured", "target", "status"} for g in res["goals"])
  out = capsys.readouterr().out
  assert "| DAPO |" in out and "| SPAE |" in out


def test_rl_goals_worked_example():
  from bench import rl

  def method(rollout, probe, update, of_bound):
    return {"median": {"rollout": rollout, "probe": probe, "update": update, "total": rollout + probe + update},
            "update_of_bound": of_bound}  # fmt: skip

  # SPAE: probing 1.0 of a 2.0 s rollout (50%), step 9.0 s against DAPO's 8.0 s (1.125x); updates 2.5x and 4x bound
  methods = {"dapo": method(2.0, 0.0, 6.0, 2.5), "spae": method(2.0, 1.0, 6.0, 4.0)}
  got = rl.goals(methods, random_weights=False)
  assert [g["measured"] for g in got] == pytest.approx([0.5, 9.0 / 8.0, 4.0])
  assert [g["status"] for g in got] == ["missed", "met", "missed"]
  methods["spae"] = method(4.0, 1.0, 2.0, 2.0)  # 25% of the rollout: met at the bound; the update 2.5x: met
  assert [g["status"] for g in rl.goals(methods, random_weights=False)] == ["met", "met", "met"]
  assert [g["status"] for g in rl.goals(methods, random_weights=True)] == ["pending", "pending", "met"]


def test_rl_update_cost_counts_every_micro_batch(synthetic_lm):
  # XLA's cost analysis counts a loop body once: the step's update program (2 mini-batches of 2 micro-batches)
  # reports a fraction of its work; update_cost counts every mini- and micro-batch: at least the old log-probs'
  # forward plus a forward and backward (3x a forward) over every row.
  import types

  import jax
  import jax.numpy as jnp
  import optax

  from bench import rl, timing
  from reprobe_jax.rl import update as update_lib
  from reprobe_jax.rl.loop import RLConfig

  b, p, t = 8, 16, 32
  cfg = RLConfig(
    advantage="dapo", prompts_per_step=2, group_size=4, prompts_per_round=2, mini_batches=2, micro_batches=2
  )
  tx = optax.adam(1e-3)
  program = update_lib.make_step_update(
    synthetic_lm.static_graph, tx, cfg.loss_config(), mini_batches=2, micro_batches=2
  )
  args = (
    synthetic_lm.params,
    tx.init(synthetic_lm.params),
    jnp.ones((b, p + t), jnp.int32),
    jnp.ones((b, p + t), jnp.int32),
    jnp.ones((b, t), jnp.float32),
    jnp.ones((b, t), jnp.float32),
  )
  step = types.SimpleNamespace(policy=synthetic_lm, cfg=cfg)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args)
  got = rl.update_cost(step, tx, [("step_update", abstract)], {"step_update": program})
  model = timing.forward_flops(synthetic_lm.config, b, p + t)
  assert 3 * model <= got["flops"] <= 8 * model, (got, model)
  assert got["as_compiled"] < 0.75 * got["flops"], got
  twice = rl.update_cost(step, tx, [("step_update", abstract)] * 2, {"step_update": program})
  assert twice["flops"] == pytest.approx(2 * got["flops"]) and twice["calls"] == ["step_update", "step_update"]


def test_rl_cli_refuses_bad_arguments_before_any_work(tmp_path, capsys):
  from bench import rl

  assert rl.main(["--steps=0", f"--out={tmp_path}"]) == 1
  assert "--steps" in capsys.readouterr().err
  assert rl.main([f"--model={tmp_path / 'nowhere'}", f"--out={tmp_path}"]) == 1
  assert "--model" in capsys.readouterr().err
  assert not os.listdir(tmp_path)
