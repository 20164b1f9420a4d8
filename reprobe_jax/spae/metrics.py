"""SPAE's trajectory metrics for thinking-mode evaluation (docs/method.md §B3), on the host, from typed per-trajectory
inputs.

A `ThinkingOutcome` is one evaluated thinking trajectory: its length, where `</think>` is, whether the final answer
is right, the step potentials at its paragraph boundaries (`potential.StepPotentials`), the kind of the paragraph
each boundary closes, and the oracle step (the paragraph after which the task's exact replay first has the answer,
`formats.thinking_progress`). Boundary c closes paragraph c of the thinking, so boundary and paragraph indices are
the same; a trailing paragraph that no boundary closes has no potential. Correctness is any task's outcome label
(`formats.check_response`); kinds and the oracle replay a synthetic family's steps, so for another task (math) a
paragraph's kind is 'reflect' when it is phrased as a re-check (`formats.is_recheck`) and 'other' otherwise, and
there is no oracle (oracle agreement n/a).

`summarise` gives the paper's numbers over k samples per problem: Acc@k, Len@k, solving tokens (up to and including
the first saturated boundary), checking tokens (from there to `</think>`, correct answers), R2W (wrong final answer
although some boundary was saturated), reflect steps, and saturation against the oracle with the displacement
histogram of the paper's Appendix C.1 (synchronised / early / late / never). `potential_curves` bins the mean
Phi, Conf and Acc against relative step position for correct and wrong trajectories. A skipped boundary (NaN
potential) is never saturated and is left out of every mean.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from reprobe_jax.io.atomic import atomic_open
from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.spae.potential import StepPotentials
from reprobe_jax.steps import THINK_CLOSE, align, token_end_offsets, token_ids
from reprobe_jax.tasks.base import FAMILIES, Problem
from reprobe_jax.tasks.formats import check_response, classify_paragraph, is_recheck, thinking_progress
from reprobe_jax.tasks.response import parse_thinking

KINDS = ("step", "reflect", "other")
DISPLACEMENTS = ("synchronised", "early", "late", "never")


def _optional_int(value, what: str, high: int | None = None) -> int | None:
  if value is None:
    return None
  if (
    isinstance(value, (bool, np.bool_))
    or not isinstance(value, (int, np.integer))
    or value < 0
    or (high is not None and value > high)
  ):
    raise DataFormatError(
      f"{what}: expected None or an integer in [0, {'inf' if high is None else high}], got {value!r}"
    )
  return int(value)


@dataclasses.dataclass(frozen=True)
class ThinkingOutcome:
  """One evaluated thinking trajectory with its step potentials (docs/method.md §B1, §B3).

  n_tokens: response length in tokens (without EOS); think_end: index of the response token that holds the first
  character of '</think>' (None if the thinking is never closed); correct: the final answer is right; cuts [C]:
  response-token index of each boundary's last token; acc, conf, phi [C] (NaN = skipped boundary); kinds [C]: the
  kind ('step' | 'reflect' | 'other') of the paragraph boundary c closes; oracle: the paragraph index where the
  answer is first established (None if never, or when the task is no synthetic family)."""

  problem_id: str
  n_tokens: int
  think_end: int | None
  correct: bool
  cuts: np.ndarray  # [C] int
  acc: np.ndarray  # [C] float
  conf: np.ndarray  # [C] float
  phi: np.ndarray  # [C] float
  kinds: tuple[str, ...]  # [C]
  oracle: int | None
  eps_sat: float = 0.9

  def __post_init__(self):
    name = f"trajectory of {self.problem_id!r}"
    n = self.n_tokens
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0:
      raise DataFormatError(f"{name}: n_tokens must be an integer >= 0, got {n!r}")
    object.__setattr__(self, "n_tokens", int(n))
    object.__setattr__(self, "think_end", _optional_int(self.think_end, f"{name}: think_end", int(n) - 1))
    object.__setattr__(self, "oracle", _optional_int(self.oracle, f"{name}: oracle"))
    object.__setattr__(self, "correct", bool(self.correct))
    cuts = np.asarray(self.cuts)
    if cuts.ndim != 1 or (cuts.size and not np.issubdtype(cuts.dtype, np.integer)):
      raise DataFormatError(
        f"{name}: cuts must be a 1-D array of token indices, got shape {cuts.shape} dtype {cuts.dtype}"
      )
    cuts = cuts.astype(np.int64)
    c = cuts.shape[0]
    arrays = {}
    for field in ("acc", "conf", "phi"):
      a = np.asarray(getattr(self, field), np.float64)
      if a.shape != (c,):
        raise DataFormatError(f"{name}: {field} has shape {a.shape}, expected one value per boundary ({c},)")
      arrays[field] = a
    kinds = tuple(self.kinds)
    if len(kinds) != c or any(k not in KINDS for k in kinds):
      raise DataFormatError(f"{name}: kinds must name one of {KINDS} per boundary ({c}), got {kinds!r}")
    end = self.think_end + 1 if self.think_end is not None else n  # a cut may share the '</think>' token
    if c and (np.any(np.diff(cuts) <= 0) or cuts[0] < 0 or cuts[-1] >= end):
      raise DataFormatError(
        f"{name}: cuts must increase strictly within [0, {end}) (up to '</think>'), got {cuts.tolist()}"
      )
    object.__setattr__(self, "cuts", cuts)
    object.__setattr__(self, "kinds", kinds)
    for field, a in arrays.items():
      object.__setattr__(self, field, a)

  @property
  def potentials(self) -> StepPotentials:
    """The trajectory's potentials as `potential.StepPotentials` (cuts, acc, conf, phi [C])."""
    return StepPotentials(self.cuts, self.acc, self.conf, self.phi, self.eps_sat)

  @property
  def first_saturated(self) -> int | None:
    """Index of the first saturated boundary (Phi > eps_sat; NaN never), or None."""
    return self.potentials.first_saturated

  @property
  def solving_tokens(self) -> int | None:
    """Tokens up to and including the first saturated boundary's last token, or None."""
    first = self.first_saturated
    return None if first is None else int(self.cuts[first]) + 1

  @property
  def checking_tokens(self) -> int | None:
    """Tokens after the first saturated boundary and before '</think>' (the response's end if never closed), or
    None; 0 when the boundary's last token also holds the start of '</think>'."""
    solving = self.solving_tokens
    if solving is None:
      return None
    return max(0, (self.think_end if self.think_end is not None else self.n_tokens) - solving)

  @property
  def displacement(self) -> int | None:
    """first_saturated - oracle (None when either is missing)."""
    first = self.first_saturated
    return None if first is None or self.oracle is None else first - self.oracle


