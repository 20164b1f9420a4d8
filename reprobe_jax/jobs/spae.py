"""The SPAE inference evaluation (docs/method.md §B1, §B3): step potentials of thinking trajectories, their
agreement with the task's oracle, and plain against probe-truncated decoding.

For each domain, `problems` problems of a split (spread over the difficulties) get `samples` thinking trajectories
each (k of Acc@k), decoded twice with the same per-row random streams: plain (every boundary probed, nothing
changed) and probe-truncated (`</think>` forced in at the first saturated boundary). The job is a graph of stages,
decoded -> report; every domain and mode is stored as it finishes (`rows_<domain>_<mode>.jsonl`), so an interrupted
job resumes. The report is metrics.json, table.md, curves_<group>.png (mean Phi, Conf, Acc against relative step
position, correct vs wrong) and displacement_<group>.png (the saturation step against the oracle's, the paper's
Appendix C.1).
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from typing import Mapping, NoReturn

import numpy as np

from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.eval.machine import describe
from reprobe_jax.features import model_fingerprint
from reprobe_jax.fields import SEED, Int, OneOf, Real, Seq, check_fields, field_name, plain, replace_fields
from reprobe_jax.io.atomic import atomic_open, write_json, write_jsonl
from reprobe_jax.io.readers import read_jsonl, shown
from reprobe_jax.jobs.graph import Graph, GraphRun, Stage
from reprobe_jax.jobs.runs import Progress, Run, no_progress, run_key
from reprobe_jax.models import LanguageModel
from reprobe_jax.models.decode_state import FINISH_NAMES
from reprobe_jax.models.sampling import SamplingParams
from reprobe_jax.rl.config import config_key, problems_fingerprint
from reprobe_jax.spae import metrics as spae_metrics
from reprobe_jax.spae.decode import ThinkingRow, decode_thinking
from reprobe_jax.spae.metrics import ThinkingOutcome
from reprobe_jax.spae.potential import ProbeConfig, StepPotentials
from reprobe_jax.spae.prober import Prober
from reprobe_jax.tasks import DIFFICULTIES, TASKS, Problem
from reprobe_jax.tasks.data import DATA_TASK, DataConfig, load_data, no_data_file
from reprobe_jax.tasks.splits import spread
from reprobe_jax.trajectories import check_thinking_template, prompt_text

MODES = ("plain", "truncated")


@dataclasses.dataclass(frozen=True)
class SPAEJobConfig:
  """problems: per domain; samples: trajectories per problem (k of Acc@k); sampling: of the trajectories, never
  greedy (the released script samples at T=0.6 with nothing else); batch_size: rows per decode call;
  split: 'test' for the reported numbers, 'val' to look at settings (nothing here is chosen on test). data: the
  user's data file (docs/own-data.md): when `data.path` is set the problems are the first `problems` of its `split`
  (the math task, domain 'math'; `domains` and `in_domain` are then ('math',), `difficulties` is not read), and
  'math' in `domains` without a file is refused (`no_data_file`)."""

  problems: int = 32
  domains: tuple[str, ...] = ("arithmetic", "planning", "qa")
  in_domain: tuple[str, ...] = ("arithmetic",)
  difficulties: tuple[int, ...] = (1, 2, 3)
  samples: int = 16
  max_new_tokens: int = 192
  sampling: SamplingParams = SamplingParams(temperature=0.6, top_k=0, top_p=1.0)
  few_shot: int = 0
  batch_size: int = 128
  split: str = "test"
  seed: int = 0
  data: DataConfig = DataConfig()

  def __post_init__(self):
    check_fields(
      self,
      {
        "problems": Int(1),
        "domains": Seq(OneOf(TASKS.names())),
        "in_domain": Seq(OneOf(TASKS.names())),
        "difficulties": Seq(OneOf(DIFFICULTIES)),
        "samples": Int(1),
        "max_new_tokens": Int(1),
        "few_shot": Int(0),
        "batch_size": Int(1),
        "split": OneOf(("val", "test")),
        "seed": SEED,
      },
    )
    check_fields(self.sampling, {"temperature": Real(0.0, low_open=True)}, field_name(self, "sampling"))
    if not self.domains or not self.difficulties:
      raise ConfigError(f"{field_name(self, 'domains')} and difficulties must not be empty")
    if not isinstance(self.data, DataConfig):
      raise ConfigError(f"{field_name(self, 'data')}: expected a DataConfig, got {self.data!r}")
    if not self.data.enabled and DATA_TASK in self.domains:
      raise no_data_file(field_name(self, "domains"))
    for name in ("domains", "in_domain"):
      value = getattr(self, name)
      if self.data.enabled and value != getattr(SPAEJobConfig, name) and set(value) != {DATA_TASK}:
        raise ConfigError(
          f"{field_name(self, name)}: a data file's problems are all {DATA_TASK!r}, got {value}; leave the default "
          f"or give ({DATA_TASK!r},)"
        )

  @property
  def run_domains(self) -> tuple[str, ...]:
    """The domains the job decodes: `domains`, or ('math',) on a data file."""
    return (DATA_TASK,) if self.data.enabled else self.domains

  @property
  def run_in_domain(self) -> tuple[str, ...]:
    """The in-domain group: `in_domain`, or ('math',) on a data file."""
    return (DATA_TASK,) if self.data.enabled else self.in_domain


def job_config_from_dict(d) -> SPAEJobConfig:
  """The CLI's `config.spae` section -> SPAEJobConfig, checked whole (ConfigError naming `config.spae.<field>`)."""
  return replace_fields(SPAEJobConfig(), _mapping(d), root="config.spae")


