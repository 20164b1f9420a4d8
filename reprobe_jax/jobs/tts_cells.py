"""The cells of the test-time-scaling grid: one strategy with one step scorer over one domain's problems, summarised
at every budget (`strategy_cell`); greedy decoding (`greedy_cell`); and the PRM's fusion and cascade cells, from one
Best-of-N run rescored by the PRM (`fusion_and_cascade`). Each cell is stored as it finishes (`stored_cell`)."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from reprobe_jax.io.atomic import write_json
from reprobe_jax.io.readers import read_json
from reprobe_jax.jobs.reprobe_config import ReprobeConfig
from reprobe_jax.jobs.runs import Run
from reprobe_jax.jobs.tts_config import TTSConfig, beam_shape, dvts_shape
from reprobe_jax.models import LanguageModel
from reprobe_jax.models.sampling import bucket
from reprobe_jax.prm.combine import FRACTIONS, Fusion, cascade_scores
from reprobe_jax.scorers import ScoreInputs, StepScorer, prompt_rows
from reprobe_jax.scorers import score as score_jit
from reprobe_jax.tasks import Problem
from reprobe_jax.tts import select
from reprobe_jax.tts.config import STRATEGIES, SearchConfig
from reprobe_jax.tts.result import PromptResult


@dataclasses.dataclass(frozen=True)
class Domain:
  """One domain's problems of the grid and their prompts, with what every cell of it shares."""

  lm: LanguageModel
  cfg: ReprobeConfig
  tcfg: TTSConfig
  problems: list[Problem]
  prompts: list[str]

  def search_config(self, strategy: str, budget: int, greedy: bool = False) -> SearchConfig:
    """The SearchConfig of `strategy` at `budget` (B x N = budget for beam search and DVTS)."""
    t, tcfg = self.cfg.trajectories, self.tcfg
    if strategy == "best_of_n":
      beams, n = 1, budget
    elif strategy == "beam":
      beams, n = beam_shape(budget)
    else:
      beams, n = dvts_shape(budget)
    return SearchConfig(
      strategy=strategy,
      n=n,
      beams=beams,
      max_steps=tcfg.max_steps,
      max_new_tokens=t.max_new_tokens,
      lookahead=0 if strategy == "best_of_n" else tcfg.lookahead,
      aggregation=tcfg.aggregation,
      sampling=dataclasses.replace(t.sampling, temperature=0.0 if greedy else tcfg.temperature),
      seed=self.cfg.seed,
      dedupe=tcfg.dedupe and strategy == "beam",
    )

  def summaries(self, results: Sequence[PromptResult], probabilities: bool, seconds: float) -> dict:
    """`select.summarize` of the answers picked from each problem's result, with the seconds per problem."""
    outcomes = [
      select.select(
        p, r, self.lm.tokenizer, mode=self.cfg.mode, aggregation=self.tcfg.aggregation, probabilities=probabilities
      )
      for p, r in zip(self.problems, results)
    ]
    out = select.summarize(outcomes)
    out["seconds_per_problem"] = seconds / len(self.problems)
    return out


def run_search(strategy: str, lm, scorer, prompts, scfg: SearchConfig, mode: str) -> list[PromptResult]:
  """One strategy over all prompts; each prompt's randomness is its own (seeded by its token ids), whatever the
  batch."""
  return STRATEGIES.get(strategy)(lm, scorer, prompts, scfg, mode=mode)


def timed_search(
  dom: Domain, strategy: str, scorer: StepScorer, scfg: SearchConfig
) -> tuple[list[PromptResult], float]:
  """`run_search` over the domain's prompts and its wall time in seconds."""
  t0 = time.perf_counter()
  res = run_search(strategy, dom.lm, scorer, dom.prompts, scfg, dom.cfg.mode)
  return res, time.perf_counter() - t0


def stored_cell(run: Run, key: str, make: Callable[[], dict]) -> dict:
  """A grid cell's stored summary, made (and stored atomically) if missing."""
  path = run.path("cells", f"{key}.json")
  if os.path.exists(path):
    return read_json(path, "tts cell")
  cell = make()
  write_json(path, cell)
  return cell


def greedy_cell(dom: Domain, scorer: StepScorer) -> dict:
  """Greedy decoding: one trajectory per problem (the same at every budget)."""
  res, seconds = timed_search(dom, "best_of_n", scorer, dom.search_config("best_of_n", 1, greedy=True))
  return {"1": dom.summaries(res, select.is_probability_scorer(scorer), seconds)}


def strategy_cell(dom: Domain, strategy: str, scorer: StepScorer) -> dict:
  """{budget: summary} of a strategy with a scorer. Best-of-N runs once at the largest budget (the smaller budgets
  are its first k trajectories, `select.first_k`); beam search and DVTS run at every budget above 1."""
  probabilities = select.is_probability_scorer(scorer)
  budgets = dom.tcfg.budgets
  cell = {}
  if strategy == "best_of_n":
    res, seconds = timed_search(dom, strategy, scorer, dom.search_config(strategy, max(budgets)))
    for b in budgets:
      cell[str(b)] = dom.summaries([select.first_k(r, b) for r in res], probabilities, seconds * b / max(budgets))
    return cell
  for b in budgets:
    if b == 1:  # B = N = 1 has nothing to choose between: it is one sampled trajectory (Best-of-1)
      continue
    res, seconds = timed_search(dom, strategy, scorer, dom.search_config(strategy, b))
    cell[str(b)] = dom.summaries(res, probabilities, seconds)
  return cell