def outcome_from(
  problem: Problem, response_ids: Sequence[int], tokenizer, potentials: StepPotentials
) -> ThinkingOutcome:
  """One trajectory's ThinkingOutcome (docs/method.md §B3): the response (token ids, without EOS) decoded, its
  paragraphs classified and replayed for the oracle, its answer checked, and its potentials paired with the paragraphs.

  DataFormatError naming the trajectory when the potentials' boundaries are not the response's paragraph
  boundaries (another count, other tokens) or the boundary-closed paragraphs are not those `parse_thinking` reads
  (both read the step module's paragraphs, so this is a broken invariant, not bad model output): pairing them by
  index would misalign."""
  name = f"trajectory of {problem.id!r}"
  ids = token_ids(response_ids)
  text, ends = token_end_offsets(tokenizer, ids)
  closed = align(tokenizer, ids, "paragraph")  # the sampler's own boundaries (the prober's `boundaries`)
  cuts = np.asarray(potentials.cuts, np.int64)
  expected = [s.end - 1 for s in closed]
  if cuts.tolist() != expected:
    raise DataFormatError(
      f"{name}: the potentials have {len(cuts)} boundaries at tokens {cuts.tolist()}, but the "
      f"response has {len(expected)} paragraph boundaries at tokens {expected}"
    )
  paragraphs, _ = parse_thinking(text)
  texts = [s.text.strip() for s in closed]
  if paragraphs[: len(texts)] != texts or len(paragraphs) > len(texts) + 1:
    raise DataFormatError(
      f"{name}: its {len(texts)} boundary-closed paragraphs {texts!r} are not the first of the "
      f"{len(paragraphs)} paragraphs the thinking parser reads {paragraphs!r}"
    )
  family = problem.domain in FAMILIES  # only a family's paragraphs parse as steps and replay (module docstring)
  kind = (lambda p: classify_paragraph(problem, p)) if family else (lambda p: "reflect" if is_recheck(p) else "other")
  at = text.find(THINK_CLOSE)
  think_end = None if at < 0 else bisect.bisect_right(ends, at)  # the first token that ends past its '<'
  return ThinkingOutcome(
    problem_id=problem.id,
    n_tokens=len(ids),
    think_end=think_end,
    correct=check_response(problem, text, "thinking").correct,
    cuts=cuts,
    acc=potentials.acc,
    conf=potentials.conf,
    phi=potentials.phi,
    kinds=tuple(kind(p) for p in texts),
    oracle=thinking_progress(problem, paragraphs).established if family else None,
    eps_sat=potentials.eps_sat,
  )


