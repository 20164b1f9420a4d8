"""The decode-state example of docs/decoding.md (and the README) runs as written, and does what it says."""

from __future__ import annotations

import os
import re

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _example(path: str) -> str:
  with open(os.path.join(ROOT, path)) as f:
    text = f.read()
  blocks = re.findall(r"```python\n(.*?)```", text, re.S)
  assert blocks, f"{path} has no python example"
  return blocks[-1]


def test_readme_shows_the_same_example():
  with open(os.path.join(ROOT, "README.md")) as f:
    assert _example("docs/decoding.md") in f.read()


def test_decode_state_example_runs(tiny_llama_dir, capsys):
  code = _example("docs/decoding.md")
  scope = {"MODEL": tiny_llama_dir, "PROMPT": "w1 w2 w3 w4"}
  exec(compile(code, "docs/decoding.md", "exec"), scope)
  out = capsys.readouterr().out
  assert out.strip(), "the example printed nothing"
  state, sampler = scope["state"], scope["sampler"]
  rows = sampler.read(state)
  # After each round the 4 rows continue one kept candidate: they agree on everything before the newest step.
  starts = [r.step_start for r in rows]
  assert len(set(starts)) == 1
  assert len({tuple(r.tokens[: starts[0]]) for r in rows}) == 1
  assert np.all(np.asarray(state.lengths) >= 1)