def rescore(
  scorer: StepScorer, prompt_ids: Sequence[Sequence[int]], results: Sequence[PromptResult]
) -> list[list[np.ndarray]]:
  """[prompt][candidate] the scorer's step scores [S] of every candidate of every prompt, on its whole text (prompt
  + response; for a scorer that reads the token ids and the prompt, such as the PRM, not the probe), one prompt's
  candidates per jitted call in bucketed shapes."""
  out = []
  for ids, res in zip(prompt_ids, results):
    cands = res.candidates
    t = bucket(max([len(c.response_ids) for c in cands] + [1]))
    s = bucket(max([len(c.steps) for c in cands] + [1]), minimum=4)
    tokens = np.zeros((len(cands), t), np.int32)  # [candidates, T]
    mask = np.zeros((len(cands), t), bool)
    spans = np.zeros((len(cands), s, 2), np.int32)  # [candidates, S, 2]
    for i, c in enumerate(cands):
      tokens[i, : len(c.response_ids)], mask[i, : len(c.response_ids)] = c.response_ids, True
      if c.steps:
        spans[i, : len(c.steps)] = c.steps
    pids, pmask = prompt_rows([list(ids)], len(cands), len(cands))
    inputs = ScoreInputs(
      token_mask=jnp.asarray(mask),
      tokens=jnp.asarray(tokens),
      prompt_ids=jnp.asarray(pids),
      prompt_mask=jnp.asarray(pmask),
    )
    got = np.asarray(score_jit(scorer, inputs, jnp.asarray(spans)))
    out.append([got[i, : len(c.steps)] for i, c in enumerate(cands)])
  return out


def with_scores(results: Sequence[PromptResult], scores: Sequence[Sequence[np.ndarray]]) -> list[PromptResult]:
  """The results with every candidate's step scores replaced ([prompt][candidate] arrays of its steps)."""
  return [
    dataclasses.replace(
      r,
      candidates=tuple(
        dataclasses.replace(c, step_scores=tuple(float(x) for x in s)) for c, s in zip(r.candidates, per)
      ),
    )
    for r, per in zip(results, scores)
  ]


@dataclasses.dataclass(frozen=True)
class FusionCells:
  """The PRM's cells of one domain: Best-of-N by the fused step scores at every budget, and the cascade."""

  fusion: dict
  cascade: dict


def fusion_and_cascade(dom: Domain, probe: StepScorer, prm: StepScorer, fusion: Fusion) -> FusionCells:
  """One Best-of-N run at the largest budget with the probe (the probe cell's candidates: same seeds), its
  candidates rescored by the PRM on their whole texts: the fusion cell (every budget selected by the fused step
  scores) and the cascade cell (at the largest budget, accuracy as the PRM is asked about the fraction f of all the
  domain's candidate steps where the probe is least certain, its score replacing the probe's ('prm') or fused with
  it ('fusion'))."""
  top = max(dom.tcfg.budgets)
  res, seconds = timed_search(dom, "best_of_n", probe, dom.search_config("best_of_n", top))
  p_scores = [[c.scores for c in r.candidates] for r in res]
  q_scores = rescore(prm, dom.lm.encode(dom.prompts), res)
  fused = [[fusion(a, b) for a, b in zip(pa, qa)] for pa, qa in zip(p_scores, q_scores)]
  fused_res = with_scores(res, fused)
  fusion_cell = {
    str(b): dom.summaries([select.first_k(r, b) for r in fused_res], True, seconds * b / top) for b in dom.tcfg.budgets
  }
  sizes = [[len(x) for x in row] for row in p_scores]
  p_flat, q_flat = _flat(p_scores), _flat(q_scores)
  ok = np.isfinite(p_flat) & np.isfinite(q_flat)
  cascade = {"budget": top, "fractions": list(FRACTIONS), "steps": int(ok.sum())}
  for kind, combine in (("prm", None), ("fusion", fusion)):
    acc, calls = [], []
    for f in FRACTIONS:
      mixed, asked = p_flat.copy(), np.zeros(len(p_flat), bool)
      mixed[ok], asked[ok] = cascade_scores(p_flat[ok], q_flat[ok], f, combine=combine)
      acc.append(dom.summaries(with_scores(res, _unflat(mixed, sizes)), True, seconds)["best"])
      calls.append(float(asked[ok].mean()) if ok.any() else 0.0)
    cascade[kind] = {"accuracy": acc, "prm_calls": calls}
  return FusionCells(fusion_cell, cascade)


def _flat(per: list[list[np.ndarray]]) -> np.ndarray:
  """[prompt][candidate] step scores as one array, prompt by prompt, candidate by candidate."""
  return np.concatenate([x for row in per for x in row] + [np.zeros(0)])


def _unflat(v: np.ndarray, sizes: list[list[int]]) -> list[list[np.ndarray]]:
  """`_flat`'s inverse for the [prompt][candidate] step counts `sizes`."""
  out, k = [], 0
  for row in sizes:
    out.append([])
    for n in row:
      out[-1].append(v[k : k + n])
      k += n
  return out
