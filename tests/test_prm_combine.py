"""Fusion and cascade of probe and PRM step scores (reprobe_jax/prm/combine.py, docs/method.md §A7)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.io.atomic import atomic_open
from reprobe_jax.eval.metrics import pr_auc
from reprobe_jax.prm.combine import CascadeCurve, Fusion, cascade_curve, cascade_scores, fit_fusion, plot_cascade
from reprobe_jax.io.readers import read_json


def _sigmoid(x):
  return 1 / (1 + np.exp(-x))


def _complementary(n, seed):
  """Steps whose error depends on two independent causes: the probe sees one, the PRM the other."""
  rng = np.random.default_rng(seed)
  a, b = rng.normal(size=(2, n))
  y = (rng.random(n) < _sigmoid(2 * a + 2 * b - 1)).astype(float)
  probe = _sigmoid(2 * a + 0.5 * rng.normal(size=n))
  prm = _sigmoid(2 * b + 0.5 * rng.normal(size=n))
  return probe, prm, y


def test_fusion_matches_sklearn_on_standardised_logits():
  from sklearn.linear_model import LogisticRegression

  probe, prm, y = _complementary(300, seed=0)
  prm[:3] = [0.0, 1.0, 1.0]  # saturated PRM rewards are clipped, not infinite
  y[::9] = np.nan  # unknown labels are left out of the fit and of the standardisation
  fusion = fit_fusion(probe, prm, y, l2=2.0)
  x = np.log(np.c_[probe, prm].clip(1e-6, 1 - 1e-6)) - np.log1p(-np.c_[probe, prm].clip(1e-6, 1 - 1e-6))
  known = ~np.isnan(y)
  z = (x - x[known].mean(0)) / (x[known].std(0) + 1e-6)
  ref = LogisticRegression(C=1 / 2.0, tol=1e-10, max_iter=1000).fit(z[known], y[known])
  np.testing.assert_allclose(fusion(probe, prm), ref.predict_proba(z)[:, 1], atol=1e-6)
  np.testing.assert_allclose(fusion.model.weights, ref.coef_[0], atol=1e-5)


def test_fusion_beats_probe_and_prm_alone_when_they_see_different_errors():
  val, test = _complementary(2000, seed=1), _complementary(2000, seed=2)
  fusion = fit_fusion(*val)
  probe, prm, y = test
  fused = pr_auc(y, fusion(probe, prm))
  assert fused > max(pr_auc(y, probe), pr_auc(y, prm)) + 0.1
  assert all(w > 0 for w in fusion.model.weights)  # both scores point the same way


def test_fusion_round_trips_through_json(tmp_path):
  probe, prm, y = _complementary(200, seed=3)
  for labels in (y, np.ones_like(y)):  # one class: zero weights and an infinite bias, stored as Infinity
    fusion = fit_fusion(probe, prm, labels)
    path = tmp_path / "fusion.json"
    path.write_text(json.dumps(fusion.to_json()))
    back = Fusion.from_json(read_json(path, "fusion"), str(path))
    assert back == fusion
    np.testing.assert_array_equal(back(probe, prm), fusion(probe, prm))
  assert np.all(fusion(probe, prm) == 1.0)
  bad = dict(fusion.to_json(), scale=[1.0, 0.0])
  with pytest.raises(DataFormatError, match="fusion.json: field 'scale'"):
    Fusion.from_json(bad, str(path))
  with pytest.raises(DataFormatError, match="field 'weights'"):
    Fusion.from_json(dict(fusion.to_json(), weights=[1.0]))


# Six steps with exactly representable distances to 0.5: [0.375, 0.25, 0, 0.25, 0.4375, 0.125], so the least
# certain order is 2, 5, 1, 3 (1 and 3 tie: lower index first), 0, 4.
PROBE6 = np.array([0.875, 0.25, 0.5, 0.75, 0.0625, 0.375])
PRM6 = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])


@pytest.mark.parametrize(
  "fraction, asked",
  [(1 / 6, [2]), (0.25, [2, 5]), (0.4, [2, 5]), (0.5, [2, 5, 1]), (7 / 12, [2, 5, 1, 3]), (5 / 6, [2, 5, 1, 3, 0])],
)
def test_cascade_asks_the_prm_about_the_least_certain_steps(fraction, asked):
  scores, mask = cascade_scores(PROBE6, PRM6, fraction)  # k = round(6 f), halves up: 1.5 -> 2, 3.5 -> 4
  assert sorted(np.flatnonzero(mask)) == sorted(asked)
  expected = PROBE6.copy()
  expected[asked] = PRM6[asked]
  np.testing.assert_array_equal(scores, expected)


def test_cascade_threshold_and_combine():
  _, mask = cascade_scores(PROBE6, PRM6, 2 / 6, threshold=0.8)  # distances 0.075, 0.55, 0.3, 0.05, 0.7375, 0.425
  assert list(np.flatnonzero(mask)) == [0, 3]
  scores, mask = cascade_scores(PROBE6, PRM6, 0.5, combine=lambda p, r: (p + r) / 2)
  np.testing.assert_array_equal(scores[mask], (PROBE6[[1, 2, 5]] + PRM6[[1, 2, 5]]) / 2)
  np.testing.assert_array_equal(scores[~mask], PROBE6[[0, 3, 4]])
  with pytest.raises(ConfigError, match="combine must return one score per asked step"):
    cascade_scores(PROBE6, PRM6, 0.5, combine=lambda p, r: p[:1])


def test_cascade_endpoints_are_exactly_the_probe_and_the_prm_or_the_fusion():
  probe, prm, y = _complementary(101, seed=4)
  fusion = fit_fusion(probe, prm, y)
  scores, asked = cascade_scores(probe, prm, 0)
  np.testing.assert_array_equal(scores, probe)
  assert not asked.any()
  scores, asked = cascade_scores(probe, prm, 1.0)
  np.testing.assert_array_equal(scores, prm)
  assert asked.all()
  scores, asked = cascade_scores(probe, prm, 1.0, combine=fusion)
  np.testing.assert_array_equal(scores, fusion(probe, prm))
  scores, asked = cascade_scores(probe, prm, 0.0, combine=fusion)
  np.testing.assert_array_equal(scores, probe)


def test_cascade_curve_calls_grow_with_the_fraction_and_its_ends_are_the_scorers():
  probe, prm, y = _complementary(37, seed=5)
  y[::5] = np.nan
  fractions = np.linspace(0, 1, 21)
  curve = cascade_curve(probe, prm, y, fractions)
  assert curve.prm_calls[0] == 0.0 and curve.prm_calls[-1] == 1.0
  assert np.all(np.diff(curve.prm_calls) >= 0)
  np.testing.assert_allclose(curve.prm_calls, np.floor(fractions * 37 + 0.5) / 37)
  asked = [cascade_scores(probe, prm, f)[1] for f in fractions]
  assert all(np.all(a <= b) for a, b in zip(asked, asked[1:]))  # each fraction asks about a superset
  assert curve.pr_auc[0] == pr_auc(y, probe) and curve.pr_auc[-1] == pr_auc(y, prm)
  known = ~np.isnan(y)
  assert curve.accuracy[0] == np.mean((probe[known] > 0.5) == y[known])
  assert curve.accuracy[-1] == np.mean((prm[known] > 0.5) == y[known])
  record = json.loads(json.dumps(curve.to_json()))
  assert CascadeCurve(**{k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}) == curve


@pytest.mark.parametrize("fraction", [-0.1, 1.5, float("nan"), float("inf"), "0.5", None, True])
def test_a_fraction_outside_0_1_is_one_clear_error(fraction):
  with pytest.raises(ConfigError, match=r"cascade fraction must be a number in \[0, 1\], found"):
    cascade_scores(PROBE6, PRM6, fraction)
  with pytest.raises(ConfigError, match="cascade fraction"):
    cascade_curve(PROBE6, PRM6, np.zeros(6), (0.0, fraction))


def test_mismatched_or_bad_step_arrays_are_config_errors():
  with pytest.raises(ConfigError, match="differ in length: probe 5, prm 6"):
    cascade_scores(PROBE6[:5], PRM6, 0.5)
  with pytest.raises(ConfigError, match=r"labels \(5\) and step scores \(6\) differ in length"):
    cascade_curve(PROBE6, PRM6, np.zeros(5))
  with pytest.raises(ConfigError, match=r"labels \(5\) and step scores \(6\) differ in length"):
    fit_fusion(PROBE6, PRM6, np.zeros(5))
  with pytest.raises(ConfigError, match=r"prm_scores must hold scores in \[0, 1\], found nan at step 5"):
    fit_fusion(PROBE6, np.r_[PRM6[:5], np.nan], np.zeros(6))
  with pytest.raises(ConfigError, match="cascade threshold"):
    cascade_scores(PROBE6, PRM6, 0.5, threshold=2)


def test_plot_cascade_writes_a_png_and_nothing_else(tmp_path):
  probe, prm, y = _complementary(60, seed=6)
  curves = {"arithmetic": cascade_curve(probe, prm, y), "planning": cascade_curve(prm, probe, y)}
  path = tmp_path / "plots" / "cascade.png"
  plot_cascade(curves, str(path))
  assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  import matplotlib.image

  assert matplotlib.image.imread(path).shape[:2] == (440, 1100)  # 10 x 4 inches at 110 dpi
  assert os.listdir(path.parent) == ["cascade.png"]  # no temporary file left beside it


def test_report_fits_fusion_on_val_and_starts_the_cascade_from_the_probe_best_on_val(tmp_path):
  """prm.report.combine on a stored step-scores file: each fusion is the one fitted on the val split alone, applied
  to test; the cascade starts from the probe with the best val PR-AUC even when another is better on test."""
  from reprobe_jax.prm.report import combine, read_step_scores

  rng = np.random.default_rng(0)

  def split(n, good):  # 'good' is informative, 'weak' barely; the PRM sees the labels through noise
    y = (rng.random(n) < 0.4).astype(float)
    y[:3] = np.nan
    noisy = lambda s: np.clip(0.5 + s * (np.nan_to_num(y) - 0.5) + rng.normal(0, 0.25, n), 0, 1)
    return y, {
      "probe[good]": noisy(0.6 if good else 0.05),
      "probe[weak]": noisy(0.05 if good else 0.6),
      "prm": noisy(0.3),
    }

  yv, sv = split(300, good=True)
  yt, st = split(400, good=False)  # on test the other probe is the informative one
  dom_t = np.asarray(["a"] * 200 + ["b"] * 200)
  arrays = {"val/labels": yv, "val/domain": np.asarray(["a"] * 300), "test/labels": yt, "test/domain": dom_t}
  arrays.update({f"val/score/{k}": v for k, v in sv.items()})
  arrays.update({f"test/score/{k}": v for k, v in st.items()})
  with atomic_open(tmp_path / "s.npz", "wb", seal=True) as f:  # sealed, as the ReProbe job writes it
    np.savez(f, **arrays)
  c = combine(read_step_scores(str(tmp_path / "s.npz")), ["a", "b"])
  assert c.cascade_probe == "probe[good]"
  want = fit_fusion(sv["probe[weak]"], sv["prm"], yv)(st["probe[weak]"], st["prm"])
  np.testing.assert_allclose(np.concatenate([c.fusion_scores["fusion[weak]"][d] for d in "ab"]), want)
  for d in "ab":
    m = dom_t == d
    curve = c.cascades[d]["prm"]
    assert curve.pr_auc[0] == pytest.approx(pr_auc(yt[m], st["probe[good]"][m]))
    assert curve.pr_auc[-1] == pytest.approx(pr_auc(yt[m], st["prm"][m]))
