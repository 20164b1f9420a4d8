"""SPAE's trajectory metrics (docs/method.md §B3): hand-computed worked examples for every number, the displacement
categories, the potential curves' binning, the k check, and outcomes built from rendered thinking traces."""

from __future__ import annotations

import functools
import json
import math
import os

import jax.numpy as jnp
import numpy as np
import pytest

from reprobe_jax.steps.boundary import StepBoundary
from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.spae.metrics import (
  ThinkingOutcome,
  metrics_markdown,
  outcome_from,
  plot_curves,
  plot_displacement,
  potential_curves,
  summarise,
)
from reprobe_jax.spae.potential import StepPotentials, step_potential
from reprobe_jax.spae.prober import boundary_marks
from reprobe_jax.tasks import Problem, TraceNoise, make_problems, render_thinking, solve
from reprobe_jax.tasks.response import parse_thinking
from reprobe_jax.tasks.formats import conclude_paragraph, reflect_paragraph, work_paragraph

NAN = math.nan

# 12 + 5 = 17, 17 * 3 = 51, 51 - 4 = 47, 47 + 10 = 57
ARITH = Problem(
  id="arith",
  domain="arithmetic",
  question="Start with 12. Add 5. Multiply by 3. Subtract 4. Add 10.",
  answer="57",
  data={"start": 12, "ops": [["+", 5], ["*", 3], ["-", 4], ["+", 10]]},
)
ARITH_REF = ["12 + 5 = 17", "17 * 3 = 51", "51 - 4 = 47", "47 + 10 = 57"]


def outcome(pid, n, think_end, correct, phi, kinds, oracle, cuts, acc=None, conf=None):
  phi = np.asarray(phi, float)
  acc = np.where(np.isnan(phi), NAN, 0.5) if acc is None else acc
  conf = np.where(np.isnan(phi), NAN, 0.5) if conf is None else conf
  return ThinkingOutcome(
    problem_id=pid,
    n_tokens=n,
    think_end=think_end,
    correct=correct,
    cuts=np.asarray(cuts, int),
    acc=acc,
    conf=conf,
    phi=phi,
    kinds=tuple(kinds),
    oracle=oracle,
  )


def worked():
  """Eight trajectories, four problems, k = 2; every number of `summarise` below is worked out by hand."""
  return [
    # correct, saturated at boundary 1 = the oracle: solving 30, checking 80 - 30 = 50, 2 reflects after it
    outcome("p1", 100, 80, True, [0.1, 0.95, 0.97, 0.99], ["step", "step", "reflect", "reflect"], 1, [9, 29, 49, 69]),
    # correct, saturated at 0, oracle 1 (early by 1): solving 20, checking 30, 1 reflect after
    outcome("p1", 60, 50, True, [0.95, 0.5], ["step", "reflect"], 1, [19, 39]),
    # wrong although boundary 1 is saturated (R2W); its last boundary skipped (NaN)
    outcome("p2", 40, None, False, [0.2, 0.92, NAN], ["step", "step", "other"], 2, [9, 19, 29]),
    # correct, oracle 0, never saturated (a skipped boundary and 0.3)
    outcome("p2", 200, 150, True, [NAN, 0.3], ["reflect", "step"], 0, [49, 99]),
    # correct, oracle 0, saturated at 2 (late by 2): solving 30, checking 85 - 30 = 55, 1 reflect after
    outcome("p3", 90, 85, True, [0.0, 0.5, 0.91, 0.95], ["step", "step", "step", "reflect"], 0, [9, 19, 29, 39]),
    # correct without an oracle step (not in the agreement), saturated at 0: solving 5, checking 8 - 5 = 3
    outcome("p3", 10, 8, True, [0.99], ["other"], None, [4]),
    # wrong, no boundaries at all (never saturated)
    outcome("p4", 30, None, False, [], [], None, []),
    # wrong, never saturated (0.9 itself is not > eps_sat)
    outcome("p4", 20, 18, False, [0.5, 0.9], ["step", "step"], 1, [5, 15]),
  ]


def test_outcome_properties():
  a, b, c, d, e, f, g, h = worked()
  assert [o.first_saturated for o in (a, b, c, d, e, f, g, h)] == [1, 0, 1, None, 2, 0, None, None]
  assert [o.solving_tokens for o in (a, b, e, f)] == [30, 20, 30, 5]
  assert [o.checking_tokens for o in (a, b, e, f)] == [50, 30, 55, 3]
  assert c.checking_tokens == 40 - 20  # never closed: to the end of the response
  assert d.solving_tokens is None and d.checking_tokens is None and g.checking_tokens is None
  assert [o.displacement for o in (a, b, d, e, f)] == [0, -1, None, 2, None]


