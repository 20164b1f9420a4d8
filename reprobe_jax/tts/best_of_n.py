"""Best-of-N (docs/method.md §A7): N whole trajectories per prompt from one prefill, every step scored on device.

    results = best_of_n(lm, get_scorer("probe", path=...), problems, SearchConfig("best_of_n", n=16))
    outcomes = [select.select(p, r, lm.tokenizer, mode="line", aggregation="min", probabilities=True)
                for p, r in zip(problems, results)]

Each prompt is prefilled once; its N rows read that prefill as a shared prefix and decode to their end (EOS or
the token budget) in one jitted loop with no step boundary, so no row waits for another at a boundary. The steps
are then aligned on device (`steps.step_spans`, the spans of `steps.align`, from the same automaton the sampler's
StopTable runs: every stop it would make is a span end), so the spans are exactly the boundaries a stepwise decode
would pause at, and they are the spans the probe was trained on (a stepwise decode's newest-step span would also hold
the blank lines between steps). A trajectory is cut after its '<Answer>' line (line mode, finish reason 'answer':
where beam search ends a row, read as the search reads it) and after its max_steps-th step ('max_steps'), also on
device (`best_of_n_rows`); its row decodes on past a cut, which costs device time but is not counted in the
result's budget (the budget is what the kept trajectories hold, as a stepwise decode would spend). All steps of all
rows are then scored in one jitted call on the captured features (no second forward; a probe packs each step's
window on device, `probe.windows`).

Host round trips: one. Every chunk of prompts (`batch_size`) is decoded, aligned, cut and its scoring dispatched
without a fetch; one `jax.device_get` at the end brings every chunk's tokens, lengths, finish reasons, spans and
scores. With a sharded target (`lm.shard`) the rows, their KV cache and buffers, their spans, the scorer's inputs
and its scores sit on the mesh's data axis (docs/scale.md, "What runs data-parallel").
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from reprobe_jax import steps as step_lib
from reprobe_jax.errors import CacheFullError, ConfigError
from reprobe_jax.features import FeatureSpec, union_capture
from reprobe_jax.models import CaptureSpec, LanguageModel, decoding
from reprobe_jax.models.decode_state import DecodeState
from reprobe_jax.models.sampling import bucket
from reprobe_jax.models.sharding import ShardingCtx, constrain_rows
from reprobe_jax.models.xla_options import decode_jit
from reprobe_jax.scorers import PendingScores, StepScorer, checked_scores, inputs_from_state, prompt_rows
from reprobe_jax.steps import ANSWER_PREFIX, STEP_MODE, StepBoundary, align_table, answer_table
from reprobe_jax.tasks.base import Problem
from reprobe_jax.tasks.formats import MODES
from reprobe_jax.tasks.response import is_answer_line
from reprobe_jax.trajectories import prompt_text
from reprobe_jax.tts.best_of_n_rows import RowRules, candidate_rows, results
from reprobe_jax.tts.checks import prompt_seeds_for, scorer_spec
from reprobe_jax.tts.config import STRATEGIES, SearchConfig
from reprobe_jax.tts.result import PromptResult
from reprobe_jax.tts.select import answer_checker, check_aggregation


@functools.partial(jax.jit, static_argnames=("n", "spec", "num_layers", "shard"))
def _score_steps(
  scorer: StepScorer,
  state: DecodeState,
  spans,
  prompts,
  *,
  n: int,
  spec: FeatureSpec | None,
  num_layers: int,
  shard: ShardingCtx | None = None,
):
  """Step scores [B, S] of a decode state's rows for spans [B, S, 2], from its captured values and the rows'
  prompts = (ids, mask) [B, Tp] (`scorers.prompt_rows`), on device. The scorer sees one prompt's n rows at a time
  (mapped over prompts), so a row's index in the scorer (the random baseline's key) is its index within its prompt,
  whatever the batch."""
  inputs = constrain_rows(inputs_from_state(constrain_rows(state, shard), spec, num_layers, prompts), shard)
  per_prompt = lambda x: x.reshape((-1, n) + x.shape[1:])  # [B, ...] -> [P, n, ...]
  # One prompt at a time (lax.map, not vmap): the n rows of a prompt are scored in one batched call, and memory
  # holds one prompt's [n * S, T] probe windows, not every prompt's (960 rows of 32 steps would need ~10 GB).
  one = lambda a: checked_scores(scorer, scorer.score(*a), a[1].shape[:2], "score")  # checked while traced
  scores = jax.lax.map(one, (jax.tree.map(per_prompt, inputs), per_prompt(spans)))  # [P, n, S]
  return constrain_rows(scores.reshape(spans.shape[:2]).astype(jnp.float32), shard)


@functools.partial(jax.jit, static_argnames=("spec", "num_layers", "shard"))
def _features(state: DecodeState, *, spec: FeatureSpec, num_layers: int, shard: ShardingCtx | None = None):
  """[B, N, F] the features `spec` assembles for every row, on device from the captured values."""
  return constrain_rows(inputs_from_state(constrain_rows(state, shard), spec, num_layers).features, shard)


def _decode_rows_impl(
  graph, params, state, rule, eos_mask, temperature, top_p, *, greedy, top_k, filtered, capture, shard
):
  """`Sampler.decode` of every row to EOS or its budget, with the rows (KV cache, buffers) on the data axis."""
  state = decoding.decode_in_jit(
    graph,
    params,
    constrain_rows(state, shard),
    rule,
    eos_mask,
    temperature,
    top_p,
    jnp.int32(state.buffer_len),
    greedy=greedy,
    top_k=top_k,
    filtered=filtered,
    capture=capture,
    shard=shard,
  )
  return constrain_rows(state, shard)


_decode_rows = decode_jit(
  static_argnames=("graph", "greedy", "top_k", "filtered", "capture", "shard"), donate_argnames=("state",)
)(_decode_rows_impl)[0]


@STRATEGIES.register("best_of_n")
def best_of_n(
  lm: LanguageModel,
  scorer: StepScorer,
  problems: Sequence[Problem | str | Sequence[int]],
  cfg: SearchConfig,
  *,
  mode: str = "line",
  feature_spec: FeatureSpec | None = None,
  prompt_seeds: Sequence[int] | None = None,
  few_shot: int = 0,
  batch_size: int | None = None,
) -> list[PromptResult]:
  """N = cfg.n trajectories per prompt, each step scored (docs/method.md §A7 Best-of-N); one PromptResult per prompt.

  problems: Problems (prompted with `trajectories.prompt_text` in `mode`, after `few_shot` worked examples; their
  domain must name a registered task, which reads and checks their answers) or prompts (texts or token ids).
  Greedy is cfg with temperature 0 and n = 1.
  prompt_seeds: one integer in [0, 2**32) per prompt (default `checks.prompt_seeds_for`); row s of prompt p draws
  from its own key, so a prompt gets the same result in any batch. batch_size: prompts per prefill (default all).
  A candidate ends at EOS, its token budget, its max_steps-th step ('max_steps') or, in line mode, its '<Answer>'
  line ('answer', where beam search ends a row).
  Every check (config, scorer and features, answer checkers, cache room, seeds) runs before any decoding.
  """
  if not isinstance(cfg, SearchConfig) or cfg.strategy != "best_of_n":
    got = cfg.strategy if isinstance(cfg, SearchConfig) else type(cfg).__name__
    raise ConfigError(f"SearchConfig.strategy: best_of_n needs a SearchConfig with strategy 'best_of_n', got {got!r}")
  if mode not in MODES:
    raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
  spec = scorer_spec(lm, scorer, feature_spec)
  check_aggregation(cfg.aggregation, scorer)
  if lm.tokenizer is None:
    raise ConfigError("best_of_n aligns steps on the tokenizer's text; this model has none")
  problems = list(problems)
  if not problems:
    raise ConfigError("best_of_n: no problems")
  for i, p in enumerate(problems):
    if isinstance(p, Problem):
      answer_checker(p, f"problems[{i}]: ")
  ids = lm.encode([prompt_text(lm, p, mode, few_shot) if isinstance(p, Problem) else p for p in problems])
  for j, p in enumerate(ids):
    if not p:
      raise ConfigError(f"best_of_n: prompt {j} is empty")
  longest = max(map(len, ids))
  room = lm.config.max_position_embeddings
  if longest + cfg.max_new_tokens > room:
    raise CacheFullError(
      f"SearchConfig.max_new_tokens={cfg.max_new_tokens}: the longest prompt ({longest} tokens) "
      f"plus the budget exceeds the target's context of {room} tokens"
    )
  seeds = prompt_seeds_for(ids, prompt_seeds)
  chunk = len(problems) if batch_size is None else batch_size
  if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
    raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}")

  capture = union_capture([spec]) if spec is not None else CaptureSpec(token_stats=True)
  sampler = lm.sampler(cfg.sampling, capture=capture)
  prefix = ANSWER_PREFIX[mode]  # the answer line a step-level search finishes rows at (none in thinking mode)
  rules = RowRules(
    align=align_table(StepBoundary(STEP_MODE[mode]), lm.tokenizer, lm.config.vocab_size),
    answer=None if prefix is None else answer_table(lm.tokenizer, lm.config.vocab_size, prefix),
    eos_mask=jnp.asarray(lm.eos_mask()),
    max_steps=jnp.int32(cfg.max_steps),
    rows=jnp.int32(0),
  )
  chunks = [(ids[s : s + chunk], seeds[s : s + chunk]) for s in range(0, len(ids), chunk)]
  pending = []  # per chunk: its candidates and their scores, on device
  for c, c_seeds in chunks:
    state = decode_trajectories(sampler, c, cfg, c_seeds).replace(cache=None)  # the buffers are what is read
    rows = candidate_rows(
      rules.replace(rows=jnp.int32(len(c) * cfg.n)),
      state.tokens,
      state.lengths,
      state.finish,
      steps=bucket(cfg.max_steps, minimum=4),
      shard=lm.shard,
    )
    pending.append((rows, _dispatch_scores(lm, scorer, state, c, rows.spans, cfg, spec)))
    del state  # its buffers go once the scoring that reads them has run; the next chunk decodes meanwhile
  fetched = jax.device_get([(rows, p.values) for rows, p in pending])  # the one fetch of the whole call
  out: list[PromptResult] = []
  for (c, _), (_, p), (rows, values) in zip(chunks, pending, fetched):
    out += results(scorer, rows, p.unpack(values), len(c), cfg.n)
  return out


def decode_trajectories(
  sampler, prompt_ids: Sequence[Sequence[int]], cfg: SearchConfig, prompt_seeds: Sequence[int]
) -> DecodeState:
  """The decode state of cfg.n rows per prompt (prompt-major), each decoded to EOS or its token budget: one
  prefill per prompt, read by its rows as a shared prefix, and one jitted decode loop."""
  state = sampler.prefill(
    list(prompt_ids), max_new_tokens=cfg.max_new_tokens, n=cfg.n, seed=cfg.seed, prompt_seeds=list(prompt_seeds)
  )
  p, lm = sampler.params, sampler.lm
  return _decode_rows(
    *lm.decode_view(),
    constrain_rows(state, lm.shard, put=True),
    sampler.stop,
    jnp.asarray(lm.eos_mask()),
    jnp.float32(p.temperature),
    jnp.float32(p.top_p),
    greedy=p.greedy,
    top_k=p.top_k,
    filtered=p.filtered,
    capture=sampler.capture,
    shard=lm.shard,
  )


def trajectory_steps(
  tokenizer, ids: Sequence[int], finish_reason: str, *, mode: str, max_steps: int
) -> tuple[list[int], list[tuple[int, int]], str]:
  """A decoded row (ids without EOS) as a candidate: (response ids, step spans [(start, end)], finish reason). Steps
  are `steps.align`'s (docs/method.md §A1); in line mode the response ends with its first '<Answer>' line ('answer'),
  and it keeps at most max_steps steps ('max_steps'). A cut drops the tokens after the kept steps. The host
  reference of what `best_of_n_rows.candidate_rows` computes on device for every row at once."""
  ids = list(ids)
  steps = step_lib.align(tokenizer, ids, STEP_MODE[mode])
  answer = next((k for k, st in enumerate(steps) if mode == "line" and is_answer_line(st.text)), None)
  if answer is not None and steps[answer].end < len(ids):  # the answer line ends the candidate
    steps, ids, finish_reason = steps[: answer + 1], ids[: steps[answer].end], "answer"
  spans = [(st.start, st.end) for st in steps]
  if len(spans) > max_steps:
    spans = spans[:max_steps]
    ids, finish_reason = ids[: spans[-1][1]], "max_steps"
  return ids, spans, finish_reason


def _dispatch_scores(
  lm: LanguageModel,
  scorer: StepScorer,
  state: DecodeState,
  prompt_ids: Sequence[Sequence[int]],
  spans: jax.Array,
  cfg: SearchConfig,
  spec: FeatureSpec | None,
) -> PendingScores:
  """The step scores [B, S] of one chunk's rows for their spans [B, S, 2] (on device), every step scored at once on
  device; nothing fetched."""
  layers, shard = lm.config.num_layers, lm.shard
  if scorer.packs_trajectories:  # a probe: each step's window once, packed (`ProbeScorer.dispatch_trajectories`)
    feats = _features(state, spec=spec, num_layers=layers, shard=shard)
    return scorer.dispatch_trajectories(feats, spans, shard=shard)
  rows = prompt_rows(prompt_ids, cfg.n, state.batch, lm.pad_id())
  prompts = constrain_rows(tuple(jnp.asarray(a) for a in rows), shard, put=True)
  return PendingScores(_score_steps(scorer, state, spans, prompts, n=cfg.n, spec=spec, num_layers=layers, shard=shard))
