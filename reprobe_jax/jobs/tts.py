"""The test-time-scaling evaluation: accuracy per strategy x scorer at equal sample budgets (docs/method.md,
"Test-time scaling: the evaluation job").

For each domain (in domain: the probes' training domain; out of domain: the held-out ones) `problems` test problems
of the ReProbe split (spread evenly over its difficulties) are solved by greedy decoding, Best-of-N (one run at the
largest budget; the smaller budgets are its first k trajectories, `select.first_k`), majority and score-weighted
votes, pass@N, and step-level beam search and DVTS at every budget b with B x N = b (so every strategy samples about
b steps per step of a trajectory; the table reports the steps each really sampled).

The job is a graph of stages over the ReProbe run of the same run folder, whose probes and PRM are its step
scorers: scorers -> fusion (with the PRM: the fusion the ReProbe job fitted on its val split) -> grid -> report.
Each cell (domain, scorer, strategy, budget) is stored as it finishes, so an interrupted job resumes.
"""

from __future__ import annotations

import dataclasses
import os


from reprobe_jax.errors import ConfigError
from reprobe_jax.eval.machine import describe
from reprobe_jax.io.atomic import atomic_open, write_json
from reprobe_jax.io.seal import is_sealed
from reprobe_jax.jobs import reprobe
from reprobe_jax.jobs import tts_report as report_lib
from reprobe_jax.jobs.graph import Graph, GraphRun, Stage
from reprobe_jax.jobs.reprobe_config import ReprobeConfig, prm_folder, split_problems
from reprobe_jax.jobs.reprobe_records import PRM_ID, ScorerId
from reprobe_jax.jobs.runs import Progress, Run, no_progress, run_key
from reprobe_jax.jobs.tts_cells import (
  Domain,
  FusionCells,
  check_cascade,
  check_cell,
  check_search_configs,
  fusion_and_cascade,
  greedy_cell,
  searched_budgets,
  stored_cell,
  strategy_cell,
)
from reprobe_jax.jobs.tts_config import TTSConfig, check_prm, grid_domains
from reprobe_jax.models import LanguageModel
from reprobe_jax.prm import report as prm_report
from reprobe_jax.prm.combine import Fusion
from reprobe_jax.prm.train import PRMTrainConfig
from reprobe_jax.scorers import BASELINES, PRMScorer, ProbeScorer, StepScorer, UncertaintyScorer
from reprobe_jax.trajectories import prompt_text
from reprobe_jax.tts.config import STRATEGIES


@dataclasses.dataclass(frozen=True)
class TTSJob:
  """What every stage reads: the target, the ReProbe config and its run (`reprobe_run`: where the probes and the
  PRM come from), the grid, the PRM's training config (None: no PRM), the grid's folder and the progress callback."""

  lm: LanguageModel
  cfg: ReprobeConfig
  tcfg: TTSConfig
  reprobe_run: GraphRun
  prm: PRMTrainConfig | None
  folder: str
  tick: Progress = no_progress


@dataclasses.dataclass(frozen=True)
class FusionPick:
  """The probe the PRM's fusion and cascade cells start from (the one the ReProbe job's val split ranks best, when
  the grid has it) and its fusion with the PRM, fitted on val."""

  probe: ScorerId
  fusion: Fusion


@dataclasses.dataclass(frozen=True)
class Grid:
  """Every cell's summaries, {domain: {'<strategy>[<scorer>]' or 'greedy': {budget: summary}}}, and with the PRM
  each domain's cascade."""

  results: dict[str, dict[str, dict]]
  cascades: dict[str, dict]


