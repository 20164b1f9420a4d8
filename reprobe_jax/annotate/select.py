"""The annotator a job asks for by name (docs/method.md §A2): 'rule' (exact checkers), 'self' (the target model as its
own two-stage judge), 'judge' (an OpenAI-compatible server as the judge), 'import' (labels from a file).

A job's config carries `annotator` (the name), `judge` (`JudgeSettings`, read by 'self' and 'judge') and
`labels_path` (read by 'import'). `check_annotator` validates them before any work starts; `annotator_key` is what
of them decides the labels, for the job's run-folder hash; `annotate` labels records with the chosen annotator.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Callable, Mapping, Sequence

from reprobe_jax.annotate.importer import import_labels
from reprobe_jax.annotate.judge import JudgePrompts, OpenAICompatibleJudge, SelfJudge, annotate_judge
from reprobe_jax.annotate.records import Record
from reprobe_jax.annotate.rule import annotate_rule
from reprobe_jax.errors import ConfigError
from reprobe_jax.fields import SEED, Int, check_fields
from reprobe_jax.models import LanguageModel, SamplingParams
from reprobe_jax.registry import Registry
from reprobe_jax.tasks.base import Problem

# name -> `fn(records, problems, judge, labels_path, lm)` -> the records labelled (the functions are at the end).
ANNOTATORS: Registry[Callable[..., list[Record]]] = Registry("annotator")


@dataclasses.dataclass(frozen=True)
class SelfJudgeSampling:
  """How the target samples its verdicts as its own judge (paper: T=0.7, top-k 20, top-p 0.95)."""

  sampling: SamplingParams = SamplingParams(temperature=0.7, top_k=20, top_p=0.95)
  max_new_tokens: int = 1024
  batch_size: int = 8
  seed: int = 0

  def __post_init__(self):
    check_fields(self, {"max_new_tokens": Int(1), "batch_size": Int(1), "seed": SEED})


@dataclasses.dataclass(frozen=True)
class JudgeAPI:
  """An OpenAI-compatible chat server as the judge. The API key is read from the environment variable named by
  `api_key_env` (none sent when it is unset), so it is in no config file and no run-folder hash."""

  base_url: str = "http://127.0.0.1:8000/v1"
  model: str = ""
  temperature: float = 0.7
  top_p: float = 0.95
  max_tokens: int | None = 4096
  timeout: float = 120.0
  retries: int = 3
  max_workers: int = 4
  api_key_env: str = "OPENAI_API_KEY"


@dataclasses.dataclass(frozen=True)
class JudgeSettings:
  """The LLM judge of 'self' and 'judge': prompt templates (configs/judge_prompts.py), the variant (per_step: None =
  by each record's mode, True = one call per step, False = two-stage), and each backend's settings."""

  prompts: JudgePrompts | None = None
  per_step: bool | None = None
  self_judge: SelfJudgeSampling = SelfJudgeSampling()
  api: JudgeAPI = JudgeAPI()


def check_annotator(annotator: str, judge: JudgeSettings, labels_path: str) -> None:
  """ConfigError naming the config field when the chosen annotator cannot run with these settings."""
  if annotator not in ANNOTATORS:
    raise ConfigError(f"config.annotator must be one of {', '.join(ANNOTATORS.names())}, found {annotator!r}")
  if annotator in ("self", "judge") and not isinstance(judge.prompts, JudgePrompts):
    raise ConfigError(
      f"config.judge.prompts: annotator {annotator!r} needs the judge's prompt templates (see "
      "configs/judge_prompts.py), found none"
    )
  if annotator == "self":
    s = judge.self_judge
    for name in ("max_new_tokens", "batch_size"):
      if getattr(s, name) < 1:
        raise ConfigError(f"config.judge.self_judge.{name} must be >= 1, found {getattr(s, name)}")
  if annotator == "judge":
    api = judge.api
    if not api.model:
      raise ConfigError("config.judge.api.model is empty: annotator 'judge' needs the served model's name")
    if not api.base_url.startswith(("http://", "https://")):
      raise ConfigError(f"config.judge.api.base_url must start with http:// or https://, found {api.base_url!r}")
    for name in ("retries", "max_workers", "timeout"):
      if getattr(api, name) <= 0:
        raise ConfigError(f"config.judge.api.{name} must be > 0, found {getattr(api, name)}")
  if annotator == "import":
    if not labels_path:
      raise ConfigError("config.labels_path is empty: annotator 'import' needs the labels file")
    if not os.path.isfile(labels_path):
      raise ConfigError(f"config.labels_path: no file {labels_path!r}")


def annotator_key(annotator: str, judge: JudgeSettings, labels_path: str) -> dict[str, Any] | None:
  """What of the annotator settings decides the labels (for a run-folder hash): None for 'rule' (so run folders
  from before the option keep their hash), the judge's prompts and its backend's settings for 'self' / 'judge',
  the labels file's content hash for 'import'."""
  if annotator == "rule":
    return None
  key: dict[str, Any] = {"annotator": annotator}
  if annotator in ("self", "judge"):
    api = {k: v for k, v in dataclasses.asdict(judge.api).items() if k != "api_key_env"}
    key.update(
      prompts=dataclasses.asdict(judge.prompts),
      per_step=judge.per_step,
      backend=dataclasses.asdict(judge.self_judge) if annotator == "self" else api,
    )
  else:
    with open(labels_path, "rb") as f:
      key["labels_sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
  return key


def annotate(
  records: Sequence[Record],
  problems: Mapping[str, Problem],
  annotator: str,
  judge: JudgeSettings,
  labels_path: str,
  lm: LanguageModel | None = None,
) -> list[Record]:
  """`records` labelled by the chosen annotator ('self' judges with `lm`, the target); `problems` maps problem id
  -> Problem for the rule checkers and the judge's reference solutions. 'import' is strict: the file must label
  every record and name no other."""
  check_annotator(annotator, judge, labels_path)
  return ANNOTATORS.get(annotator)(records, problems, judge, labels_path, lm)


@ANNOTATORS.register("rule")
def _rule(records, problems, judge, labels_path, lm) -> list[Record]:
  return annotate_rule(records, problems)


@ANNOTATORS.register("self")
def _self(records, problems, judge, labels_path, lm) -> list[Record]:
  if lm is None:
    raise ConfigError("annotator 'self' needs the target model (lm) to judge its own steps")
  s = judge.self_judge
  backend = SelfJudge(lm, s.sampling, max_new_tokens=s.max_new_tokens, seed=s.seed, batch_size=s.batch_size)
  return annotate_judge(records, problems, backend, judge.prompts, per_step=judge.per_step)


@ANNOTATORS.register("judge")
def _judge(records, problems, judge, labels_path, lm) -> list[Record]:
  api = judge.api
  backend = OpenAICompatibleJudge(
    api.base_url,
    api.model,
    os.environ.get(api.api_key_env) or None,
    temperature=api.temperature,
    top_p=api.top_p,
    max_tokens=api.max_tokens,
    timeout=api.timeout,
    retries=api.retries,
    max_workers=api.max_workers,
  )
  return annotate_judge(records, problems, backend, judge.prompts, per_step=judge.per_step)


@ANNOTATORS.register("import")
def _import(records, problems, judge, labels_path, lm) -> list[Record]:
  return import_labels(records, labels_path)
