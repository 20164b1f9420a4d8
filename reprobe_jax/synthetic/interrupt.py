"""Interrupted thinking: training examples that teach the built-in target to state the answer it has so far.

SPAE (docs/method.md §B1) interrupts a thinking trajectory at a step boundary with `**Final Answer**\\n\\\\boxed{` and
reads how sure the model is of the answer it then writes and how much probability it puts on the true one. A pretrained
reasoning model can do this; a tiny model trained only on whole traces cannot (it has never seen the opener inside
its thinking and answers with an unrelated number). So the SPAE target's training data also holds, for a share of
its thinking traces, one interruption each: the trace up to a random paragraph boundary, the opener, and the answer
a solver holds at that point:
- once the chain is complete there (`is_done` of the replayed paragraphs, re-checks included), the answer it
  implies: right or wrong, whatever was written;
- before that, the running value (the partial state's answer) or, with chance `guess_share`, the answer of another
  problem of the same family: an unfinished chain makes the model unsure, as it should be.
The loss covers only the answer and its closing brace (prompt weight 0), so the model never learns to write the
opener inside its thinking by itself. Nothing here tells the model which answer is true: a chain with a mistake is
interrupted with the wrong answer that chain implies.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Sequence

import numpy as np

from reprobe_jax.errors import ConfigError
from reprobe_jax.tasks import Problem
from reprobe_jax.tasks.formats import answers_so_far, user_prompt
from reprobe_jax.tasks.response import ANSWER_OPENER, parse_thinking

BOUNDARY = ".\n\n"


@dataclasses.dataclass(frozen=True)
class Interrupted:
  """One interrupted trace: the user prompt, the response up to a boundary plus the opener, the answer held there."""

  problem_id: str
  user: str
  prefix: str  # '<think>\n' ... paragraph k's '.\n\n' + ANSWER_OPENER
  answer: str  # what the solver holds after paragraph k (the target of the loss, with the closing brace)
  paragraph: int  # k
  complete: bool  # whether the chain was complete after paragraph k


def boundary_ends(text: str) -> list[int]:
  """Character offsets just past every '.\\n\\n' inside the thinking of a trace (before '</think>')."""
  start = text.find("<think>")
  start = 0 if start < 0 else start + len("<think>")
  end = text.find("</think>", start)
  end = len(text) if end < 0 else end
  out, i = [], text.find(BOUNDARY, start)
  while 0 <= i and i + len(BOUNDARY) <= end:
    out.append(i + len(BOUNDARY))
    i = text.find(BOUNDARY, i + len(BOUNDARY))
  return out


def _chosen(problem_id: str, share: float, seed: int) -> bool:
  return zlib.crc32(f"interrupt:{seed}:{problem_id}".encode()) / 2**32 < share


def interrupted_examples(
  problems: Sequence[Problem], texts: Sequence[str], *, share: float, seed: int, guess_share: float = 0.5
) -> list[Interrupted]:
  """One interruption for a `share` of the thinking traces `texts` (one per problem, in order; chosen by a hash
  of the id, so the same ones in any order), at a boundary drawn uniformly; deterministic in (seed, ids)."""
  if not 0.0 <= share <= 1.0:
    raise ConfigError(f"interrupt share must be in [0, 1], got {share}")
  if not 0.0 <= guess_share <= 1.0:
    raise ConfigError(f"guess_share must be in [0, 1], got {guess_share}")
  if len(problems) != len(texts):
    raise ConfigError(f"interrupted_examples: {len(problems)} problems but {len(texts)} traces")
  pool: dict[str, list[str]] = {}
  for p in problems:
    pool.setdefault(p.domain, []).append(p.answer)
  out = []
  for problem, text in zip(problems, texts):
    if share <= 0.0 or not _chosen(problem.id, share, seed):
      continue
    ends = boundary_ends(text)
    paragraphs = parse_thinking(text)[0][: len(ends)]
    if not ends or len(paragraphs) != len(ends):
      continue
    rng = np.random.default_rng([seed, zlib.crc32(problem.id.encode()), 7])
    k = int(rng.integers(len(ends)))
    answer, complete = answers_so_far(problem, paragraphs[: k + 1])[k]
    if not complete and rng.random() < guess_share:
      others = pool[problem.domain]
      answer = others[int(rng.integers(len(others)))]
    out.append(
      Interrupted(problem.id, user_prompt(problem, "thinking"), text[: ends[k]] + ANSWER_OPENER, answer, k, complete)
    )
  return out