def scorers(job: TTSJob) -> dict[ScorerId, StepScorer]:
  """Every scorer the grid names: the probes the ReProbe run trained (trained first if missing), the PRM it trains
  (with `prm`), the uncertainty baselines."""
  wanted = [sid.feature_set for sid in job.tcfg.scorer_ids if sid.kind == "probe"]
  unknown = sorted(set(wanted) - set(job.cfg.feature_sets))
  if unknown:
    raise ConfigError(f"config.tts.scorers: probes {unknown} are not among config.feature_sets {job.cfg.feature_sets}")
  out: dict[ScorerId, StepScorer] = {}
  if wanted:
    for name, bundle in reprobe.bundles(job.reprobe_run, wanted).items():
      out[ScorerId.probe(name)] = ProbeScorer(bundle)
  for sid in job.tcfg.scorer_ids:
    if str(sid) in BASELINES:
      out[sid] = UncertaintyScorer.create(str(sid), seed=job.cfg.seed)
    elif sid == PRM_ID:
      out[sid] = PRMScorer(job.reprobe_run["prm"].model)
  return out


def fusion(job: TTSJob, scorers: dict[ScorerId, StepScorer]) -> FusionPick | None:
  """With the PRM, a probe and Best-of-N in the grid: the fusion the ReProbe job fitted on its val split (from its
  stored step scores, written by its report when missing) for the probe its val split ranks best; else None."""
  if not (PRM_ID in scorers and "best_of_n" in job.tcfg.strategies and any(s.kind == "probe" for s in scorers)):
    return None
  stored = os.path.join(prm_folder(job.reprobe_run.job.run.directory, job.prm), "step_scores.npz")
  if not is_sealed(stored):  # the ReProbe job's report writes them, sealed (its other stages are done by now)
    job.reprobe_run["report"]
  combined = prm_report.combine(prm_report.read_step_scores(stored), list(job.cfg.in_domains))
  pick = ScorerId.parse(combined.cascade_probe)
  if pick not in scorers:
    pick = next(s for s in scorers if s.kind == "probe")
  return FusionPick(pick, combined.fusions[pick.feature_set])


