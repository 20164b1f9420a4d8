"""The cells of the test-time-scaling grid: one strategy with one step scorer over one domain's problems, summarised
at every budget (`strategy_cell`); greedy decoding (`greedy_cell`); and the PRM's fusion and cascade cells, from one
Best-of-N run rescored by the PRM (`fusion_and_cascade`). Each cell is stored as it finishes (`stored_cell`)."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.io.atomic import write_json
from reprobe_jax.io.readers import read_json, shown
from reprobe_jax.io.seal import is_sealed
from reprobe_jax.jobs.reprobe_config import ReprobeConfig
from reprobe_jax.jobs.runs import Run
from reprobe_jax.jobs.tts_config import MIN_SEARCH_BUDGET, TTSConfig, beam_shape, dvts_shape
from reprobe_jax.models import LanguageModel
from reprobe_jax.models.sampling import bucket
from reprobe_jax.prm.combine import FRACTIONS, Fusion, cascade_scores
from reprobe_jax.scorers import ScoreInputs, StepScorer, prompt_rows
from reprobe_jax.scorers import score as score_jit
from reprobe_jax.tasks import Problem
from reprobe_jax.tts import select
from reprobe_jax.tts.config import STRATEGIES, SearchConfig
from reprobe_jax.tts.result import PromptResult


def search_config(
  cfg: ReprobeConfig, tcfg: TTSConfig, strategy: str, budget: int, greedy: bool = False
) -> SearchConfig:
  """The SearchConfig of `strategy` at `budget` (B x N = budget for beam search and DVTS)."""
  t = cfg.trajectories
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
    seed=cfg.seed,
    dedupe=tcfg.dedupe and strategy == "beam",
  )


def check_search_configs(cfg: ReprobeConfig, tcfg: TTSConfig) -> None:
  """Every SearchConfig the grid will make (each strategy at each budget it runs, and greedy), made once before
  anything is created, so a setting no search can take fails first, naming the grid cell it would have failed in."""
  cells = [("best_of_n", 1, True)] + [
    (s, b, False)
    for s in tcfg.strategies
    for b in (tcfg.budgets if s == "best_of_n" else searched_budgets(tcfg.budgets))
  ]
  for strategy, budget, greedy in cells:
    try:
      search_config(cfg, tcfg, strategy, budget, greedy)
    except ConfigError as e:
      raise ConfigError(f"config.tts: {'greedy' if greedy else strategy} at budget {budget}: {e}") from None


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
    return search_config(self.cfg, self.tcfg, strategy, budget, greedy)

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


def stored_cell(run: Run, key: str, make: Callable[[], dict], check: Callable[[str, dict], None]) -> dict:
  """A grid cell's stored summary, made (and stored atomically, sealed) if missing or unsealed (a write cut
  short); read back sealed and checked by `check(path, cell)` (`check_cell`, `check_cascade`): DataFormatError
  naming the file and the field when it was changed after it was written or holds a value no cell can hold."""
  path = run.path("cells", f"{key}.json")
  if is_sealed(path):
    cell = read_json(path, "tts cell", sealed=True)
    check(path, cell)
    return cell
  cell = make()
  write_json(path, cell, seal=True)
  return cell


# What a stored cell holds: per budget, `select.summarize`'s summary and the seconds per problem.
_FRACTIONS = select.SELECTIONS  # accuracies of each selection, in [0, 1]
_COUNTS = {"problems": 1, "mixed_problems": 0}  # ints >= the bound
_AMOUNTS = ("sampled_steps", "generated_tokens", "seconds_per_problem")  # finite numbers >= 0
SUMMARY_KEYS = frozenset(_FRACTIONS) | set(_COUNTS) | set(_AMOUNTS) | {"selection_auroc"}


def _bad(path: str, field: str, expected: str, value) -> DataFormatError:
  return DataFormatError(f"{path}: {field}: expected {expected}, found {shown(value)}")


def _fraction(path: str, field: str, value, nan: bool = False) -> None:
  """DataFormatError unless `value` is a number in [0, 1] (or NaN, where `nan`)."""
  number = isinstance(value, (int, float)) and not isinstance(value, bool)
  if not (number and (0 <= value <= 1 or (nan and math.isnan(value)))):
    raise _bad(path, field, "a number in [0, 1]" + (" or NaN" if nan else ""), value)


def _mapping(path: str, field: str, value, keys) -> dict:
  """`value` if it is a JSON object with exactly the keys `keys`; DataFormatError naming the missing or extra ones."""
  if not isinstance(value, dict):
    raise _bad(path, field, "a JSON object", value)
  missing, extra = sorted(set(keys) - set(value)), sorted(set(value) - set(keys))
  if missing or extra:
    raise DataFormatError(f"{path}: {field}: expected the keys {sorted(keys)}; missing {missing}, unexpected {extra}")
  return value


def check_summary(path: str, field: str, summary) -> None:
  """DataFormatError naming `path` and `field.<key>` unless `summary` is one budget's summary: accuracies in [0, 1],
  selection_auroc in [0, 1] or NaN, counts non-negative ints (at least one problem), costs finite and >= 0."""
  _mapping(path, field, summary, SUMMARY_KEYS)
  for k in _FRACTIONS:
    _fraction(path, f"{field}.{k}", summary[k])
  _fraction(path, f"{field}.selection_auroc", summary["selection_auroc"], nan=True)
  for k, low in _COUNTS.items():
    v = summary[k]
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
      raise _bad(path, f"{field}.{k}", f"an int >= {low}", v)
  for k in _AMOUNTS:
    v = summary[k]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
      raise _bad(path, f"{field}.{k}", "a finite number >= 0", v)


def check_cell(budgets: Sequence[int]) -> Callable[[str, dict], None]:
  """The check of a cell that holds a summary at each of `budgets` (and no other key)."""

  def check(path: str, cell: dict) -> None:
    _mapping(path, "budgets", cell, [str(b) for b in budgets])
    for b in budgets:
      check_summary(path, str(b), cell[str(b)])

  return check


def check_cascade(budget: int) -> Callable[[str, dict], None]:
  """The check of a cascade cell made at `budget`: its fractions, step count, and per kind ('prm', 'fusion') one
  accuracy and one share of PRM calls in [0, 1] per fraction."""

  def check(path: str, cell: dict) -> None:
    _mapping(path, "cascade", cell, ["budget", "fractions", "steps", "prm", "fusion"])
    if cell["budget"] != budget or isinstance(cell["budget"], bool):
      raise _bad(path, "budget", f"the largest budget {budget}", cell["budget"])
    if cell["fractions"] != list(FRACTIONS):
      raise _bad(path, "fractions", f"{list(FRACTIONS)}", cell["fractions"])
    if isinstance(cell["steps"], bool) or not isinstance(cell["steps"], int) or cell["steps"] < 0:
      raise _bad(path, "steps", "an int >= 0", cell["steps"])
    for kind in ("prm", "fusion"):
      for k, v in _mapping(path, kind, cell[kind], ["accuracy", "prm_calls"]).items():
        if not isinstance(v, list) or len(v) != len(FRACTIONS):
          raise _bad(path, f"{kind}.{k}", f"a list of {len(FRACTIONS)} numbers (one per fraction)", v)
        for i, x in enumerate(v):
          _fraction(path, f"{kind}.{k}[{i}]", x)

  return check


def greedy_cell(dom: Domain, scorer: StepScorer) -> dict:
  """Greedy decoding: one trajectory per problem (the same at every budget)."""
  res, seconds = timed_search(dom, "best_of_n", scorer, dom.search_config("best_of_n", 1, greedy=True))
  return {"1": dom.summaries(res, select.is_probability_scorer(scorer), seconds)}


def strategy_cell(dom: Domain, strategy: str, scorer: StepScorer) -> dict:
  """{budget: summary} of a strategy with a scorer. Best-of-N runs once at the largest budget (the smaller budgets
  are its first k trajectories, `select.first_k`); beam search and DVTS at every budget of `searched_budgets`."""
  probabilities = select.is_probability_scorer(scorer)
  budgets = dom.tcfg.budgets
  cell = {}
  if strategy == "best_of_n":
    res, seconds = timed_search(dom, strategy, scorer, dom.search_config(strategy, max(budgets)))
    for b in budgets:
      cell[str(b)] = dom.summaries([select.first_k(r, b) for r in res], probabilities, seconds * b / max(budgets))
    return cell
  for b in searched_budgets(budgets):
    res, seconds = timed_search(dom, strategy, scorer, dom.search_config(strategy, b))
    cell[str(b)] = dom.summaries(res, probabilities, seconds)
  return cell


def searched_budgets(budgets: Sequence[int]) -> list[int]:
  """The budgets beam search and DVTS run at: B x N = 1 has nothing to choose between (it is one sampled
  trajectory, Best-of-1), so those below `MIN_SEARCH_BUDGET` are left out (`TTSConfig` refuses a grid with none)."""
  return [b for b in budgets if b >= MIN_SEARCH_BUDGET]


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
