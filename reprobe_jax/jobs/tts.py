"""The test-time-scaling evaluation (issue 14): accuracy per strategy x scorer at equal sample budgets.

For each domain (in domain: the probes' training domain; out of domain: the held-out ones) `problems` test problems
of the ReProbe split (spread evenly over its difficulties) are solved by greedy decoding, Best-of-N (one run at the largest budget; the
smaller budgets are its first k trajectories, `select.first_k`), majority and score-weighted votes, pass@N, and
step-level beam search and DVTS at every budget b with B x N = b (so every strategy samples about b steps per step
of a trajectory; the table reports the steps each really sampled). The probes are the ReProbe job's, reused from its
run folder. Each cell (domain, scorer, strategy, budget) is stored as it finishes, so an interrupted job resumes.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from reprobe_jax.jobs import reprobe as pipeline
from reprobe_jax.jobs import runs
from reprobe_jax.fields import Int, OneOf, Real, Seq, check_fields, field_name
from reprobe_jax.errors import ConfigError
from reprobe_jax.models import LanguageModel
from reprobe_jax.io.readers import read_json
from reprobe_jax.jobs.runs import Progress, Run, no_progress
from reprobe_jax.models.sampling import bucket
from reprobe_jax.prm import report as prm_report
from reprobe_jax.prm.combine import FRACTIONS, Fusion, cascade_scores
from reprobe_jax.prm.train import PRMTrainConfig
from reprobe_jax.scorers import (BASELINES, PRMScorer, ProbeScorer, ScoreInputs, StepScorer, UncertaintyScorer,
                                 prompt_rows)
from reprobe_jax.scorers import score as score_jit
from reprobe_jax.trajectories import prompt_text
from reprobe_jax.tts import select
from reprobe_jax.tts.config import AGGREGATIONS, STRATEGIES, SearchConfig
from reprobe_jax.tts.result import PromptResult

DVTS_CANDIDATES = 4  # N per subtree; the budget's rest is subtrees (search-and-learn's DVTS default shape)


class ScorerName:
  """A config rule: a baseline name (scorers.BASELINES), 'prm' (the PRM trained by the ReProbe job, config.prm) or
  'probe[<feature set>]'."""

  def ok(self, v) -> bool:
    return isinstance(v, str) and (v in BASELINES or v == "prm" or (v.startswith("probe[") and v.endswith("]")))

  def __str__(self) -> str:
    return f"one of {BASELINES}, 'prm' or 'probe[<feature set>]'"


@dataclasses.dataclass(frozen=True)
class TTSConfig:
  """The grid. problems: per domain, spread evenly over the ReProbe split (all difficulties); budgets: trajectories per problem for
  Best-of-N and the votes, B x N for beam search and DVTS; scorers: the step scorers each strategy is run with;
  aggregation: the trajectory score that picks Best-of-N's answer and ranks finished beams; max_steps: steps per
  trajectory; lookahead: greedy steps before a candidate is scored (beam, DVTS); temperature: of every sampled
  strategy (top-k and top-p are the ReProbe trajectories'); split: 'test' for the reported numbers, 'val' to
  choose settings (the test split is never used to choose anything); dedupe: beam search keeps distinct
  trajectories (`SearchConfig.dedupe`)."""

  problems: int = 60
  domains: tuple[str, ...] = ("arithmetic", "planning", "qa")
  scorers: tuple[str, ...] = ("probe[attn+logit]", "probe[hidden]", "maxprob", "perplexity", "mean_entropy",
                              "random")
  strategies: tuple[str, ...] = STRATEGIES.names()  # ('best_of_n', 'beam', 'dvts')
  budgets: tuple[int, ...] = (1, 2, 4, 8, 16)
  aggregation: str = "min"
  max_steps: int = 12
  lookahead: int = 0
  temperature: float = 1.0
  split: str = "test"
  dedupe: bool = False

  def __post_init__(self):
    check_fields(self, {"problems": Int(1), "domains": Seq(OneOf(pipeline.DOMAINS)), "scorers": Seq(ScorerName()),
                        "strategies": Seq(OneOf(STRATEGIES.names())), "budgets": Seq(Int(1)),
                        "aggregation": OneOf(AGGREGATIONS), "max_steps": Int(1), "lookahead": Int(0),
                        "temperature": Real(0.0, low_open=True), "split": OneOf(("val", "test")),
                        "dedupe": OneOf((False, True))})
    if tuple(sorted(self.budgets)) != self.budgets:
      raise ConfigError(f"{field_name(self, 'budgets')}: expected increasing budgets, got {self.budgets}")


def beam_shape(budget: int) -> tuple[int, int]:
  """(B, N) with B x N = budget and B <= N as close as powers of two allow: 4 -> (2, 2), 8 -> (2, 4), 16 -> (4, 4).
  A budget that is not a power of two gets B = 1."""
  if budget & (budget - 1):
    return 1, budget
  b = 1 << ((budget.bit_length() - 1) // 2)
  return b, budget // b


def dvts_shape(budget: int) -> tuple[int, int]:
  """(subtrees B, candidates N) with B x N = budget: N = DVTS_CANDIDATES where the budget allows."""
  n = DVTS_CANDIDATES if budget % DVTS_CANDIDATES == 0 else budget
  return budget // n, n


def tts_config_from_dict(d) -> TTSConfig:
  from reprobe_jax.fields import plain, replace_fields
  return replace_fields(TTSConfig(), plain(d), root="config.tts")


def check_prm(tcfg: TTSConfig, prm: PRMTrainConfig | None) -> None:
  """ConfigError when the grid names 'prm' but the run has no PRM config (config.prm.enabled)."""
  if "prm" in tcfg.scorers and prm is None:
    raise ConfigError("config.tts.scorers names 'prm', but config.prm.enabled is False: the PRM baseline is the one "
                      "the ReProbe job trains (config.prm)")


def scorers_for(lm: LanguageModel, cfg: pipeline.ReprobeConfig, tcfg: TTSConfig, workdir: str, *,
                prm: PRMTrainConfig | None = None, progress: Progress | None = None) -> dict[str, StepScorer]:
  """Every scorer the grid names: the probes trained by the ReProbe job in `workdir` (trained there first if
  missing), the PRM it trains (with `prm`), the uncertainty baselines."""
  check_prm(tcfg, prm)
  wanted = [s[len("probe["):-1] for s in tcfg.scorers if s.startswith("probe[")]
  unknown = sorted(set(wanted) - set(cfg.feature_sets))
  if unknown:
    raise ConfigError(f"config.tts.scorers: probes {unknown} are not among config.feature_sets {cfg.feature_sets}")
  out: dict[str, StepScorer] = {}
  if wanted:
    for name, bundle in pipeline.probe_bundles(lm, cfg, workdir, tuple(wanted), progress=progress).items():
      out[f"probe[{name}]"] = ProbeScorer(bundle)
  for name in tcfg.scorers:
    if name in BASELINES:
      out[name] = UncertaintyScorer.create(name, seed=cfg.seed)
    elif name == "prm":
      out[name] = PRMScorer(pipeline.train_prm_stage(lm, cfg, prm, workdir, progress=progress))
  return out


def rescore(scorer: StepScorer, prompt_ids: Sequence[Sequence[int]], results: Sequence[PromptResult]
            ) -> list[list[np.ndarray]]:
  """[prompt][candidate] the scorer's step scores [S] of every candidate of every prompt, on its whole text (prompt
  + response; for a scorer that reads the token ids and the prompt, such as the PRM, not the probe), one prompt's
  candidates per jitted call in bucketed shapes."""
  out = []
  for ids, res in zip(prompt_ids, results):
    cands = res.candidates
    t = bucket(max([len(c.response_ids) for c in cands] + [1]))
    s = bucket(max([len(c.steps) for c in cands] + [1]), minimum=4)
    tokens = np.zeros((len(cands), t), np.int32)
    mask = np.zeros((len(cands), t), bool)
    spans = np.zeros((len(cands), s, 2), np.int32)
    for i, c in enumerate(cands):
      tokens[i, :len(c.response_ids)], mask[i, :len(c.response_ids)] = c.response_ids, True
      if c.steps:
        spans[i, :len(c.steps)] = c.steps
    pids, pmask = prompt_rows([list(ids)], len(cands), len(cands))
    inputs = ScoreInputs(token_mask=jnp.asarray(mask), tokens=jnp.asarray(tokens), prompt_ids=jnp.asarray(pids),
                         prompt_mask=jnp.asarray(pmask))
    got = np.asarray(score_jit(scorer, inputs, jnp.asarray(spans)))
    out.append([got[i, :len(c.steps)] for i, c in enumerate(cands)])
  return out


def with_scores(results: Sequence[PromptResult], scores: Sequence[Sequence[np.ndarray]]) -> list[PromptResult]:
  """The results with every candidate's step scores replaced ([prompt][candidate] arrays of its steps)."""
  return [dataclasses.replace(r, candidates=tuple(dataclasses.replace(c, step_scores=tuple(float(x) for x in s))
                                                  for c, s in zip(r.candidates, per)))
          for r, per in zip(results, scores)]