def grid(job: TTSJob, scorers: dict[ScorerId, StepScorer], fusion: FusionPick | None) -> Grid:
  """Every cell of the grid, each read back when stored, else searched and stored (`<folder>/cells/`)."""
  cfg, tcfg = job.cfg, job.tcfg
  run = Run(job.folder)
  os.makedirs(run.path("cells"), exist_ok=True)
  # A cell's file names its strategy and scorer (and the PRM's config), so adding a scorer or a strategy to the grid
  # reuses the cells already made.
  tag = {sid: str(sid) if sid != PRM_ID else f"prm.{run_key(dataclasses.asdict(job.prm))}" for sid in scorers}
  test = getattr(split_problems(cfg), tcfg.split)
  results: dict[str, dict[str, dict]] = {}
  cascades: dict[str, dict] = {}
  # The budgets each kind of cell holds, checked when a stored cell is read back.
  cell_checks = {
    s: check_cell(tcfg.budgets if s == "best_of_n" else searched_budgets(tcfg.budgets)) for s in STRATEGIES
  }
  total = len(tcfg.domains) * (1 + len(tcfg.scorers) * len(tcfg.strategies))
  done = 0
  for domain in tcfg.domains:
    every = [p for p in test if p.domain == domain]
    # An even spread over the split (it lists difficulty 1, then 2, then 3), not its first problems.
    problems = [every[i * len(every) // tcfg.problems] for i in range(min(tcfg.problems, len(every)))]
    if not problems:
      raise ConfigError(f"config.tts.domains: the {tcfg.split} split has no {domain!r} problems")
    t = cfg.trajectories
    dom = Domain(
      job.lm,
      cfg,
      tcfg,
      problems,
      [prompt_text(job.lm, p, cfg.mode, t.few_shot, t.first_step, t.goal_mark) for p in problems],
    )
    per = results.setdefault(domain, {})
    any_scorer = next(iter(scorers.values()))
    per["greedy"] = stored_cell(run, f"{domain}.greedy", lambda: greedy_cell(dom, any_scorer), check_cell([1]))
    done += 1
    job.tick(f"tts {domain}", done, total)
    for sid, scorer in scorers.items():
      for strategy in tcfg.strategies:
        per[f"{strategy}[{sid}]"] = stored_cell(
          run, f"{domain}.{strategy}.{tag[sid]}", lambda: strategy_cell(dom, strategy, scorer), cell_checks[strategy]
        )
        done += 1
        job.tick(f"tts {domain}", done, total)
    if fusion is not None:
      made: list[FusionCells] = []

      def both() -> FusionCells:  # one search makes both cells; neither is searched when both are stored
        if not made:
          made.append(fusion_and_cascade(dom, scorers[fusion.probe], scorers[PRM_ID], fusion.fusion))
        return made[0]

      fname = str(ScorerId("fusion", fusion.probe.feature_set))
      key = f"{fname}.{tag[PRM_ID]}"
      per[f"best_of_n[{fname}]"] = stored_cell(
        run, f"{domain}.best_of_n.{key}", lambda: both().fusion, cell_checks["best_of_n"]
      )
      cascades[domain] = {
        "probe": str(fusion.probe),
        **stored_cell(run, f"{domain}.cascade.{key}", lambda: both().cascade, check_cascade(max(tcfg.budgets))),
      }
  return Grid(results, cascades)


def report(job: TTSJob, grid: Grid) -> dict:
  """Writes metrics.json, table.md and accuracy.png (and cascade.png with the PRM) to the grid's folder and returns
  the metrics: {domain: {method: {budget: summary}}} under 'results', the grid's settings, and 'directory'."""
  metrics = {
    "results": grid.results,
    "config": dataclasses.asdict(job.tcfg),
    "train_domains": list(job.cfg.in_domains),
    "machine": str(describe()),
  }
  if grid.cascades:
    metrics["cascade"] = grid.cascades
  run = Run(job.folder)
  write_json(run.path("metrics.json"), metrics)
  with atomic_open(run.path("table.md")) as f:
    f.write(report_lib.table_markdown(metrics))
  report_lib.plot_budgets(metrics, run.path("accuracy.png"))
  if grid.cascades:
    report_lib.plot_cascade(metrics, run.path("cascade.png"))
  return {**metrics, "directory": run.directory}


GRAPH = Graph(
  Stage("scorers", scorers),
  Stage("fusion", fusion, needs=("scorers",)),
  Stage("grid", grid, needs=("scorers", "fusion")),
  Stage("report", report, needs=("grid",)),
)


def start(
  lm: LanguageModel,
  cfg: ReprobeConfig,
  tcfg: TTSConfig,
  workdir: str,
  *,
  prm: PRMTrainConfig | None = None,
  progress: Progress | None = None,
) -> GraphRun:
  """A run of the grid over the ReProbe run in `workdir`, in `<workdir>/tts/<key>/` (the key a hash of what every
  cell depends on); its stages computed when first asked for."""
  check_prm(tcfg, prm)
  check_search_configs(cfg, tcfg)
  # On a data file the default domains are the split's own ('math'); a domain the split lacks is refused here.
  tcfg = dataclasses.replace(tcfg, domains=grid_domains(cfg, tcfg))
  uses_prm = PRM_ID in tcfg.scorer_ids
  reprobe_run = reprobe.start(lm, cfg, workdir, prm=prm if uses_prm else None, progress=progress)
  key = run_key({k: v for k, v in dataclasses.asdict(tcfg).items() if k not in ("scorers", "strategies")})
  return GraphRun(
    GRAPH, TTSJob(lm, cfg, tcfg, reprobe_run, prm, os.path.join(workdir, "tts", key), progress or no_progress)
  )


def evaluate(
  lm: LanguageModel,
  cfg: ReprobeConfig,
  tcfg: TTSConfig,
  workdir: str,
  *,
  prm: PRMTrainConfig | None = None,
  progress: Progress | None = None,
) -> dict:
  """Runs (or resumes) the grid and returns its metrics (`report`). With the PRM and a probe among the scorers and
  Best-of-N among the strategies, also 'best_of_n[fusion[<set>]]' and the cascade (metrics['cascade'],
  cascade.png), from the probe the ReProbe job's val split ranks best."""
  return start(lm, cfg, tcfg, workdir, prm=prm, progress=progress)["report"]
