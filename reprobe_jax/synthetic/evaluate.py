"""Measures a target model on held-out synthetic problems from its own samples (the target report).

Per family and format: step error rate, final-answer accuracy, mean response length in tokens; thinking mode adds
the share of correct trajectories that keep re-checking after the answer is established, and the right-to-wrong
rate (docs/method.md §B3). Labels come from the exact rule-based checkers, so the numbers are exact for the samples
drawn.

Confidence of a mistake: every aligned step (the probe's steps, docs/method.md §A1: the '<Answer>' line included in line
mode) records the lowest probability the model gave one of the tokens it sampled in that step. A wrong step is
*confident* when that lowest probability is above `CONFIDENT` (0.5): no token of it was a long-shot draw, so the
error is what the model believes rather than a slip of sampling at T=1, and MaxProb / Perplexity rank it low.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

import numpy as np

from reprobe_jax import steps as step_lib
from reprobe_jax.annotate.rule import line_labels, match_labels
from reprobe_jax.errors import DataFormatError
from reprobe_jax.steps.labels import labels_to_json
from reprobe_jax.models import LanguageModel, SamplingParams
from reprobe_jax.synthetic.tokenizer import chat_prompt
from reprobe_jax.tasks import Problem
from reprobe_jax.tasks.formats import check_response, check_thinking, thinking_progress, user_prompt
from reprobe_jax.tasks.response import parse_thinking
from reprobe_jax.steps.modes import STEP_MODE

CONFIDENT = 0.5  # a wrong step whose every sampled token had at least this probability is a confident mistake


def sample_responses(
  lm: LanguageModel,
  problems: Sequence[Problem],
  mode: str,
  *,
  temperature: float,
  max_new_tokens: int,
  seed: int,
  batch_size: int = 64,
  on_batch: Callable[[int], None] | None = None,
) -> list[dict]:
  """One sample per problem; returns records with the text, token count and finish reason."""
  out = []
  for start in range(0, len(problems), batch_size):
    chunk = problems[start : start + batch_size]
    prompts = [chat_prompt(lm.tokenizer, user_prompt(p, mode)) for p in chunk]
    gen = lm.generate(
      prompts, SamplingParams(temperature=temperature), max_new_tokens=max_new_tokens, seed=seed + start
    )
    for row, problem in enumerate(chunk):
      ids = gen.token_ids(row)
      if ids and ids[-1] == lm.tokenizer.eos_token_id:
        ids = ids[:-1]
      probs = np.exp(gen.logprobs[row, : len(ids)])
      aligned = step_lib.align(lm.tokenizer, ids, STEP_MODE[mode])
      out.append(
        {
          "id": problem.id,
          "domain": problem.domain,
          "mode": mode,
          "prompt": prompts[row],
          "response": lm.tokenizer.decode(ids),
          "num_tokens": len(ids),
          "finish_reason": gen.finish_reason[row],
          "aligned_steps": [a.text for a in aligned],
          "step_min_prob": [round(float(probs[a.start : a.end].min()), 6) for a in aligned],
        }
      )
    if on_batch is not None:
      on_batch(len(chunk))
  return out


def label_samples(problems: Sequence[Problem], samples: Sequence[dict]) -> list[dict]:
  """Adds the checker's step labels, the answer and correctness (and thinking-mode progress) to each sample."""
  by_id = {p.id: p for p in problems}
  out = []
  for s in samples:
    problem = by_id[s["id"]]
    checked = check_response(problem, s["response"], s["mode"])
    if s["mode"] == "line":
      aligned_labels = line_labels(problem, s["aligned_steps"])[0]
    else:
      paragraphs = parse_thinking(s["response"])[0]
      aligned_labels = match_labels(s["aligned_steps"], paragraphs, check_thinking(problem, paragraphs))
    rec = dict(
      s,
      steps=checked.steps,
      labels=labels_to_json(checked.labels),
      answer=checked.answer,
      correct=checked.correct,
      first_error=checked.first_error,
      aligned_labels=labels_to_json(aligned_labels),
    )
    if s["mode"] == "thinking":
      progress = thinking_progress(problem, parse_thinking(s["response"])[0])
      rec.update(
        established=progress.established,
        right_established=progress.right_established,
        rechecks_after=progress.rechecks_after,
      )
    out.append(rec)
  return out


def summarise_samples(records: Sequence[dict]) -> dict:
  """The report's numbers for one (family, format) group of the target's labelled samples (not a scorer's
  metrics: those are `reprobe_jax.eval.report.scorer_metrics`)."""
  labels = np.array([x for r in records for x in r["labels"] if x is not None], float)
  correct = np.array([r["correct"] for r in records], bool)
  out = {
    "samples": len(records),
    "steps": int(labels.size),
    "step_error_rate": float(labels.mean()) if labels.size else float("nan"),
    "correct_step_share": float(1 - labels.mean()) if labels.size else float("nan"),
    "final_accuracy": float(correct.mean()),
    "mean_tokens": float(np.mean([r["num_tokens"] for r in records])),
    "unparsed_answer_rate": float(np.mean([r["answer"] is None for r in records])),
    "truncated_rate": float(np.mean([r["finish_reason"] == "length" for r in records])),
  }
  pairs = np.array(
    [(x, p) for r in records for x, p in zip(r["aligned_labels"], r["step_min_prob"]) if x is not None], float
  ).reshape(-1, 2)
  wrong = pairs[pairs[:, 0] == 1.0, 1]
  # The probe's steps (the '<Answer>' line included in line mode): the base rate every PR-AUC is measured against.
  out["aligned_steps"] = int(len(pairs))
  out["aligned_error_rate"] = float(pairs[:, 0].mean()) if len(pairs) else float("nan")
  out["confident_error_share"] = float(np.mean(wrong > CONFIDENT)) if wrong.size else float("nan")
  if records and records[0]["mode"] == "thinking":
    ok = [r for r in records if r["correct"] and r["established"] is not None]
    right = [r for r in records if r["right_established"]]
    out["recheck_after_answer_share"] = float(np.mean([r["rechecks_after"] > 0 for r in ok])) if ok else float("nan")
    out["right_to_wrong_rate"] = float(np.mean([not r["correct"] for r in right])) if right else float("nan")
    out["right_established"] = len(right)
  return out


_DIFFICULTY = re.compile(r"^[a-z]+-d(\d+)-s\d+")  # problem ids: {family}-d{difficulty}-s{seed}[-{i:05d}]


def difficulty_of(problem_id: str) -> int:
  """The difficulty a problem id names (`make_problems`' ids); DataFormatError when the id names none."""
  m = _DIFFICULTY.match(problem_id)
  if m is None:
    raise DataFormatError(f"problem id {problem_id!r} names no difficulty (expected '<family>-d<k>-s<seed>...')")
  return int(m.group(1))


def summarise_by_difficulty(records: Sequence[dict]) -> dict[str, dict]:
  """`summarise_samples` per (family, format, difficulty): {'planning/line/d1': {...}, ...}, in that order."""
  groups: dict[tuple, list] = {}
  for r in records:
    groups.setdefault((r["domain"], r["mode"], difficulty_of(r["id"])), []).append(r)
  return {f"{f}/{m}/d{d}": summarise_samples(groups[(f, m, d)]) for f, m, d in sorted(groups)}