def test_summarise_worked_example():
  m = summarise(worked(), k=2)
  assert (m.k, m.problems, m.trajectories) == (2, 4, 8)
  assert m.acc_at_k == 5 / 8
  assert m.len_at_k == (100 + 60 + 40 + 200 + 90 + 10 + 30 + 20) / 8
  assert m.checked == 4  # correct and saturated: p1 (x2), p3 (x2)
  assert m.solving_tokens == (30 + 20 + 30 + 5) / 4
  assert m.checking_tokens == (50 + 30 + 55 + 3) / 4
  assert m.checking_share == pytest.approx(138 / (85 + 138))
  assert m.r2w == 1 / 8
  assert m.saturated_share == 5 / 8
  assert m.reflect_steps == (2 + 1 + 0 + 1 + 1 + 0 + 0 + 0) / 8
  assert m.reflect_after_saturation == (2 + 1 + 1 + 0) / 4
  assert m.oracle_count == 4  # correct with an oracle step: p1 (x2), p2's correct one, p3's first
  assert m.oracle_agreement == 1 / 4
  assert dict(m.displacement_counts) == {"synchronised": 1, "early": 1, "late": 1, "never": 1}
  assert m.displacements == (0, -1, 2)
  blob = json.loads(json.dumps(m.to_json(), allow_nan=False))
  assert blob["acc_at_k"] == 0.625 and blob["displacements"] == [0, -1, 2] and blob["displacement_counts"]["never"] == 1


def test_r2w_and_empty_populations_are_nan_not_errors():
  """All wrong and all saturated: R2W 1; nothing correct, so every correct-only number is NaN (JSON null)."""
  outs = [
    outcome("q", 20, 10, False, [0.95], ["step"], 0, [4]),
    outcome("q", 20, None, False, [0.1, 0.99], ["step", "reflect"], None, [4, 9]),
  ]
  m = summarise(outs, 2)
  assert m.r2w == 1.0 and m.saturated_share == 1.0 and m.acc_at_k == 0.0
  for name in ("solving_tokens", "checking_tokens", "checking_share", "reflect_after_saturation", "oracle_agreement"):
    assert math.isnan(getattr(m, name)), name
  assert m.checked == 0 and m.oracle_count == 0 and m.displacements == ()
  blob = json.loads(json.dumps(m.to_json(), allow_nan=False))
  assert blob["oracle_agreement"] is None and blob["solving_tokens"] is None
  # a right answer never saturated is no R2W, and a wrong one never saturated is none either
  m = summarise(
    [outcome("q", 20, 10, True, [0.2], ["step"], 0, [4]), outcome("q", 20, 10, False, [NAN], ["step"], 0, [4])], 2
  )
  assert m.r2w == 0.0 and m.saturated_share == 0.0 and m.displacement_counts["never"] == 1


def test_displacement_categories():
  def one(phi, oracle):
    return outcome("d", 50, 45, True, phi, ["step"] * len(phi), oracle, [5, 15, 25, 35][: len(phi)])

  outs = [
    one([0.1, 0.95, 0.1, 0.1], 1),
    one([0.1, 0.1, 0.1, 0.95], 1),
    one([0.91, 0.1, 0.1, 0.1], 3),
    one([0.1, 0.1, 0.1, 0.1], 2),
    one([0.1, 0.1, 0.1, 0.1], 0),
    one([0.1, 0.1, 0.95, 0.99], 2),
  ]
  m = summarise(outs, 6)
  assert dict(m.displacement_counts) == {"synchronised": 2, "early": 1, "late": 1, "never": 2}
  assert m.displacements == (0, 2, -3, 0) and m.oracle_agreement == 2 / 6 and m.oracle_count == 6


def test_k_check():
  outs = worked()
  with pytest.raises(ConfigError, match=r"exactly 3 samples per problem; 4 of 4 problems"):
    summarise(outs, 3)
  with pytest.raises(ConfigError, match=r"'p2': 1"):
    summarise(outs[:2] + outs[3:], 2)
  for bad in (0, -1, 2.0, True):
    with pytest.raises(ConfigError, match="k must be an integer"):
      summarise(outs, bad)
  with pytest.raises(ConfigError, match="no trajectories"):
    summarise([], 1)