def probe_config_from_dict(d) -> ProbeConfig:
  """The CLI's `config.probe` section -> the step potential's ProbeConfig (ConfigError naming
  `config.probe.<field>`)."""
  return replace_fields(ProbeConfig(), _mapping(d), root="config.probe")


def _mapping(d):
  """A ConfigDict or mapping as a plain dict; anything else as it is (`replace_fields` names it)."""
  return plain(d) if isinstance(d, Mapping) or hasattr(d, "to_dict") else d


def problems_of(cfg: SPAEJobConfig, domain: str) -> list[Problem]:
  """`cfg.problems` problems of the split, spread evenly over the difficulties (the ReProbe split's seeds); on a data
  file the first `cfg.problems` of its split (`tasks.data.load_data`: shuffled by its seed)."""
  if cfg.data.enabled:
    problems = list(load_data(cfg.data).problems[cfg.split][: cfg.problems])
    if not problems:
      raise ConfigError(f"config.data.{cfg.split}=0: the {cfg.split} split of {cfg.data.path} is empty")
    return problems
  return spread(domain, cfg.problems, cfg.split, cfg.seed, cfg.difficulties)


def data_fingerprint(cfg: SPAEJobConfig) -> str:
  """Hash of a data run's problems; '' on the synthetic world, whose problems its config decides."""
  return problems_fingerprint(problems_of(cfg, DATA_TASK)) if cfg.data.enabled else ""


def prompt_seed(problem) -> int:
  """A problem's own random stream (its id's CRC32): its trajectories are the same in any batch."""
  return zlib.crc32(problem.id.encode())


def run_folder(root: str, lm: LanguageModel, cfg: SPAEJobConfig, pcfg: ProbeConfig) -> str:
  """`<root>/<key>`, the key a hash of the job's and the probe's configs and of the target model."""
  return os.path.join(
    root,
    run_key({"spae": config_key(cfg), "probe": dataclasses.asdict(pcfg)}, model_fingerprint(lm), data_fingerprint(cfg)),
  )


def _row_json(row: ThinkingRow) -> dict:
  p = row.potentials
  return {
    "prompt_index": row.prompt_index,
    "sample": row.sample,
    "response_ids": list(row.response_ids),
    "finish_reason": row.finish_reason,
    "truncated_at": row.truncated_at,
    "cuts": p.cuts.tolist(),
    "acc": [_num(x) for x in p.acc],
    "conf": [_num(x) for x in p.conf],
  }


