"""The Colab notebooks (colab/) run top to bottom on their tiny configuration (configs/colab.py, smoke=True) in a
real Jupyter kernel, any cell error failing the test; stored notebooks carry no outputs; the install cell names
what is missing; the README links every notebook."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLAB = os.path.join(ROOT, "colab")
# In this order: the test-time-scaling notebook reuses the quickstart's target and probe from the shared WORKDIR,
# as it does on Colab.
NOTEBOOKS = ("quickstart", "test_time_scaling", "spae")


def _read(name: str):
  return nbformat.read(os.path.join(COLAB, f"{name}.ipynb"), as_version=4)


def _outputs(nb) -> list[dict]:
  return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def _shown(nb, mime: str) -> list[str]:
  return [
    o["data"][mime]
    for o in _outputs(nb)
    if o.get("output_type") in ("display_data", "execute_result") and mime in o.get("data", {})
  ]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("colab"))


@pytest.fixture(scope="module")
def executed(workdir):
  """Runs each notebook once (in NOTEBOOKS' order, on first use) in a fresh kernel with the smoke switch on."""
  done = {}

  def run(name: str):
    if name not in done:
      for before in NOTEBOOKS[: NOTEBOOKS.index(name)]:
        run(before)
      nb = _read(name)
      env = {**os.environ, "REPROBE_NOTEBOOK_SMOKE": "1", "REPROBE_WORKDIR": workdir, "TQDM_DISABLE": "1"}
      old = dict(os.environ)
      os.environ.update(env)  # the kernel inherits this process's environment
      try:
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": COLAB}}).execute()
      finally:
        os.environ.clear()
        os.environ.update(old)
      done[name] = nb
    return done[name]

  return run


def test_every_notebook_is_tested():
  assert sorted(os.path.basename(p)[:-6] for p in glob.glob(os.path.join(COLAB, "*.ipynb"))) == sorted(NOTEBOOKS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_stored_notebooks_carry_no_outputs(name):
  nb = _read(name)
  nbformat.validate(nb)
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert cell.outputs == [] and cell.execution_count is None, f"{name}: a code cell holds outputs"
  assert "colab.research.google.com/github/" in nb.cells[0].source  # the badge opens the notebook itself
  assert f"/colab/{name}.ipynb" in nb.cells[0].source


@pytest.mark.slow  # a fresh kernel runs the notebook (about 100 s on 2 cores); .ci/run runs it
def test_quickstart_runs(executed, workdir):
  nb = executed("quickstart")
  text = "".join(o.get("text", "") for o in _outputs(nb))
  assert "captured per token" in text and "attn_window" in text  # features recorded while sampling
  steps = [h for h in _shown(nb, "text/html") if "P(wrong)" in h or "no score" in h]
  assert len(steps) == 4  # one coloured trajectory per sample
  table = _shown(nb, "text/markdown")[-1]
  assert "probe[attn+logit]" in table and "maxprob" in table
  assert _shown(nb, "image/png")  # the PR curves
  assert glob.glob(os.path.join(workdir, "reprobe_synthetic", "*", "probe_bundle", "attn+logit", "config.json"))


@pytest.mark.slow  # a fresh kernel runs the notebook (about 65 s on 2 cores); .ci/run runs it
def test_test_time_scaling_runs(executed):
  nb = executed("test_time_scaling")
  text = "".join(o.get("text", "") for o in _outputs(nb))
  assert "Best-of-N (N = 8)" in text and "beam search (B = 2, N = 4)" in text
  table = _shown(nb, "text/markdown")[-1]
  assert "Beam search, probe[attn+logit]" in table and "Best-of-N, perplexity" in table
  assert _shown(nb, "image/png")  # accuracy against the budget


@pytest.mark.slow  # a fresh kernel runs the notebook (about 80 s on 2 cores); .ci/run runs it
def test_spae_runs(executed):
  nb = executed("spae")
  table = _shown(nb, "text/markdown")[-1]
  assert "arithmetic truncated" in table and "planning plain" in table
  assert len(_shown(nb, "image/png")) >= 3  # the potential curves of one problem, then each group's mean curves


def _install_source() -> str:
  cells = [c.source for c in _read("quickstart").cells if c.cell_type == "code"]
  assert "REPROBE_REPO_URL" in cells[0]
  for name in NOTEBOOKS[1:]:  # one install cell, the same in every notebook
    assert [c.source for c in _read(name).cells if c.cell_type == "code"][0] == cells[0]
  return cells[0]


def _run_install(prelude: str, cwd: str, **env) -> subprocess.CompletedProcess:
  code = prelude + "\n" + _install_source()
  return subprocess.run(
    [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300, env={**os.environ, **env}
  )


def test_install_cell_names_a_missing_package():
  r = _run_install("import sys; sys.modules['optax'] = None; sys.modules['grain'] = None", COLAB)
  assert r.returncode != 0
  assert "ImportError: this notebook needs: optax (" in r.stderr and "pip install optax" in r.stderr
  assert "grain (" in r.stderr and "pip install grain" in r.stderr


def test_install_cell_rejects_a_source_that_is_not_a_checkout(tmp_path):
  r = _run_install("", str(tmp_path), REPROBE_SRC=str(tmp_path))
  assert r.returncode != 0 and f"REPROBE_SRC={str(tmp_path)!r} is not a reprobe-jax checkout" in r.stderr


def test_install_cell_in_a_checkout_succeeds():
  r = _run_install("", COLAB)
  assert r.returncode == 0, r.stderr
  assert f"reprobe-jax from {ROOT}" in r.stdout


def test_readme_links_every_notebook():
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = f.read()
  for name in NOTEBOOKS:
    assert f"colab.research.google.com/github/reprobe-jax/reprobe-jax/blob/main/colab/{name}.ipynb" in readme


def test_steps_html_worked_example():
  from reprobe_jax.errors import ConfigError
  from reprobe_jax.eval.notebook import risk_colour, steps_html, steps_text

  # hue = round(120 * (1 - risk)): 0 -> 120 (green), 0.25 -> 90, 0.5 -> 60 (yellow), 1 -> 0 (red); out of range
  # clipped; NaN grey
  assert [risk_colour(r) for r in (0.0, 0.25, 0.5, 1.0, 1.7)] == [
    "hsl(120, 75%, 80%)",
    "hsl(90, 75%, 80%)",
    "hsl(60, 75%, 80%)",
    "hsl(0, 75%, 80%)",
    "hsl(0, 75%, 80%)",
  ]
  assert risk_colour(float("nan")) == "hsl(0, 0%, 85%)"
  html = steps_html(["3 + 4 = 7", "<Answer>8</Answer>"], [0.25, float("nan")], [0.0, 1.0], title="a & b")
  assert html.count('<div style="background:') == 2
  assert "background:hsl(90, 75%, 80%)" in html and "P(wrong) 0.25, right" in html
  assert "&lt;Answer&gt;8&lt;/Answer&gt;" in html and "no score, wrong" in html and "<b>a &amp; b</b>" in html
  assert steps_text(["3 + 4 = 7", "x"], [0.25, float("nan")], [0.0, None]).splitlines() == [
    "0.25      right  3 + 4 = 7",
    "  -   unlabelled  x",
  ]
  # SPAE's potential on [-1, 1], higher better: Phi 0.8 -> risk 1 - (0.8 + 1) / 2 = 0.1 -> hue round(108) = 108
  phi = steps_html(["<think>"], [0.8], score_name="Phi", low=-1.0, high=1.0, higher_is_worse=False)
  assert "background:hsl(108, 75%, 80%)" in phi and "Phi 0.80" in phi
  with pytest.raises(ConfigError, match="high=0.0 must be above low=1.0"):
    steps_html(["a"], [0.1], low=1.0, high=0.0)
  with pytest.raises(ConfigError, match="2 steps but 1 scores"):
    steps_html(["a", "b"], [0.1])
  with pytest.raises(ConfigError, match="2 steps but 3 labels"):
    steps_html(["a", "b"], [0.1, 0.2], [0, 1, 1])
