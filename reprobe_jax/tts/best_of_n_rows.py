"""What Best-of-N (docs/method.md §A7) makes of its decoded rows: on device, each row's steps and where its candidate
ends (`candidate_rows`); on the host, once fetched with their step scores, each prompt's candidates (`results`).

A row's steps are `steps.align`'s (docs/method.md §A1), computed on device by `steps.step_spans` from the automaton
the sampler's StopTable runs: a span ends at every stop a stepwise decode would make and starts at its step's text
(the blank lines between steps are no step's). The row's final EOS is no step's token. The candidate then ends
after its first step that holds an '<Answer>' line (line mode: finish 'answer', where beam search ends a row; the
line is read by `steps.answer_lines`, as the search reads it) unless that step ends the row anyway, and after its
max_steps-th step ('max_steps'). `trajectory_steps` in `tts.best_of_n` is the same cut on the host, one row at a
time, from `steps.align` and the answer line's text (`tasks.response.is_answer_line`). The two agree but where the
answer line's tokens cannot show it: a token that holds the end of the '<Answer>' prefix, the line's newline and
text of the next line (the step's span ends before that token), or a line that opens with a blank outside ASCII
(the text reads it as space, the automaton as text). The tests' tokenizers and texts make neither.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Int

from reprobe_jax.models.decode_state import FINISH_EOS, FINISH_NAMES
from reprobe_jax.models.sharding import ShardingCtx, constrain_rows
from reprobe_jax.scorers import StepScorer, bad_scores, checked_scores, nonfinite_error
from reprobe_jax.steps import AlignTable, answer_lines, step_spans
from reprobe_jax.tts.result import Candidate, PromptResult
from reprobe_jax.tts.search_state import FINISH_ANSWER, FINISH_MAX_STEPS, REASONS
from reprobe_jax.tts.select import candidate_cost

FINISH_REASONS = {**FINISH_NAMES, **REASONS}  # a candidate's finish code -> its finish reason


class RowRules(struct.PyTreeNode):
  """What decides a decoded row's steps and where its candidate ends; traced, so that another budget of steps or
  another chunk compiles nothing."""

  align: AlignTable  # the step boundary of the response format (`steps.align_table`)
  answer: Int[Array, "states vocab"] | None  # the answer-line automaton (`steps.answer_table`); None: none
  eos_mask: Bool[Array, " vocab"]
  max_steps: Int[Array, ""]
  rows: Int[Array, ""]  # the rows that hold a prompt's trajectory; rows past them (batch padding) get no steps


class CandidateRows(struct.PyTreeNode):
  """B decoded rows as candidates: each row's response is tokens[:lengths] (its final EOS dropped, cut where the
  candidate ends) and its steps are its first `steps` spans [start, end) ((0, 0) past them). S: the step buffer."""

  tokens: Int[Array, "b n"]
  lengths: Int[Array, " b"]
  finish: Int[Array, " b"]  # a FINISH_REASONS code
  spans: Int[Array, "b s 2"]
  steps: Int[Array, " b"]


@functools.partial(jax.jit, static_argnames=("steps", "shard"))
def candidate_rows(
  rules: RowRules, tokens, lengths, finish, *, steps: int, shard: ShardingCtx | None = None
) -> CandidateRows:
  """The candidates of decoded rows (tokens [B, N], lengths [B], finish codes [B] of a decode state), on device:
  their steps aligned and cut (module docstring) in a step buffer of S = `steps` >= max_steps slots."""
  tokens, lengths, finish = constrain_rows((tokens, lengths, finish), shard)
  b = tokens.shape[0]
  last = jnp.take_along_axis(tokens, jnp.maximum(lengths - 1, 0)[:, None], axis=1)[:, 0]
  length = lengths - ((finish == FINISH_EOS) & (lengths > 0) & rules.eos_mask[last])  # the final EOS is no step's
  aligned = step_spans(rules.align, tokens, length, steps=steps)
  spans, count = aligned.spans, aligned.count  # [B, S, 2], [B] (count may exceed S)
  k = jnp.arange(steps, dtype=jnp.int32)
  if rules.answer is None:
    hit = jnp.zeros((b, steps), bool)
  else:  # [B, S]: the step holds an answer line, read as the search reads its newest step
    hit = jax.vmap(lambda sp: answer_lines(rules.answer, tokens, sp), in_axes=1, out_axes=1)(spans)
    hit &= k < count[:, None]
  first = jnp.argmax(hit, axis=1)
  end_at = lambda i: jnp.take_along_axis(spans[..., 1], i[:, None], axis=1)[:, 0]
  answer_end = end_at(first)
  answered = hit.any(axis=1) & (answer_end < length)  # the answer line ends the candidate, unless it ends the row
  kept = jnp.where(answered, first + 1, count)
  over = kept > rules.max_steps
  last_end = end_at(jnp.broadcast_to(jnp.clip(rules.max_steps - 1, 0, steps - 1), (b,)))
  kept = jnp.where(jnp.arange(b) < rules.rows, jnp.minimum(kept, rules.max_steps), 0)
  rows = CandidateRows(
    tokens=tokens,
    lengths=jnp.where(over, last_end, jnp.where(answered, answer_end, length)).astype(jnp.int32),
    finish=jnp.where(over, FINISH_MAX_STEPS, jnp.where(answered, FINISH_ANSWER, finish)).astype(jnp.int32),
    spans=jnp.where((k < kept[:, None])[..., None], spans, 0),
    steps=kept.astype(jnp.int32),
  )
  return constrain_rows(rows, shard)


def results(scorer: StepScorer, rows: CandidateRows, scores: np.ndarray, n_prompts: int, n: int) -> list[PromptResult]:
  """One chunk's fetched candidates (`candidate_rows`, host copies) and their step scores [B, S] as PromptResults,
  n per prompt; ConfigError naming the scorer for scores of another shape or non-finite scores of steps with
  tokens."""
  scores = np.asarray(checked_scores(scorer, scores, rows.spans.shape[:2], "score_trajectories"))  # [B, S]
  bad = bad_scores(scores, rows.spans)
  if bad.any():
    raise nonfinite_error(scorer, int(bad.sum()), f"best_of_n, in {int(bad.any(1).sum())} trajectories")
  out = []
  for p in range(n_prompts):
    cands = tuple(_candidate(rows, scores, r) for r in range(p * n, (p + 1) * n))
    costs = [candidate_cost(c) for c in cands]
    out.append(
      PromptResult(candidates=cands, sampled_steps=sum(s for s, _ in costs), generated_tokens=sum(t for _, t in costs))
    )
  return out


def _candidate(rows: CandidateRows, scores: np.ndarray, r: int) -> Candidate:
  k = int(rows.steps[r])
  return Candidate(
    response_ids=tuple(int(t) for t in rows.tokens[r, : int(rows.lengths[r])]),
    steps=tuple((int(a), int(e)) for a, e in rows.spans[r, :k]),
    step_scores=tuple(float(x) for x in scores[r, :k]),
    finish_reason=FINISH_REASONS[int(rows.finish[r])],
  )
