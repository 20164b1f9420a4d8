"""What the step-level search (`search`) carries through its rounds and what it hands back.

Finishing: a row is finished by EOS, its token budget ('length'), the cache ('cache_full'), an answer line (line
mode: a step with a line that starts with '<Answer>', 'answer'; the answer line is a step like the others, scored
when it is sampled) or its max_steps-th step ('max_steps'). A finished row is not expanded again: it keeps its slot
in its group to the end, and of its N copies only the first stands in later selections. The step that holds only a
final EOS token is not a step of the returned candidate (its response drops the EOS, as Best-of-N's does); a last
step that ended on EOS keeps the score it was selected by, which read the EOS token too.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int, Key

import reprobe_jax.models.decode_state as decode_state
from reprobe_jax.features import FeatureSpec
from reprobe_jax.models import CaptureSpec
from reprobe_jax.models.decode_state import FINISH_CACHE_FULL, FINISH_EOS, FINISH_LENGTH, DecodeState, StopRule
from reprobe_jax.models.forward import StaticGraph
from reprobe_jax.models.sharding import ShardingCtx
from reprobe_jax.scorers import StepScorer
from reprobe_jax.tts.result import Candidate, PromptResult

FINISH_ANSWER, FINISH_MAX_STEPS = 4, 5
REASONS = {
  FINISH_LENGTH: "length",
  FINISH_EOS: "eos",
  FINISH_CACHE_FULL: "cache_full",
  FINISH_ANSWER: "answer",
  FINISH_MAX_STEPS: "max_steps",
}
GOES_ON = -1  # the reason of a row that is not finished


def round_keys(prompt_keys, round_, rows_per_prompt: int) -> jax.Array:
  """[P * rows] keys of the rows after round `round_` - 1's selection (round_ >= 1): row j of prompt p draws from
  fold_in(fold_in(prompt_keys[p], round_), j), so the N copies of a survivor sample distinct next steps and a prompt's
  streams do not depend on the batch. Round 0's keys are the prefill's `decode_state.row_keys(prompt_keys, rows)`."""
  folded = jax.vmap(lambda k: jax.random.fold_in(k, round_))(prompt_keys)
  return decode_state.row_keys(folded, rows_per_prompt)


@dataclasses.dataclass(frozen=True)
class SearchPlan:
  """Everything static about one search program (it keys the jit cache): the model's graph and sharding, the
  search's shape, what is captured and how tokens are picked."""

  graph: StaticGraph  # the model's graphdef (`LanguageModel.decode_view`)
  shard: ShardingCtx | None
  groups: int
  width: int
  n: int
  lookahead: int
  history: int  # step slots per row (max_steps, bucketed)
  spec: FeatureSpec | None
  num_layers: int
  capture: CaptureSpec
  greedy: bool
  top_k: int
  filtered: bool
  dedupe: bool = False

  @property
  def rows_per_prompt(self) -> int:
    return self.groups * self.width * self.n


@struct.dataclass
class SearchEnv:
  """What every round reads that is traced and fixed for the whole search: new prompts, seeds, temperatures,
  step budgets and stop tables in the same buckets compile nothing."""

  params: Any  # the model's parameters (`LanguageModel.decode_view`)
  scorer: StepScorer
  rule: StopRule | Any  # the step boundary: a StopRule or a compiled StopTable (`advance`)
  answer: Int[Array, "states vocab"] | None  # the answer-line automaton (`answer_table`), None: no answer lines
  eos_mask: Bool[Array, " vocab"]
  temperature: Float[Array, ""]
  top_p: Float[Array, ""]
  max_steps: Int[Array, ""]
  prompt_keys: Key[Array, " p"]
  prompts: tuple[Int[Array, "r tp"], Bool[Array, "r tp"]]  # every row's prompt, left-padded (`prompt_rows`)


@struct.dataclass
class SearchBook:
  """Per-row search bookkeeping carried (and gathered) with the decode rows; R rows, H = history, P prompts."""

  ended: Bool[Array, " r"]  # finished (not expanded again)
  reason: Int[Array, " r"]  # REASONS code, GOES_ON while not ended
  primary: Bool[Array, " r"]  # the first copy of its source row (of a finished row only it stands)
  n_steps: Int[Array, " r"]  # steps selected so far
  scores: Float[Array, "r h"]  # each selected step's score
  spans: Int[Array, "r h 2"]  # each selected step's token span
  last: Float[Array, " r"]  # the newest selected step's score (the row's rank)
  sampled: Int[Array, " p"]  # steps sampled per prompt (discarded candidates and lookahead included)
  generated: Int[Array, " p"]  # tokens generated per prompt (lookahead included)
  bad: Int[Array, " p"]  # steps with tokens the scorer gave a NaN or infinite score (`scorers.bad_scores`), per prompt


class SearchLoop(NamedTuple):
  """The rounds' `while_loop` carry."""

  state: DecodeState
  book: SearchBook
  carry: Any  # the scorer's carry for every row (`StepScorer.init_carry`); () unless it is stateful
  round: Int[Array, ""]


class Lookahead(NamedTuple):
  """What a lookahead leaves: the state copy it decoded on, and per row [R] the span of its last step (the
  candidate's own where no lookahead step came), its lookahead steps and tokens, and the score of its last lookahead
  step (NaN where none came, or where the scorer is stateless: the caller scores `spans`)."""

  state: DecodeState
  spans: Int[Array, "r 2"]
  steps: Int[Array, " r"]
  tokens: Int[Array, " r"]
  score: Float[Array, " r"]


class FinalRows(NamedTuple):
  """The search's final rows on the host: their tokens [R, N], lengths [R] and book."""

  tokens: np.ndarray
  lengths: np.ndarray
  book: SearchBook


def results(out: FinalRows, n_prompts: int, plan: SearchPlan, eos: np.ndarray) -> list[PromptResult]:
  book = out.book
  results = []
  for p in range(n_prompts):
    cands = []
    for g in range(plan.groups):
      rows = [(p * plan.groups + g) * plan.width * plan.n + w * plan.n for w in range(plan.width)]
      last = book.last
      rows.sort(key=lambda r: (bool(np.isnan(last[r])), 0.0 if np.isnan(last[r]) else float(last[r])))
      cands += [_candidate(out, r, eos) for r in rows]
    results.append(
      PromptResult(candidates=tuple(cands), sampled_steps=int(book.sampled[p]), generated_tokens=int(book.generated[p]))
    )
  return results


def _candidate(out: FinalRows, r: int, eos: np.ndarray) -> Candidate:
  book = out.book
  reason = int(book.reason[r])
  ids = [int(t) for t in out.tokens[r, : int(out.lengths[r])]]
  if reason == FINISH_EOS and ids and eos[ids[-1]]:
    ids = ids[:-1]
  steps, scores = [], []
  n = int(book.n_steps[r])
  for k in range(n):
    start, end = (int(v) for v in book.spans[r, k])
    end = min(end, len(ids))
    start = min(start, end)
    if k == n - 1 and start == end == len(ids) and reason == FINISH_EOS and n > 1:
      continue  # the step that held only the final EOS
    steps.append((start, end))
    scores.append(float(book.scores[r, k]))
  return Candidate(
    response_ids=tuple(ids), steps=tuple(steps), step_scores=tuple(scores), finish_reason=REASONS[reason]
  )