def fusion_and_cascade(problems, prompts, lm, probe: StepScorer, prm: StepScorer, fusion: Fusion, cfg, tcfg, mode
                       ) -> tuple[dict, dict]:
  """One Best-of-N run at the largest budget with the probe (the probe cell's candidates: same seeds), its
  candidates rescored by the PRM on their whole texts; returns (the fusion cell: every budget selected by the
  fused step scores, the cascade cell: at the largest budget, accuracy as the PRM is asked about the fraction f
  of all the domain's candidate steps where the probe is least certain, its score replacing the probe's ('prm')
  or fused with it ('fusion'))."""
  t0 = time.perf_counter()
  top = max(tcfg.budgets)
  res = _run("best_of_n", lm, probe, prompts, _search_config("best_of_n", top, cfg, tcfg), mode)
  seconds = time.perf_counter() - t0
  p_scores = [[c.scores for c in r.candidates] for r in res]
  q_scores = rescore(prm, lm.encode(prompts), res)
  fused = [[fusion(a, b) for a, b in zip(pa, qa)] for pa, qa in zip(p_scores, q_scores)]
  fused_res = with_scores(res, fused)
  fusion_cell = {str(b): _summaries(problems, [select.first_k(r, b) for r in fused_res], lm, mode,
                                    tcfg.aggregation, True, seconds * b / top) for b in tcfg.budgets}
  flat = lambda per: np.concatenate([x for row in per for x in row] + [np.zeros(0)])
  sizes = [[len(x) for x in row] for row in p_scores]
  p_flat, q_flat = flat(p_scores), flat(q_scores)

  def unflat(v):
    out, k = [], 0
    for row in sizes:
      out.append([])
      for n in row:
        out[-1].append(v[k:k + n])
        k += n
    return out

  ok = np.isfinite(p_flat) & np.isfinite(q_flat)
  cascade = {"budget": top, "fractions": list(FRACTIONS), "steps": int(ok.sum())}
  for kind, combine in (("prm", None), ("fusion", fusion)):
    acc, calls = [], []
    for f in FRACTIONS:
      mixed, asked = p_flat.copy(), np.zeros(len(p_flat), bool)
      mixed[ok], asked[ok] = cascade_scores(p_flat[ok], q_flat[ok], f, combine=combine)
      acc.append(_summaries(problems, with_scores(res, unflat(mixed)), lm, mode, tcfg.aggregation, True,
                            seconds)["best"])
      calls.append(float(asked[ok].mean()) if ok.any() else 0.0)
    cascade[kind] = {"accuracy": acc, "prm_calls": calls}
  return fusion_cell, cascade