# ------------------------------------------------------------------------------------------------ summary


def _mean(values) -> float:
  values = list(values)
  return float(np.mean(values)) if values else math.nan


def _json_number(x):
  return None if isinstance(x, float) and not math.isfinite(x) else x


@dataclasses.dataclass(frozen=True)
class TrajectoryMetrics:
  """docs/method.md §B3's numbers over `trajectories` = k samples x `problems` (NaN where the population is empty).

  acc_at_k, len_at_k: mean correctness and mean n_tokens. solving_tokens, checking_tokens, checking_share,
  reflect_after_saturation: over the `checked` correct trajectories with a saturated boundary. r2w, saturated_share:
  shares of all trajectories. reflect_steps: mean 'reflect' boundaries per trajectory. oracle_agreement: share of the
  `oracle_count` correct trajectories with an oracle step whose first saturated boundary is that step;
  displacement_counts over the same trajectories, displacements their first_saturated - oracle values."""

  k: int
  problems: int
  trajectories: int
  acc_at_k: float
  len_at_k: float
  solving_tokens: float
  checking_tokens: float
  checking_share: float
  checked: int
  r2w: float
  saturated_share: float
  reflect_steps: float
  reflect_after_saturation: float
  oracle_agreement: float
  oracle_count: int
  displacement_counts: Mapping[str, int]
  displacements: tuple[int, ...]

  def to_json(self) -> dict:
    """A JSON-ready dict (NaN written as null)."""
    out = {f.name: _json_number(getattr(self, f.name)) for f in dataclasses.fields(self)}
    out["displacement_counts"] = dict(self.displacement_counts)
    out["displacements"] = list(self.displacements)
    return out


def _check_k(outcomes: Sequence[ThinkingOutcome], k) -> int:
  if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
    raise ConfigError(f"summarise: k must be an integer >= 1, got {k!r}")
  if not outcomes:
    raise ConfigError("summarise: no trajectories to summarise")
  per = collections.Counter(o.problem_id for o in outcomes)
  bad = {p: n for p, n in per.items() if n != k}
  if bad:
    shown = ", ".join(f"{p!r}: {n}" for p, n in list(bad.items())[:5])
    raise ConfigError(
      f"summarise: Acc@{k} needs exactly {k} samples per problem; {len(bad)} of {len(per)} problems "
      f"have another number ({shown}{', ...' if len(bad) > 5 else ''})"
    )
  return len(per)