def _num(x) -> float | None:
  return None if not np.isfinite(x) else round(float(x), 6)


ROW_FIELDS = ("prompt_index", "sample", "response_ids", "finish_reason", "truncated_at", "cuts", "acc", "conf")
UNIT = Real(0.0, 1.0)  # Acc and Conf are means of probabilities (docs/method.md §B1), so Phi is in [-1, 1]


@dataclasses.dataclass(frozen=True)
class RowLimits:
  """What a stored row of one domain and mode may hold: prompt indices below `problems`, samples below `samples`,
  token ids below `vocab`, a truncation only when `truncated`."""

  problems: int
  samples: int
  vocab: int
  truncated: bool
  eps_sat: float


def _row_from(obj, limits: RowLimits, where: str) -> ThinkingRow:
  """A stored row, every field checked (keys, types, ranges, indices against lengths); DataFormatError naming
  `where` (file:line) and the field otherwise."""

  def bad(field: str, expected, value) -> NoReturn:
    raise DataFormatError(f"{where}: field {field!r}: expected {expected}, got {shown(value)}")

  def need(field: str, rule, value):
    if not rule.ok(value):
      bad(field, rule, value)
    return value

  def items(field: str, value) -> list:
    return value if isinstance(value, list) else bad(field, "a list", value)

  if not isinstance(obj, dict):
    raise DataFormatError(f"{where}: expected a row (a JSON object), got {shown(obj)}")
  missing, unknown = [k for k in ROW_FIELDS if k not in obj], sorted(set(obj) - set(ROW_FIELDS))
  if missing or unknown:
    raise DataFormatError(f"{where}: a row has the fields {list(ROW_FIELDS)}; missing {missing}, unknown {unknown}")
  ids = items("response_ids", obj["response_ids"])
  token = Int(0, limits.vocab - 1)
  if not all(type(t) is int for t in ids) or (ids and not 0 <= min(ids) <= max(ids) < limits.vocab):
    j = next(j for j, t in enumerate(ids) if not token.ok(t))
    bad(f"response_ids[{j}]", f"a token id, {token}", ids[j])
  cuts = items("cuts", obj["cuts"])
  for j, c in enumerate(cuts):  # each boundary's last token, in order, inside the response
    need(f"cuts[{j}]", Int(cuts[j - 1] + 1 if j else 0, len(ids) - 1), c)
  acc, conf = items("acc", obj["acc"]), items("conf", obj["conf"])
  for field, values in (("acc", acc), ("conf", conf)):
    if len(values) != len(cuts):
      bad(field, f"one value per cut ({len(cuts)})", values)
    for j, (v, other) in enumerate(zip(values, conf if field == "acc" else acc)):
      if (v is None) != (other is None):  # a skipped boundary has neither
        bad(f"{field}[{j}]", "null exactly where the other of acc and conf is null", v)
      if v is not None:
        need(f"{field}[{j}]", UNIT, v)
  truncated_at = obj["truncated_at"]
  if truncated_at is not None or not limits.truncated:
    need("truncated_at", Int(0, len(cuts) - 1) if limits.truncated else OneOf((None,)), truncated_at)
  nan = lambda v: np.nan if v is None else v
  return ThinkingRow(
    prompt_index=need("prompt_index", Int(0, limits.problems - 1), obj["prompt_index"]),
    sample=need("sample", Int(0, limits.samples - 1), obj["sample"]),
    response_ids=tuple(ids),
    finish_reason=need("finish_reason", OneOf(tuple(FINISH_NAMES.values())), obj["finish_reason"]),
    potentials=StepPotentials.of(cuts, [nan(v) for v in acc], [nan(v) for v in conf], limits.eps_sat),
    truncated_at=truncated_at,
  )