def _search_config(strategy: str, budget: int, cfg: pipeline.ReprobeConfig, tcfg: TTSConfig,
                   greedy: bool = False) -> SearchConfig:
  t = cfg.trajectories
  if strategy == "best_of_n":
    beams, n = 1, budget
  elif strategy == "beam":
    beams, n = beam_shape(budget)
  else:
    beams, n = dvts_shape(budget)
  return SearchConfig(strategy=strategy, n=n, beams=beams, max_steps=tcfg.max_steps, max_new_tokens=t.max_new_tokens,
                      lookahead=0 if strategy == "best_of_n" else tcfg.lookahead, aggregation=tcfg.aggregation,
                      temperature=0.0 if greedy else tcfg.temperature, top_k=t.top_k, top_p=t.top_p, seed=cfg.seed,
                      dedupe=tcfg.dedupe and strategy == "beam")


def _run(strategy: str, lm, scorer, prompts, scfg: SearchConfig, mode: str) -> list[PromptResult]:
  """One strategy over all prompts; each prompt's randomness is its own (seeded by its token ids), whatever the
  batch."""
  return STRATEGIES.get(strategy)(lm, scorer, prompts, scfg, mode=mode)


def _cell(run: Run, key: str, make) -> dict:
  """A grid cell's stored summary, made (and stored atomically) if missing."""
  path = run.path("cells", f"{key}.json")
  if os.path.exists(path):
    return read_json(path, "tts cell")
  cell = make()
  runs.write_json(path, cell)
  return cell