def test_outcome_rejects_inconsistent_fields():
  with pytest.raises(DataFormatError, match="'x'.*phi has shape"):
    outcome("x", 10, None, True, [0.1], ["step"], 0, [3, 5], acc=np.zeros(2), conf=np.zeros(2))
  with pytest.raises(DataFormatError, match="'x'.*kinds"):
    outcome("x", 10, None, True, [0.1], ["thinking"], 0, [3])
  with pytest.raises(DataFormatError, match="'x'.*cuts must increase"):
    outcome("x", 10, None, True, [0.1, 0.2], ["step", "step"], 0, [5, 5])
  with pytest.raises(DataFormatError, match="'x'.*up to '</think>'"):
    outcome("x", 10, 4, True, [0.1], ["step"], 0, [6])
  with pytest.raises(DataFormatError, match="'x'.*think_end"):
    outcome("x", 10, 10, True, [0.1], ["step"], 0, [6])
  with pytest.raises(DataFormatError, match="'x'.*oracle"):
    outcome("x", 10, None, True, [0.1], ["step"], -1, [6])


# --- curves -------------------------------------------------------------------------------------------------------


def test_potential_curves_worked_example():
  curves = potential_curves(worked(), bins=4)
  np.testing.assert_allclose(curves.edges, [0, 0.25, 0.5, 0.75, 1])
  # correct: p1 (4 boundaries -> bins 0..3), p1 (2 -> bins 1, 3), p2 (NaN skipped, 0.3 -> bin 3), p3 (0..3), p3 (3)
  np.testing.assert_array_equal(curves.correct.count, [2, 3, 2, 5])
  np.testing.assert_allclose(
    curves.correct.phi,
    [(0.1 + 0.0) / 2, (0.95 + 0.95 + 0.5) / 3, (0.97 + 0.91) / 2, (0.99 + 0.5 + 0.3 + 0.95 + 0.99) / 5],
  )
  # wrong: p2 (3 boundaries at 1/3, 2/3, 1 -> bins 1, 2, [3 skipped]), p4 (none), p4 (2 -> bins 1, 3)
  np.testing.assert_array_equal(curves.wrong.count, [0, 2, 1, 1])
  assert math.isnan(curves.wrong.phi[0])
  np.testing.assert_allclose(curves.wrong.phi[1:], [(0.2 + 0.5) / 2, 0.92, 0.9])
  np.testing.assert_allclose(curves.correct.acc, [0.5] * 4)
  assert (curves.correct.trajectories, curves.wrong.trajectories) == (5, 3)
  json.dumps(curves.to_json(), allow_nan=False)


def test_curve_bins_are_exact_at_edges():
  """Boundary c of C lies at (c + 1) / C in (0, 1]: 10 of 10 fill the 10 bins one each (3/10 is bin 2, not bin 3 as
  ceil(0.3 * 10) in floats would say), 5 of 10 the odd bins, 3 of 10 bins 3, 6 and 9."""

  def one(c, values):
    values = np.asarray(values, float)
    return outcome(
      "c", 100, None, True, values, ["step"] * c, None, np.arange(c) * 5 + 1, acc=values / 2, conf=1 - values
    )

  curves = potential_curves([one(10, np.arange(10) / 10)], bins=10)
  np.testing.assert_array_equal(curves.correct.count, [1] * 10)
  np.testing.assert_allclose(curves.correct.phi, np.arange(10) / 10)
  np.testing.assert_allclose(curves.correct.acc, np.arange(10) / 20)
  np.testing.assert_allclose(curves.correct.conf, 1 - np.arange(10) / 10)
  curves = potential_curves([one(5, [0.1, 0.2, 0.3, 0.4, 0.5]), one(3, [0.7, 0.8, 0.9])], bins=10)
  np.testing.assert_array_equal(curves.correct.count, [0, 1, 0, 2, 0, 1, 1, 1, 0, 2])
  np.testing.assert_allclose(
    curves.correct.phi[[1, 3, 5, 6, 7, 9]], [0.1, (0.2 + 0.7) / 2, 0.3, 0.8, 0.4, (0.5 + 0.9) / 2]
  )
  assert np.isnan(curves.correct.phi[[0, 2, 4, 8]]).all() and np.isnan(curves.wrong.phi).all()
  for bad in (0, 2.5, None):
    with pytest.raises(ConfigError, match="bins"):
      potential_curves([], bins=bad)


