"""What the Colab notebooks (colab/) show that a terminal does not: a trajectory with each step coloured by its score.

html = steps_html(["Start at 3.", "3 + 4 = 8", "<Answer>8</Answer>"], [0.1, 0.9, 0.8], labels=[0, 1, 1])
show(html)  # IPython's display inside a notebook; the plain text (one line per step) elsewhere
"""

from __future__ import annotations

import html as html_lib
import math
from typing import Sequence

from reprobe_jax.errors import ConfigError

_LABELS = {0.0: "right", 1.0: "wrong"}


def risk_colour(risk: float) -> str:
  """A CSS colour for P(step incorrect): green at 0, yellow at 0.5, red at 1; grey for NaN (a step with no score).
  The hue runs linearly from 120 (green) to 0 (red)."""
  if risk is None or not math.isfinite(risk):
    return "hsl(0, 0%, 85%)"
  r = min(max(float(risk), 0.0), 1.0)
  return f"hsl({round(120 * (1.0 - r))}, 75%, 80%)"


def _label(v) -> str:
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return "unlabelled"
  return _LABELS.get(float(v), str(v))


def _as_risk(score: float, low: float, high: float, higher_is_worse: bool) -> float:
  """A score on [low, high] as a risk on [0, 1] (1 = worst) for `risk_colour`; NaN stays NaN."""
  if score is None or not math.isfinite(score):
    return float("nan")
  r = (float(score) - low) / (high - low)
  return r if higher_is_worse else 1.0 - r


def steps_html(
  texts: Sequence[str],
  scores: Sequence[float],
  labels: Sequence[float | None] | None = None,
  *,
  title: str = "",
  score_name: str = "P(wrong)",
  low: float = 0.0,
  high: float = 1.0,
  higher_is_worse: bool = True,
) -> str:
  """One trajectory as HTML: each step on its own line, its background coloured by its score (by default a step
  scorer's P(incorrect) on [0, 1]; e.g. SPAE's potential with score_name='Phi', low=-1, high=1,
  higher_is_worse=False), with the score and, where given, the step's label (0 right, 1 wrong, None/NaN
  unlabelled) written beside it. Text is escaped."""
  texts, scores = list(texts), list(scores)
  if len(texts) != len(scores):
    raise ConfigError(f"steps_html: {len(texts)} steps but {len(scores)} scores")
  if labels is not None and len(labels) != len(texts):
    raise ConfigError(f"steps_html: {len(texts)} steps but {len(labels)} labels")
  if not high > low:
    raise ConfigError(f"steps_html: high={high} must be above low={low}")
  rows = []
  for i, (text, r) in enumerate(zip(texts, scores)):
    score = "no score" if r is None or not math.isfinite(r) else f"{score_name} {r:.2f}"
    tag = f"{score}, {_label(labels[i])}" if labels is not None else score
    colour = risk_colour(_as_risk(r, low, high, higher_is_worse))
    rows.append(
      f'<div style="background:{colour};padding:2px 6px;margin:1px 0;font-family:monospace;'
      f'white-space:pre-wrap"><span style="float:right;color:#444">{html_lib.escape(tag)}</span>'
      f"{html_lib.escape(text.strip())}</div>"
    )
  head = f"<div><b>{html_lib.escape(title)}</b></div>" if title else ""
  return f'<div style="max-width:900px">{head}{"".join(rows)}</div>'


def steps_text(texts: Sequence[str], scores: Sequence[float], labels: Sequence[float | None] | None = None) -> str:
  """The same as plain text: one line per step, score (and label) first."""
  lines = []
  for i, (text, r) in enumerate(zip(texts, scores)):
    score = "  -  " if r is None or not math.isfinite(r) else f"{r:.2f}"
    tag = f"{score} {_label(labels[i]):>10}" if labels is not None else score
    lines.append(f"{tag}  {text.strip()}")
  return "\n".join(lines)


def show(html: str, text: str | None = None) -> None:
  """Displays HTML in a notebook (IPython), else prints `text` (or nothing if there is none)."""
  try:
    from IPython import get_ipython  # only inside a notebook; IPython is no dependency
    from IPython.display import HTML, display
  except ImportError:  # not in IPython
    get_ipython = None
  if get_ipython is not None and get_ipython() is not None:
    display(HTML(html))
  elif text is not None:
    print(text)