def read_rows(path: str, limits: RowLimits) -> list[tuple[int, ThinkingRow]]:
  """(line, row) of a stored rows file, checked against its seal and row by row (`_row_from`): one row per
  (problem, sample), each once."""
  out, seen = [], {}
  for line, obj in read_jsonl(path, os.path.basename(path), sealed=True):
    row = _row_from(obj, limits, f"{path}:{line}")
    key = (row.prompt_index, row.sample)
    if key in seen:
      raise DataFormatError(f"{path}:{line}: problem {key[0]} sample {key[1]} again (first on line {seen[key]})")
    seen[key] = line
    out.append((line, row))
  if len(out) != limits.problems * limits.samples:
    raise DataFormatError(
      f"{path}: {len(out)} rows, expected {limits.problems * limits.samples} ({limits.problems} problems x "
      f"{limits.samples} samples)"
    )
  return out


def decode_domain(lm, prober: Prober, cfg: SPAEJobConfig, problems, truncate: bool, progress=None) -> list[ThinkingRow]:
  """All trajectories of a domain, in chunks of `batch_size` rows (whole problems per chunk)."""
  per_call = max(1, cfg.batch_size // cfg.samples)
  prompts = lm.encode([prompt_text(lm, p, "thinking", cfg.few_shot) for p in problems])
  out = []
  for start in range(0, len(problems), per_call):
    chunk = problems[start : start + per_call]
    rows = decode_thinking(
      lm,
      prober,
      prompts[start : start + per_call],
      [p.answer for p in chunk],
      [prompt_seed(p) for p in chunk],
      sampling=cfg.sampling,
      max_new_tokens=cfg.max_new_tokens,
      samples=cfg.samples,
      seed=cfg.seed,
      truncate=truncate,
      progress=progress,
    )
    out += [dataclasses.replace(r, prompt_index=r.prompt_index + start) for r in rows]
  return out


@dataclasses.dataclass(frozen=True)
class SPAEJob:
  """What every stage reads: the target, the job's and the probe's configs, the prober, the run folder, the
  decoding modes (MODES, 'plain' always) and the progress callback."""

  lm: LanguageModel
  cfg: SPAEJobConfig
  pcfg: ProbeConfig
  prober: Prober
  run: Run
  modes: tuple[str, ...] = MODES
  tick: Progress = no_progress


# {domain: {mode: the outcome of every trajectory}}, the trajectories of a problem's samples together.
Outcomes = dict[str, dict[str, list[ThinkingOutcome]]]


def decoded(job: SPAEJob) -> Outcomes:
  """Every domain's trajectories in every mode, decoded and stored (`rows_<domain>_<mode>.jsonl`) where missing,
  read back and scored against the task's oracle."""
  cfg, run, lm = job.cfg, job.run, job.lm
  out: Outcomes = {}
  for domain in cfg.run_domains:
    problems = problems_of(cfg, domain)
    out[domain] = {}
    for mode in job.modes:
      name = f"rows_{domain}_{mode}.jsonl"
      total = len(problems) * cfg.samples
      done = 0

      def step(k, stage=f"{domain} {mode}"):
        nonlocal done
        done += k
        job.tick(stage, done, total)

      def make(name=name, mode=mode, problems=problems, step=step):
        rows = decode_domain(lm, job.prober, cfg, problems, mode == "truncated", progress=step)
        write_jsonl(run.path(name), [_row_json(r) for r in rows], seal=True)

      run.stage(f"{domain}_{mode}_s", [name], make)
      limits = RowLimits(len(problems), cfg.samples, lm.config.vocab_size, mode == "truncated", job.pcfg.eps_sat)
      out[domain][mode] = [
        _outcome(problems, row, lm, f"{run.path(name)}:{line}") for line, row in read_rows(run.path(name), limits)
      ]
  return out


def _outcome(problems, row: ThinkingRow, lm, where: str) -> ThinkingOutcome:
  """A stored row scored against its problem's oracle; a row whose boundaries are not its response's is named by
  file and line."""
  try:
    return spae_metrics.outcome_from(problems[row.prompt_index], row.response_ids, lm.tokenizer, row.potentials)
  except DataFormatError as e:
    raise DataFormatError(f"{where}: {e}") from None


def report(job: SPAEJob, decoded: Outcomes) -> dict:
  """Writes table.md, the curves and displacement plots of each group (in domain, out of domain) and metrics.json;
  returns the metrics."""
  cfg, run, modes = job.cfg, job.run, job.modes
  result = {"directory": run.directory, "machine": str(describe()), "domains": {}, "groups": {}}
  groups = {
    "in_domain": [d for d in cfg.run_domains if d in cfg.run_in_domain],
    "out_of_domain": [d for d in cfg.run_domains if d not in cfg.run_in_domain],
  }
  table_rows = {}
  for domain in cfg.run_domains:
    for m in modes:
      table_rows[f"{domain} {m}"] = spae_metrics.summarise(decoded[domain][m], cfg.samples)
    result["domains"][domain] = {m: table_rows[f"{domain} {m}"].to_json() for m in modes}
  for g, doms in groups.items():
    if not doms:
      continue
    pooled = {m: [o for d in doms for o in decoded[d][m]] for m in modes}
    result["groups"][g] = {m: spae_metrics.summarise(pooled[m], cfg.samples).to_json() for m in modes}
    curves = spae_metrics.potential_curves(pooled["plain"])
    spae_metrics.plot_curves(curves, run.path(f"curves_{g}.png"))
    result["groups"][g]["curves"] = curves.to_json()
    spae_metrics.plot_displacement(
      spae_metrics.summarise(pooled["plain"], cfg.samples), run.path(f"displacement_{g}.png")
    )
  with atomic_open(run.path("table.md")) as f:
    f.write(spae_metrics.metrics_markdown(table_rows))
  write_json(run.path("metrics.json"), result)
  return result


GRAPH = Graph(Stage("decoded", decoded), Stage("report", report, needs=("decoded",)))


def check_problems(lm: LanguageModel, prober: Prober, cfg: SPAEJobConfig, field: str = "config.spae") -> None:
  """Before the run folder exists: the problems can be read (a data file's every record checked, `load_data`), the
  chat template can hold a thinking response (`check_thinking_template` on the first prompt), and every trajectory
  and its probes fit the context (CacheFullError otherwise)."""
  for domain in cfg.run_domains:
    problems = problems_of(cfg, domain)
    texts = [prompt_text(lm, p, "thinking", cfg.few_shot) for p in problems]
    if texts:
      check_thinking_template(texts[0], "thinking", where=f"{field}: the {domain} prompts")
    prompts = lm.encode(texts)
    for ids, answer in zip(prompts, prober.answer_ids([p.answer for p in problems])):
      prober.check_room(len(ids) + cfg.max_new_tokens, len(answer))


def evaluate(
  lm: LanguageModel,
  cfg: SPAEJobConfig,
  pcfg: ProbeConfig,
  workdir: str,
  *,
  progress: Progress | None = None,
  modes: tuple[str, ...] = MODES,
) -> dict:
  """Runs (or resumes) the job in `<workdir>/<key>` (`run_folder`, its config.json written first) and returns the
  metrics (also written to metrics.json). modes: which of MODES to decode ('plain' always: the curves read it; the RL
  loop's evaluation decodes only it)."""
  if "plain" not in modes or any(m not in MODES for m in modes):
    raise ConfigError(f"SPAE evaluation modes must be 'plain' and maybe more of {MODES}, got {modes!r}")
  prober = Prober(lm, pcfg)
  check_problems(lm, prober, cfg)
  run = Run(run_folder(workdir, lm, cfg, pcfg))
  write_json(run.path("config.json"), {"spae": config_key(cfg), "probe": dataclasses.asdict(pcfg)})
  return GraphRun(GRAPH, SPAEJob(lm, cfg, pcfg, prober, run, modes, progress or no_progress))["report"]