def summarise(outcomes: Sequence[ThinkingOutcome], k: int) -> TrajectoryMetrics:
  """Acc@k, Len@k, solving / checking tokens, R2W, reflect steps and saturation against the oracle (docs/method.md §B3)
  over k samples per problem (ConfigError unless every problem has exactly k)."""
  problems = _check_k(outcomes, k)
  checked = [o for o in outcomes if o.correct and o.first_saturated is not None]
  solving = [o.solving_tokens for o in checked]
  checking = [o.checking_tokens for o in checked]
  total = sum(solving) + sum(checking)
  with_oracle = [o for o in outcomes if o.correct and o.oracle is not None]
  counts = dict.fromkeys(DISPLACEMENTS, 0)
  displacements = []
  for o in with_oracle:
    d = o.displacement
    if d is None:
      counts["never"] += 1
    else:
      displacements.append(d)
      counts["synchronised" if d == 0 else "early" if d < 0 else "late"] += 1
  return TrajectoryMetrics(
    k=int(k),
    problems=problems,
    trajectories=len(outcomes),
    acc_at_k=_mean(o.correct for o in outcomes),
    len_at_k=_mean(o.n_tokens for o in outcomes),
    solving_tokens=_mean(solving),
    checking_tokens=_mean(checking),
    checking_share=sum(checking) / total if total else math.nan,
    checked=len(checked),
    r2w=_mean(not o.correct and o.first_saturated is not None for o in outcomes),
    saturated_share=_mean(o.first_saturated is not None for o in outcomes),
    reflect_steps=_mean(o.kinds.count("reflect") for o in outcomes),
    reflect_after_saturation=_mean(o.kinds[o.first_saturated + 1 :].count("reflect") for o in checked),
    oracle_agreement=counts["synchronised"] / len(with_oracle) if with_oracle else math.nan,
    oracle_count=len(with_oracle),
    displacement_counts=counts,
    displacements=tuple(displacements),
  )


# ------------------------------------------------------------------------------------------------ curves


@dataclasses.dataclass(frozen=True)
class Curve:
  """Per bin of relative step position: mean phi, conf, acc [bins] (NaN where empty) over `count` [bins]
  boundaries with a potential, from `trajectories` trajectories."""

  phi: np.ndarray
  conf: np.ndarray
  acc: np.ndarray
  count: np.ndarray
  trajectories: int

  def to_json(self) -> dict:
    """A JSON-ready dict (NaN written as null)."""
    return {
      "phi": [_json_number(float(x)) for x in self.phi],
      "conf": [_json_number(float(x)) for x in self.conf],
      "acc": [_json_number(float(x)) for x in self.acc],
      "count": self.count.tolist(),
      "trajectories": self.trajectories,
    }


@dataclasses.dataclass(frozen=True)
class PotentialCurves:
  """Mean Phi, Conf, Acc against relative step position, correct vs wrong trajectories; bin b is (edges[b],
  edges[b + 1]] of (0, 1]."""

  edges: np.ndarray  # [bins + 1]
  correct: Curve
  wrong: Curve

  @property
  def centers(self) -> np.ndarray:
    return (self.edges[:-1] + self.edges[1:]) / 2

  def to_json(self) -> dict:
    """A JSON-ready dict (NaN written as null)."""
    return {"edges": self.edges.tolist(), "correct": self.correct.to_json(), "wrong": self.wrong.to_json()}


