"""The benchmark harness runs end to end: `bench.run --quick` on the tiny random Llama writes every row.

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

pytest.importorskip("torch")
pytest.importorskip("matplotlib")  # the `bench` extra
pytestmark = pytest.mark.slow  # a whole bench run (about a minute); .ci/run runs the slow tests after the suite

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


def test_shared_context_row(result):
  res, out = result
  sc = res["shared_context"]
  for side in ("shared", "copied"):
    assert sc[side]["median_s"] > 0 and sc[side]["steady_compiles"] == 0
  assert sc["parity"]["tokens_equal"] == 1.0 and sc["parity"]["logprob_max_abs"] < 1e-4
  # The copied side holds the context once per row; the shared side once in all.
  assert sc["copied"]["cache_bytes"] > sc["shared"]["cache_bytes"]
  assert "## Shared context" in (out / "results.md").read_text()


def test_roofline_goals_and_reports(result):
  res, out = result
  roof = res["roofline"]
  assert roof["matmul"]["jax_flops"] > 0 and roof["matmul"]["numpy_flops"] > 0
  assert roof["bandwidth"]["numpy_copy_bytes_per_s"] > 0 and roof["bandwidth"]["jax_copy_bytes_per_s"] > 0
  assert roof["prefill_plain"]["ours_flops_per_s"] > 0
  assert roof["decode_b1"]["ours_bytes_per_s"] > 0 and roof["decode_b1"]["param_bytes_per_token"] > 0
  assert len(res["goals"]) == 9  # the 8 of bench.run + the long-thinking SPAE goal (sizes.spae_lengths)
  assert all(g["status"] in ("met", "missed") or g["status"].startswith("pending") for g in res["goals"])
  md = (out / "results.md").read_text()
  assert "| Greedy decode, batch 32" in md and "## Goals" in md
  assert (out / "results.png").stat().st_size > 1000


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
    assert s["problems"] * c["beams"] * c["n"] <= side["sampled_steps"] <= (
        s["problems"] * c["beams"] * c["n"] * c["max_steps"]), (name, side["sampled_steps"])
  assert bon["beam"] == ref["ours"]  # one timing of our beam search serves both comparisons
  assert ref["ratio"] > 0 and ref["ratio_of_min_times"] > 0 and bon["cost_ratio"] > 0
  assert "## Step-level beam search" in (out / "results.md").read_text()
  sc = s["scorers"]  # the same search guided by the probe, the PRM and perplexity (issue 15)
  assert set(sc["sides"]) == {"probe", "prm", "perplexity"}
  for name, side in sc["sides"].items():
    assert side["seconds_per_problem"] > 0 and side["steady_compiles"] == 0, (name, side)
    assert s["problems"] * c["beams"] * c["n"] <= side["sampled_steps"], (name, side["sampled_steps"])
  assert sc["per_problem_ratio"] > 0 and "Per searched problem" in (out / "results.md").read_text()


def test_beam_search_and_the_reference_loop_select_the_same_steps(result):
  # Greedy, same scorer: our jitted search and the per-problem PyTorch loop pick the same steps (at least on one
  # problem: a near-tie between the frameworks' logits may flip a token elsewhere), with the same step scores.
  par = result[0]["search"]["parity"]
  assert par["n"] == 1 and par["beams"] <= 2 and par["problems"] >= 2
  assert par["problems_equal"] >= 1 / par["problems"]
  assert par["score_max_abs"] < 1e-4
  assert all(k >= 1 for k in par["steps_selected"])


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


def test_spae_loop_gives_the_batched_potentials(tmp_path):
  # Fast on its own (~30 s, nearly all XLA compiles): the per-boundary loop (a fresh prefill of the truncated
  # trajectory, one boundary per probe call) draws the batched path's random streams, so both give the same Acc and
  # Conf at every boundary, and another seed does not. bench.run's section (test_spae_section) times both.
  import jax

  from bench import spae
  from bench.pair import build_tiny
  from reprobe_jax.models import LanguageModel, load_pretrained
  from reprobe_jax.spae.potential import Prober, ProbeConfig
  base = load_pretrained(build_tiny(str(tmp_path)))  # bench.run's tiny random Llama, without a tokenizer
  # weights x4: peaked next-token distributions, so Conf differs between samples (near 0.003 everywhere otherwise)
  lm = spae.with_tokenizer(LanguageModel(base.config, base.graphdef, jax.tree.map(lambda x: 4 * x, base.params),
                                         None))
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


def test_spae_long_set_holds_solver_paragraphs(synthetic_lm):
  # The built-in worlds' tokenizer: paragraphs of the solver's thinking sentences, a boundary every 15-25 tokens,
  # up to the requested length; the loop re-sends a prefix that grows with L, ours feeds it once.
  from bench import spae
  from reprobe_jax.spae.potential import Prober
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


def test_cli_rejects_a_missing_model(tmp_path, capsys):
  from bench import run
  assert run.main([f"--model={tmp_path / 'nope'}", f"--out={tmp_path}", "--quick"]) == 1
  assert "nope" in capsys.readouterr().err
