"""Reader mode (docs/own-data.md): the target teacher-forced over the given steps of step-labelled solutions
(ProcessBench, PRM800K) instead of sampling its own, one forward pass per batch giving what sampling gives: the
per-token statistics, the probe's features (docs/method.md §A3) and exact step spans, with the file's step labels.

A solution's response is its steps written in the response format the prompt asks for (`tasks.response`): line
mode one '- Step k: ...' line per step, thinking mode one paragraph per step inside '<think>' (a step's own line
breaks become spaces, so a step stays one line or one paragraph). No answer line or box is added: the files' last
step holds the final answer (ProcessBench's '\\boxed{}', PRM800K's '# Answer' step), and every step given is one
labelled step. A step's token span holds the tokens that end inside its text (`steps.tokens.token_end_offsets`;
a token that straddles a boundary belongs to the step where it ends, docs/method.md §A1), so spans are exact by
construction rather than found again by the boundary automaton.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from typing import Callable, Mapping, Sequence

import numpy as np

from reprobe_jax.errors import CacheFullError, ConfigError, DataFormatError
from reprobe_jax.features.spec import FeatureSpec, forward_values, padded_forward, union_capture
from reprobe_jax.models import LanguageModel
from reprobe_jax.models.sharding import to_host
from reprobe_jax.steps.modes import THINK_OPEN, WHITESPACE
from reprobe_jax.steps.tokens import token_end_offsets
from reprobe_jax.tasks import Problem
from reprobe_jax.tasks.dataset_records import LabelledSolution
from reprobe_jax.tasks.response import render_line, render_thinking
from reprobe_jax.trajectories.prompts import opens_thinking, prompt_text
from reprobe_jax.trajectories.record import MODES, StepSpan, Trajectory

_BREAKS = re.compile(r"\s*\n\s*")


def render_steps(steps: Sequence[str], mode: str) -> tuple[str, list[tuple[int, int]]]:
  """(response text, each step's character range [start, end) in it): the steps in `mode`'s response format, no
  answer line. Line mode: a range is the step's line ('- Step k: ...') with its line break; thinking: its paragraph
  with its '.\\n\\n' (where `steps.align` ends a step)."""
  if mode not in MODES:
    raise ConfigError(f"render_steps: mode must be one of {', '.join(MODES)}, found {mode!r}")
  render = render_line if mode == "line" else render_thinking
  bodies = [_BREAKS.sub(" ", s.strip()) for s in steps]
  text = render(bodies, None)
  # Where a step ends: where the text of the steps up to it and the same text with one more step part.
  ranges, prev = [], _common(render([], None), render(["x"], None))
  for k in range(len(bodies)):
    end = _common(render(bodies[: k + 1], None), render(bodies[: k + 1] + ["x"], None))
    if mode == "line" and text[end : end + 1] == "\n":  # a line's break is its own, as the line boundary cuts it
      end += 1
    start = prev + (len(text[prev:end]) - len(text[prev:end].lstrip(WHITESPACE)))
    ranges.append((start, end))
    prev = end
  return text, ranges


def _common(a: str, b: str) -> int:
  n = min(len(a), len(b))
  return next((i for i in range(n) if a[i] != b[i]), n)


def teacher_force(
  lm: LanguageModel,
  problems_by_id: Mapping[str, Problem],
  solutions: Sequence[LabelledSolution],
  mode: str,
  *,
  few_shot: int = 0,
  feature_specs: Sequence[FeatureSpec] = (),
  on_features: Callable[[list[Trajectory], dict[str, dict[str, np.ndarray]]], None] | None = None,
  batch_size: int = 8,
) -> list[Trajectory]:
  """One labelled Trajectory per solution, in order: the prompt `prompt_text(lm, problem, mode, few_shot)`, the
  response its steps (`render_steps`), the per-token log-probabilities, entropies and self-certainties of one
  teacher-forced forward pass per `batch_size` solutions (next-token aligned, as sampling records them), the file's
  step labels (1.0 incorrect, 0.0 correct, NaN unknown; annotator 'import:<format>'), its first error, and in
  `extra['correct']` whether its final answer is right (the file's `final_answer_correct`, None when it does not
  say). With `feature_specs`, after each batch `on_features(batch, {spec name: {trajectory id: [n_tokens, F]}})`
  gets the features captured in the same pass. Every solution is tokenized and checked (its problem known, its
  text round-tripped by the tokenizer, its length inside the context) before the first forward."""
  if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
    raise ConfigError(f"teacher_force: batch_size must be an integer >= 1, found {batch_size!r}")
  records = [_unforced(lm, problems_by_id, s, mode, few_shot) for s in solutions]
  capture = union_capture(feature_specs)
  out: list[Trajectory] = []
  for start in range(0, len(records), batch_size):
    chunk = records[start : start + batch_size]
    values = _forward(lm, chunk, capture, batch_size)
    batch = []
    for row, (r, sol) in enumerate(chunk):
      p, n = len(r.prompt_ids), len(r.response_ids)
      at = slice(p - 1, p - 1 + n)  # token j's values come from position j - 1 (docs/method.md §A3)
      batch.append(
        dataclasses.replace(
          r,
          logprobs=_floats(values["token_logprobs"][row, at]),
          entropy=_floats(values["token_entropy"][row, at]),
          self_certainty=_floats(values["token_self_certainty"][row, at]),
        )
      )
    if feature_specs and on_features is not None:
      feats = {}
      for spec in feature_specs:
        arr = np.asarray(to_host(spec.assemble(values, lm.config.num_layers)))  # [rows, T, F]
        feats[spec.name] = {
          t.id: arr[row, len(t.prompt_ids) - 1 : len(t.prompt_ids) - 1 + len(t.response_ids)]
          for row, t in enumerate(batch)
        }
      on_features(batch, feats)
    out += batch
  return out


def _unforced(
  lm: LanguageModel, problems_by_id: Mapping[str, Problem], sol: LabelledSolution, mode: str, few_shot: int
) -> tuple[Trajectory, LabelledSolution]:
  """The solution's record before the forward pass: prompt and response tokens, step spans, labels."""
  if sol.problem_id not in problems_by_id:
    raise DataFormatError(f"solution {sol.id!r}: its problem {sol.problem_id!r} is not among the problems given")
  prompt = prompt_text(lm, problems_by_id[sol.problem_id], mode, few_shot)
  text, ranges = render_steps(sol.steps, mode)
  if mode == "thinking" and opens_thinking(prompt):  # the template opened the thinking: the response goes on inside
    cut = len(THINK_OPEN)
    text, ranges = text[cut:], [(a - cut, b - cut) for a, b in ranges]
  prompt_ids = lm.encode([prompt])[0]
  response_ids = list(lm.tokenizer(text, add_special_tokens=False)["input_ids"])
  decoded, ends = token_end_offsets(lm.tokenizer, response_ids)
  if decoded != text:
    raise DataFormatError(
      f"solution {sol.id!r}: the target's tokenizer does not give its text back (decoded {decoded[:60]!r}, written "
      f"{text[:60]!r}); its step spans cannot be exact"
    )
  try:
    lm._check_length(len(prompt_ids) + len(response_ids))
  except CacheFullError as e:
    raise CacheFullError(f"solution {sol.id!r}: {e}") from None
  spans = tuple(
    StepSpan(text[a:b].strip(WHITESPACE), bisect.bisect_right(ends, a), bisect.bisect_right(ends, b)) for a, b in ranges
  )
  record = Trajectory(
    id=sol.id,
    problem_id=sol.problem_id,
    domain=problems_by_id[sol.problem_id].domain,
    mode=mode,
    steps=spans,
    prompt_ids=tuple(prompt_ids),
    response_ids=tuple(response_ids),
    response=text,
    finish_reason="given",
    labels=tuple(sol.labels()),
    first_error=sol.first_error,
    annotator=f"import:{sol.source}",
    extra={"correct": sol.final_answer_correct},
  )
  return record, sol


def _forward(lm: LanguageModel, chunk, capture, rows: int) -> dict:
  """The chunk's prompt + response sequences in one padded forward (`padded_forward`): {value name: [rows, T, ...]}
  on the host, in `FeatureSpec.assemble`'s naming plus the self-certainty."""
  res = padded_forward(lm, [list(r.prompt_ids) + list(r.response_ids) for r, _ in chunk], capture, rows)
  return to_host({**forward_values(res), "token_self_certainty": res["token_self_certainty"]})


def _floats(x) -> tuple[float, ...]:
  return tuple(round(float(v), 6) for v in np.asarray(x))