# --- reports ------------------------------------------------------------------------------------------------------


def test_markdown_table():
  m = summarise(worked(), 2)
  table = metrics_markdown({"arithmetic, plain": m})
  lines = table.splitlines()
  assert lines[0] == ("| method | Acc@2 | Len@2 | solving | checking | R2W | reflect steps | oracle agreement |")
  # 62.50, 68.75 -> 69, 21.25 -> 21, 34.5 -> 34 (round half to even), 12.5, 0.625 -> 0.62, 25.0 of 4
  assert lines[2] == "| arithmetic, plain | 62.50 | 69 | 21 | 34 | 12.5 | 0.62 | 25.0 (n=4) |"
  empty = summarise([outcome("q", 20, 10, False, [0.1], ["step"], None, [4])], 1)
  assert "| q | 0.00 | 20 | n/a | n/a | 0.0 | 0.00 | n/a (n=0) |" in metrics_markdown({"q": empty})
  mixed = metrics_markdown({"a": m, "b": empty})
  assert "Acc@k" in mixed and "| a (k=2) |" in mixed and "| b (k=1) |" in mixed
  with pytest.raises(ConfigError, match="no rows"):
    metrics_markdown({})


def test_plots_write_pngs(tmp_path):
  m = summarise(worked(), 2)
  for name, write in (
    ("curves.png", lambda p: plot_curves(potential_curves(worked()), p)),
    ("displacement.png", lambda p: plot_displacement(m, p)),
    ("empty.png", lambda p: plot_displacement(summarise([worked()[6]], 1), p)),
  ):
    write(str(tmp_path / name))
    with open(tmp_path / name, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert sorted(os.listdir(tmp_path)) == ["curves.png", "displacement.png", "empty.png"]  # no temporary files left


# --- outcome_from -------------------------------------------------------------------------------------------------


def _paragraphs():
  """ARITH's chain (established after paragraph 3, 'Step 4'), a conclusion, two re-checks."""
  return [
    *(work_paragraph(s, k) for k, s in enumerate(ARITH_REF, 1)),
    conclude_paragraph("57"),
    reflect_paragraph("17 * 3 = 51"),
    reflect_paragraph("12 + 5 = 17", 1),
  ]


@functools.lru_cache(maxsize=None)
def tokenizer():
  from reprobe_jax.synthetic.tokenizer import build_tokenizer

  problems = make_problems("arithmetic", 6, 0, 2)
  corpus = [render_thinking(_paragraphs(), "57")] + [
    solve(p, "arithmetic", np.random.default_rng(i), "thinking").text for i, p in enumerate(problems)
  ]
  return build_tokenizer(corpus * 4, 500)


def sampler_cuts(tok, ids):
  """The boundaries as the prober finds them: the sampler's paragraph stop automaton over the tokens."""
  table = StepBoundary("paragraph").compile(tok, len(tok))
  marks = boundary_marks(table, jnp.asarray([ids], jnp.int32), jnp.asarray([len(ids)], jnp.int32))
  return np.flatnonzero(np.asarray(marks)[0])


def potentials_for(cuts, acc, conf):
  acc, conf = np.asarray(acc, float), np.asarray(conf, float)
  return StepPotentials(np.asarray(cuts), acc, conf, step_potential(acc, conf))


def encode(tok, text):
  return list(tok(text, add_special_tokens=False)["input_ids"])


def test_outcome_from_rendered_trace():
  tok = tokenizer()
  ids = encode(tok, render_thinking(_paragraphs(), "57"))
  cuts = sampler_cuts(tok, ids)
  assert len(cuts) == 7
  # saturated first at boundary 3 (acc = conf = 1: Phi = 1), the oracle step
  acc = [0.0, 0.2, 0.5, 1.0, 1.0, 1.0, 1.0]
  conf = [0.0, 0.9, 0.5, 1.0, 1.0, 0.5, 1.0]
  o = outcome_from(ARITH, ids, tok, potentials_for(cuts, acc, conf))
  assert o.problem_id == "arith" and o.n_tokens == len(ids) and o.correct
  assert o.think_end == ids.index(tok.convert_tokens_to_ids("</think>"))
  assert o.kinds == ("step",) * 4 + ("other", "reflect", "reflect")
  assert o.oracle == 3 and o.first_saturated == 3 and o.displacement == 0
  np.testing.assert_array_equal(o.cuts, cuts)
  np.testing.assert_allclose(o.phi, [0.0, 1.5 * 0.18 + 0.1 - 0.9, 0.375 + 0.25 - 0.5, 1.0, 1.0, 0.75 + 0.5 - 0.5, 1])
  assert o.solving_tokens == cuts[3] + 1 and o.checking_tokens == o.think_end - cuts[3] - 1
  # the same thinking with a wrong final answer and no '</think>': never closed, wrong, counts to the end
  ids = encode(tok, render_thinking(_paragraphs(), "58"))
  o = outcome_from(ARITH, ids, tok, potentials_for(sampler_cuts(tok, ids), acc, conf))
  assert not o.correct and o.oracle == 3
  open_ids = encode(tok, "<think>\n" + "".join(p + "\n\n" for p in _paragraphs()[:3]) + "Step 4: 47 + 10")
  cuts = sampler_cuts(tok, open_ids)
  o = outcome_from(ARITH, open_ids, tok, potentials_for(cuts, [1, 1, 1], [1, 1, 1]))
  assert o.think_end is None and len(o.kinds) == 3 and o.oracle is None and not o.correct
  assert o.checking_tokens == len(open_ids) - cuts[0] - 1


def test_outcome_from_scripted_traces():
  """kinds and oracle of the tasks' own scripted thinking traces (recheck and flip noise included)."""
  tok = tokenizer()
  problems = make_problems("arithmetic", 6, 0, 2)
  for i, p in enumerate(problems):
    trace = solve(p, "arithmetic", np.random.default_rng(i), "thinking", TraceNoise())
    ids = encode(tok, trace.text)
    cuts = sampler_cuts(tok, ids)
    c = len(cuts)
    o = outcome_from(p, ids, tok, potentials_for(cuts, np.ones(c), np.zeros(c)))
    assert list(o.kinds) == trace.kinds and o.correct == trace.correct, p.id
    assert o.oracle == trace.answer_paragraph, p.id


def test_outcome_from_misalignment_errors():
  tok = tokenizer()
  ids = encode(tok, render_thinking(_paragraphs(), "57"))
  cuts = sampler_cuts(tok, ids)
  with pytest.raises(DataFormatError, match=r"'arith'.*6 boundaries.*7 paragraph boundaries"):
    outcome_from(ARITH, ids, tok, potentials_for(cuts[:-1], np.ones(6), np.ones(6)))
  with pytest.raises(DataFormatError, match=r"'arith'.*7 boundaries at tokens"):
    outcome_from(ARITH, ids, tok, potentials_for(cuts + 1, np.ones(7), np.ones(7)))


def test_degenerate_thinking_pairs_the_sampler_paragraphs_with_the_parser():
  """Model output the scripted traces never hold: a paragraph that is only '.', and a second '<think>' inside the
  thinking (a built-in v3 target wrote 'Step 1: 5 * 5 = 25\\n\\n\\n\\n\\n<think>\\n<think>\\nStep 2: ...'). The
  thinking parser reads the step module's paragraphs, so each potential pairs with the paragraph the sampler closed
  there: the '<think>' drops the unfinished step before it, as the stop automaton does."""
  tok = tokenizer()
  odd = encode(tok, "<think>\nStep 1: 12 + 5 = 17.\n\n.\n\nStep 2: 17 * 3 = 51.\n\n</think>\n\n")
  cuts = sampler_cuts(tok, odd)
  assert len(cuts) == 3
  o = outcome_from(ARITH, odd, tok, potentials_for(cuts, np.ones(3), np.ones(3)))
  assert o.kinds == ("step", "other", "step")
  text = "<think>\nStep 1: 12 + 5 = 17\n\n\n\n\n<think>\n<think>\nStep 2: 17 * 3 = 51.\n\nSo the answer is 51.\n\n"
  twice = encode(tok, text + "</think>\n\n**Final Answer**\n\\boxed{51}")
  cuts = sampler_cuts(tok, twice)
  assert len(cuts) == 2  # 'Step 1: 12 + 5 = 17' was never closed: the second '<think>' dropped it
  o = outcome_from(ARITH, twice, tok, potentials_for(cuts, [0.5, 1.0], [0.5, 1.0]))
  assert o.kinds == ("step", "other") and o.first_saturated == 1
  assert parse_thinking(text)[0] == ["Step 2: 17 * 3 = 51.", "So the answer is 51."]