def _summaries(problems, results, lm, mode, aggregation, probabilities, seconds) -> dict:
  outcomes = [select.select(p, r, lm.tokenizer, mode=mode, aggregation=aggregation, probabilities=probabilities)
              for p, r in zip(problems, results)]
  out = select.summarize(outcomes)
  out["seconds_per_problem"] = seconds / len(problems)
  return out


def evaluate(lm: LanguageModel, cfg: pipeline.ReprobeConfig, tcfg: TTSConfig, workdir: str, *,
             prm: PRMTrainConfig | None = None, progress: Progress | None = None) -> dict:
  """Runs (or resumes) the grid in `<workdir>/tts/<key>/`; writes metrics.json, table.md and accuracy.png there and
  returns the metrics: {domain: {method: {budget: summary}}} under 'results', plus the run's settings. With the PRM
  and a probe among the scorers and Best-of-N among the strategies, also 'best_of_n[fusion[<set>]]' (the fusion
  the ReProbe job fitted on its val split) and the cascade (metrics['cascade'], cascade.png), from the probe its val
  split ranks best."""
  tick = progress or no_progress
  scorers = scorers_for(lm, cfg, tcfg, workdir, prm=prm, progress=progress)
  combo = None
  if "prm" in scorers and "best_of_n" in tcfg.strategies and any(k.startswith("probe[") for k in scorers):
    stored = os.path.join(pipeline.prm_folder(workdir, prm), "step_scores.npz")
    if not os.path.exists(stored):  # the ReProbe job's report writes them (its other stages are cached by now)
      pipeline.evaluate(lm, cfg, workdir, prm=prm)
    combined = prm_report.combine(prm_report.read_step_scores(stored), list(cfg.train_domains))
    name = combined.cascade_probe
    if name not in scorers:
      name = next(k for k in scorers if k.startswith("probe["))
    combo = (name, combined.fusions[name[len("probe["):-1]])
  # The folder is keyed by what every cell depends on; a cell's own file names its strategy and scorer (and the
  # PRM's config), so adding a scorer or a strategy to the grid reuses the cells already made.
  key = runs.run_key({k: v for k, v in dataclasses.asdict(tcfg).items() if k not in ("scorers", "strategies")})
  tag = {name: name if name != "prm" else f"prm.{runs.run_key(dataclasses.asdict(prm))}" for name in scorers}
  run = Run(os.path.join(workdir, "tts", key))
  os.makedirs(run.path("cells"), exist_ok=True)
  test = pipeline.split_problems(cfg)[tcfg.split]
  mode = cfg.mode
  results: dict[str, dict[str, dict[str, dict]]] = {}
  cascades: dict[str, dict] = {}
  total = len(tcfg.domains) * (1 + len(tcfg.scorers) * len(tcfg.strategies))
  done = 0
  for domain in tcfg.domains:
    every = [p for p in test if p.domain == domain]
    # An even spread over the split (it lists difficulty 1, then 2, then 3), not its first problems.
    problems = [every[i * len(every) // tcfg.problems] for i in range(min(tcfg.problems, len(every)))]
    if not problems:
      raise ConfigError(f"config.tts.domains: the {tcfg.split} split has no {domain!r} problems")
    prompts = [prompt_text(lm, p, mode, cfg.trajectories.few_shot, cfg.trajectories.first_step,
                           cfg.trajectories.goal_mark) for p in problems]
    per = results.setdefault(domain, {})
    any_scorer = next(iter(scorers.values()))

    def greedy():
      t0 = time.perf_counter()
      res = _run("best_of_n", lm, any_scorer, prompts, _search_config("best_of_n", 1, cfg, tcfg, greedy=True), mode)
      return {"1": _summaries(problems, res, lm, mode, tcfg.aggregation,
                              select.is_probability_scorer(any_scorer), time.perf_counter() - t0)}

    per["greedy"] = _cell(run, f"{domain}.greedy", greedy)
    done += 1
    tick(f"tts {domain}", done, total)
    for sname, scorer in scorers.items():
      probabilities = select.is_probability_scorer(scorer)
      for strategy in tcfg.strategies:
        def make(strategy=strategy, scorer=scorer, probabilities=probabilities):
          cell = {}
          if strategy == "best_of_n":  # one run at the largest budget; smaller budgets are its first k
            t0 = time.perf_counter()
            res = _run(strategy, lm, scorer, prompts, _search_config(strategy, max(tcfg.budgets), cfg, tcfg), mode)
            seconds = time.perf_counter() - t0
            for b in tcfg.budgets:
              cut = [select.first_k(r, b) for r in res]
              cell[str(b)] = _summaries(problems, cut, lm, mode, tcfg.aggregation, probabilities,
                                        seconds * b / max(tcfg.budgets))
            return cell
          for b in tcfg.budgets:
            if b == 1:  # B = N = 1 has nothing to choose between: it is one sampled trajectory (Best-of-1)
              continue
            t0 = time.perf_counter()
            res = _run(strategy, lm, scorer, prompts, _search_config(strategy, b, cfg, tcfg), mode)
            cell[str(b)] = _summaries(problems, res, lm, mode, tcfg.aggregation, probabilities,
                                      time.perf_counter() - t0)
          return cell

        per[f"{strategy}[{sname}]"] = _cell(run, f"{domain}.{strategy}.{tag[sname]}", make)
        done += 1
        tick(f"tts {domain}", done, total)
    if combo is not None:
      pname, fusion = combo
      made = {}

      def both(key):
        if not made:
          made["fusion"], made["cascade"] = fusion_and_cascade(problems, prompts, lm, scorers[pname], scorers["prm"],
                                                               fusion, cfg, tcfg, mode)
        return made[key]

      fname = f"fusion[{pname[len('probe['):-1]}]"
      per[f"best_of_n[{fname}]"] = _cell(run, f"{domain}.best_of_n.{fname}.{tag['prm']}", lambda: both("fusion"))
      cascades[domain] = {"probe": pname, **_cell(run, f"{domain}.cascade.{fname}.{tag['prm']}",
                                                  lambda: both("cascade"))}
  from reprobe_jax.eval.machine import describe
  from reprobe_jax.jobs import tts_report as report
  metrics = {"results": results, "config": dataclasses.asdict(tcfg), "train_domains": list(cfg.train_domains),
             "machine": str(describe())}
  if cascades:
    metrics["cascade"] = cascades
  runs.write_json(run.path("metrics.json"), metrics)
  from reprobe_jax.io.atomic import atomic_open
  with atomic_open(run.path("table.md")) as f:
    f.write(report.table_markdown(metrics))
  report.plot_budgets(metrics, run.path("accuracy.png"))
  if cascades:
    report.plot_cascade(metrics, run.path("cascade.png"))
  metrics["directory"] = run.directory
  return metrics