def _curve(outcomes: Sequence[ThinkingOutcome], bins: int) -> Curve:
  sums = np.zeros((3, bins))
  count = np.zeros(bins, np.int64)
  for o in outcomes:
    c = len(o.cuts)
    # boundary j of c sits at (j + 1) / c; its bin is ceil((j + 1) * bins / c) - 1, in integers (no rounding)
    b = ((np.arange(1, c + 1) * bins + c - 1) // c - 1) if c else np.zeros(0, np.int64)
    ok = np.isfinite(o.phi)
    np.add.at(count, b[ok], 1)
    for i, values in enumerate((o.phi, o.conf, o.acc)):
      np.add.at(sums[i], b[ok], values[ok])
  with np.errstate(invalid="ignore", divide="ignore"):
    means = np.where(count > 0, sums / np.maximum(count, 1), np.nan)
  return Curve(means[0], means[1], means[2], count, len(outcomes))


def potential_curves(outcomes: Sequence[ThinkingOutcome], bins: int = 10) -> PotentialCurves:
  """Mean Phi, Conf, Acc per bin of relative step position (boundary c of C at (c + 1) / C, `bins` equal bins over
  (0, 1]), for correct and for wrong trajectories, pooled over boundaries; skipped (NaN) boundaries left out."""
  if isinstance(bins, (bool, np.bool_)) or not isinstance(bins, (int, np.integer)) or bins < 1:
    raise ConfigError(f"potential_curves: bins must be an integer >= 1, got {bins!r}")
  bins = int(bins)
  return PotentialCurves(
    np.linspace(0.0, 1.0, bins + 1),
    _curve([o for o in outcomes if o.correct], bins),
    _curve([o for o in outcomes if not o.correct], bins),
  )


# ------------------------------------------------------------------------------------------------ reports


def plot_curves(curves: PotentialCurves, path: str) -> None:
  """A PNG with three panels (Phi, Conf, Acc against relative step position), correct vs wrong trajectories."""
  fig = Figure(figsize=(13, 3.8))
  axes = fig.subplots(1, 3)
  x = curves.centers
  for ax, field, title in zip(axes, ("phi", "conf", "acc"), ("Step potential Phi", "Confidence", "Correctness")):
    for curve, label, color in ((curves.correct, "correct", "tab:green"), (curves.wrong, "wrong", "tab:red")):
      ax.plot(
        x, getattr(curve, field), marker="o", ms=3, color=color, label=f"{label} ({curve.trajectories} trajectories)"
      )
    ax.set(
      title=title, xlabel="relative step position", xlim=(0, 1), ylim=(-1.02, 1.02) if field == "phi" else (-0.02, 1.02)
    )
    ax.legend(fontsize=7)
  fig.tight_layout()
  with atomic_open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=110)


def plot_displacement(metrics: TrajectoryMetrics, path: str) -> None:
  """A PNG histogram of first saturated boundary - oracle step over correct trajectories (paper App. C.1)."""
  fig = Figure(figsize=(6, 3.8))
  ax = fig.subplots()
  d = np.asarray(metrics.displacements, np.int64)
  if d.size:
    values = np.arange(d.min(), d.max() + 1)
    heights = np.array([np.sum(d == v) for v in values])
    colors = ["tab:green" if v == 0 else "tab:blue" if v < 0 else "tab:orange" for v in values]
    ax.bar(values, heights, color=colors, width=0.8)
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.yaxis.set_major_locator(MaxNLocator(integer=True))
  c = metrics.displacement_counts
  agreement = "n/a" if math.isnan(metrics.oracle_agreement) else f"{100 * metrics.oracle_agreement:.1f}%"
  ax.set(
    xlabel="first saturated boundary - oracle step",
    ylabel="trajectories",
    title=f"synchronised {c['synchronised']}, early {c['early']}, late {c['late']}, never {c['never']} "
    f"(agreement {agreement} of {metrics.oracle_count})",
  )
  ax.title.set_fontsize(9)
  fig.tight_layout()
  with atomic_open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=110)


def _cell(x: float, fmt: str) -> str:
  return "n/a" if x is None or math.isnan(x) else format(x, fmt)


def metrics_markdown(rows: Mapping[str, TrajectoryMetrics]) -> str:
  """A Markdown table shaped like the paper's: one row per name (e.g. 'arithmetic, plain'), columns Acc@k, Len@k,
  solving and checking tokens, R2W, reflect steps, oracle agreement (percentages in points)."""
  if not rows:
    raise ConfigError("metrics_markdown: no rows")
  ks = {m.k for m in rows.values()}
  k = str(next(iter(ks))) if len(ks) == 1 else "k"
  head = ["method", f"Acc@{k}", f"Len@{k}", "solving", "checking", "R2W", "reflect steps", "oracle agreement"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for name, m in rows.items():
    agreement = _cell(100 * m.oracle_agreement, ".1f")
    cells = [
      name + ("" if len(ks) == 1 else f" (k={m.k})"),
      _cell(100 * m.acc_at_k, ".2f"),
      _cell(m.len_at_k, ".0f"),
      _cell(m.solving_tokens, ".0f"),
      _cell(m.checking_tokens, ".0f"),
      _cell(100 * m.r2w, ".1f"),
      _cell(m.reflect_steps, ".2f"),
      f"{agreement} (n={m.oracle_count})",
    ]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"
