"""Trajectories: N samples per problem from the jitted sampler, with per-token statistics and exact step spans.

A trajectory record (`Trajectory`; JSONL, one per sample, keys in this order):
  id, problem_id, domain, mode ('line' | 'thinking'), sample (k of N),
  prompt_ids, response_ids (without the final EOS), response (text), finish_reason,
  logprobs, entropy, self_certainty: per response token j, about the distribution that produced token j
    (next-token aligned, METHOD A3), from the sampler (temperature 1, unfiltered),
  steps: [{text, start, end}] token spans relative to the response (METHOD A1; line mode: every non-empty line
    including '<Answer>: ...'; thinking mode: '.\\n\\n' paragraphs before </think>).
An annotated record (`reprobe_jax.annotate`) adds
  labels: one per step, 1.0 = incorrect, 0.0 = correct, null = unknown (NaN in memory),
  first_error: index of the first incorrect step the annotator found, or null,
  annotator: who labelled ('rule', 'judge:<backend>', 'import:<format>'),
and then the annotator's own keys (the rule annotator's answer and correct, a judge's judge_replies), kept in
`Trajectory.extra`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from reprobe_jax import steps as step_lib
from reprobe_jax.fields import Int, OneOf, Real, check_fields
from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.steps.labels import labels_from_json, labels_to_json
from reprobe_jax.features import FeatureSpec, union_capture, with_logprobs
from reprobe_jax.models import CaptureSpec, LanguageModel, SamplingParams
from reprobe_jax.io.readers import shown
from reprobe_jax.steps.modes import RESPONSE_FORMATS as MODES, STEP_MODE
from reprobe_jax.tasks import Problem, get_family
from reprobe_jax.tasks.formats import user_prompt
from reprobe_jax.tasks.io import read_jsonl


@dataclasses.dataclass(frozen=True)
class StepSpan:
  """One aligned step of a trajectory: its text and its token span [start, end) in the response (METHOD A1)."""

  text: str
  start: int
  end: int

  @property
  def has_tokens(self) -> bool:
    """Whether the span holds a token (a step with none has no feature to read, so no label)."""
    return self.end > self.start

  def to_json(self) -> dict:
    return {"text": self.text, "start": self.start, "end": self.end}


def _ints(v) -> bool:
  return isinstance(v, list) and all(type(x) is int and x >= 0 for x in v)


def _floats_ok(v) -> bool:
  return isinstance(v, list) and all(type(x) is int or (type(x) is float and math.isfinite(x)) for x in v)


def _str_or_none(v) -> bool:
  return v is None or isinstance(v, str)


# (field, check, what the check expects) in file order; `labels`, `first_error`, `annotator` follow.
_SCHEMA = (
    ("id", lambda v: isinstance(v, str) and bool(v), "a non-empty string"),
    ("problem_id", lambda v: isinstance(v, str), "a string"),
    ("domain", lambda v: isinstance(v, str), "a string"),
    ("mode", lambda v: v in MODES, f"one of {', '.join(MODES)}"),
    ("sample", lambda v: type(v) is int and v >= 0, "an integer >= 0"),
    # At least one prompt token: token j's features come from position j - 1 (METHOD A3).
    ("prompt_ids", lambda v: _ints(v) and bool(v), "a non-empty list of integers >= 0 (token ids)"),
    ("response_ids", _ints, "a list of integers >= 0 (token ids)"),
    ("response", _str_or_none, "a string"),
    ("finish_reason", _str_or_none, "a string"),
    ("logprobs", _floats_ok, "a list of numbers, each finite"),
    ("entropy", _floats_ok, "a list of numbers, each finite"),
    ("self_certainty", _floats_ok, "a list of numbers, each finite"),
    ("steps", lambda v: isinstance(v, list), "a list of {text, start, end} objects (align steps first)"),
)
RECORD_FIELDS = tuple(name for name, _, _ in _SCHEMA)  # what `sample_trajectories` writes; a file must have all
_TOKEN_STATS = ("logprobs", "entropy", "self_certainty")  # one value per response token
_LABEL_FIELDS = ("labels", "first_error", "annotator")


@dataclasses.dataclass(frozen=True)
class Trajectory:
  """One sampled trajectory and, once annotated, its step labels (the record schema is in the module docstring).

  labels: [num_steps] 1.0 / 0.0 / NaN (unknown), or None before annotation. `extra` holds the keys an annotator
  adds beyond labels (written after them, in their order).
  """

  id: str
  problem_id: str
  domain: str
  mode: str
  steps: tuple[StepSpan, ...]
  sample: int = 0
  prompt_ids: tuple[int, ...] = ()
  response_ids: tuple[int, ...] = ()
  response: str | None = None
  finish_reason: str | None = None
  logprobs: tuple[float, ...] = ()  # [num_response_tokens]
  entropy: tuple[float, ...] = ()  # [num_response_tokens]
  self_certainty: tuple[float, ...] = ()  # [num_response_tokens]
  labels: tuple[float, ...] | None = None  # [num_steps]
  first_error: int | None = None
  annotator: str | None = None
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, hash=False)

  @property
  def spans(self) -> list[tuple[int, int]]:
    """[(start, end)] token span of every step."""
    return [(s.start, s.end) for s in self.steps]

  def label_array(self) -> np.ndarray:
    """[num_steps] float32 labels, NaN = unknown; DataFormatError when the trajectory is not annotated."""
    if self.labels is None:
      raise DataFormatError(f"trajectory {self.id!r} has no labels (annotate it first)")
    return np.asarray(self.labels, np.float32)

  def to_json(self) -> dict:
    """The JSONL record: the sampler's keys, then labels / first_error / annotator once annotated, then `extra`."""
    out: dict[str, Any] = {}
    for name in RECORD_FIELDS:
      value = getattr(self, name)
      out[name] = ([s.to_json() for s in value] if name == "steps" else
                   list(value) if isinstance(value, tuple) else value)
    if self.labels is not None:
      out.update(labels=labels_to_json(self.labels), first_error=self.first_error, annotator=self.annotator)
    out.update(self.extra)
    return out

  @classmethod
  def from_json(cls, obj: Any, where: str = "", *, required: Collection[str] = RECORD_FIELDS) -> Trajectory:
    """A Trajectory from a JSON record; DataFormatError '<where>trajectory <id>: ...' naming the field on any defect.

    required: the fields that must be present (default: all the sampler writes); absent optional ones take their
    defaults, so annotators can take text-only records. Keys beyond the schema go to `extra`.
    """
    if not isinstance(obj, Mapping):
      raise DataFormatError(f"{where}expected a trajectory record (a JSON object), found {type(obj).__name__}")
    rid = obj.get("id")
    name = f"{where}trajectory {rid!r}" if isinstance(rid, str) and rid else f"{where}trajectory"
    values: dict[str, Any] = {}
    for field, check, expected in _SCHEMA:
      if field not in obj:
        if field in required:
          raise DataFormatError(f"{name}: missing field {field!r}")
        continue
      value = obj[field]
      if not check(value):
        raise DataFormatError(f"{name}: field {field!r} must be {expected}, found {shown(value)}")
      values[field] = value
    n_tokens = len(values["response_ids"]) if "response_ids" in values else None
    for field in _TOKEN_STATS:
      if n_tokens is not None and field in values and len(values[field]) != n_tokens:
        raise DataFormatError(f"{name}: field {field!r} has {len(values[field])} values for {n_tokens} response "
                              "tokens (one per token)")
    values["steps"] = _steps(values.get("steps", []), n_tokens, name)
    for field in ("prompt_ids", "response_ids", *_TOKEN_STATS):
      if field in values:
        values[field] = tuple(values[field])
    labels = obj.get("labels")
    if labels is not None:
      if not isinstance(labels, list) or not all(v is None or (type(v) in (int, float) and v in (0, 1))
                                                 for v in labels):
        raise DataFormatError(f"{name}: field 'labels' must be a list of numbers or nulls, each 0 (correct), 1 "
                              f"(incorrect) or null (unknown), found {shown(labels)}")
      if len(labels) != len(values["steps"]):
        raise DataFormatError(f"{name}: {len(labels)} labels for {len(values['steps'])} steps")
      values["labels"] = tuple(labels_from_json(labels))
    first = obj.get("first_error")
    if first is not None and (type(first) is not int or not 0 <= first < len(values["steps"])):
      raise DataFormatError(f"{name}: field 'first_error' must be an integer or null, a step index in "
                            f"0..{len(values['steps']) - 1}, found {shown(first)}")
    if not _str_or_none(obj.get("annotator")):
      raise DataFormatError(f"{name}: field 'annotator' must be a string, found {shown(obj['annotator'])}")
    known = set(RECORD_FIELDS) | set(_LABEL_FIELDS)
    return cls(**{"id": "", "problem_id": "", "domain": "", "mode": "", **values}, first_error=first,
               annotator=obj.get("annotator"), extra={k: v for k, v in obj.items() if k not in known})


def _steps(raw: list, n_tokens: int | None, name: str) -> tuple[StepSpan, ...]:
  """The checked steps of a record: {text, start, end} objects whose token spans are ordered, do not overlap and lie
  in the response (0 <= start <= end <= n_tokens, each start at or after the previous end; METHOD A1)."""
  steps, prev = [], 0
  for k, s in enumerate(raw):
    if not (isinstance(s, Mapping) and isinstance(s.get("text"), str) and type(s.get("start")) is int
            and type(s.get("end")) is int):
      raise DataFormatError(f"{name}: steps[{k}] must be a {{text, start, end}} object (text a string, start "
                            f"and end integers), found {shown(s)}")
    start, end = s["start"], s["end"]
    if not prev <= start <= end:
      raise DataFormatError(f"{name}: steps[{k}] spans tokens [{start}, {end}); spans must be ordered and not "
                            f"overlap (start >= {prev}, the previous step's end, and end >= start)")
    if n_tokens is not None and end > n_tokens:
      raise DataFormatError(f"{name}: steps[{k}] spans tokens [{start}, {end}), past the response's {n_tokens} "
                            "tokens")
    steps.append(StepSpan(s["text"], start, end))
    prev = end
  return tuple(steps)


def read_trajectories(path: str | os.PathLike) -> list[Trajectory]:
  """The trajectories of a JSONL file, checked; DataFormatError naming 'path:line', the trajectory and the field."""
  path = os.fspath(path)
  out, seen = [], {}
  for number, obj in read_jsonl(path):
    traj = Trajectory.from_json(obj, f"{path}:{number}: ")
    if traj.id in seen:
      raise DataFormatError(f"{path}:{number}: duplicate trajectory id {traj.id!r} (first on line {seen[traj.id]})")
    seen[traj.id] = number
    out.append(traj)
  return out


@dataclasses.dataclass(frozen=True)
class TrajectoryConfig:
  """METHOD A5 defaults: T=1.0, top-k 50, top-p 0.95, N=3 samples per problem."""

  samples: int = 3
  temperature: float = 1.0
  top_k: int = 50
  top_p: float = 0.95
  max_new_tokens: int = 128
  batch_size: int = 32  # prompts per generate call (each with `samples` rows)
  seed: int = 0
  # Worked examples (clean reference solutions of other problems of the same family, easiest difficulty) shown as
  # earlier chat turns: a pretrained model that never saw the format learns it in context. 0 for the built-in target.
  few_shot: int = 0
  # Spell out the first step's starting point in qa and planning questions (`TaskFamily.first_step_question`), in
  # the worked examples too: SmolLM2-135M otherwise starts from a person or room of the fact list, not the
  # question's (docs/tasks.md, "SmolLM2"). Off for the built-in target.
  first_step: bool = False
  # Worked examples end the step that completes the chain with the family's `done_mark` (planning: 'move from 6 to
  # 9 (the goal)'): SmolLM2-135M otherwise walks on past the goal (docs/tasks.md, "SmolLM2"). Line mode only; off
  # for the built-in target.
  goal_mark: bool = False

  def __post_init__(self):
    # temperature 0 is greedy, top_k 0 and top_p 1 are off; errors name config.trajectories.<field> when built by
    # replace_fields, else TrajectoryConfig.<field>
    check_fields(self, {"samples": Int(1), "temperature": Real(0.0), "top_k": Int(0),
                        "top_p": Real(0.0, 1.0, low_open=True), "max_new_tokens": Int(1), "batch_size": Int(1),
                        "seed": Int(0), "few_shot": Int(0), "first_step": OneOf((False, True)),
                        "goal_mark": OneOf((False, True))})


SHOT_SEED = 3_000_017  # few-shot examples come from their own seed, disjoint from every split


def few_shot_turns(problem: Problem, mode: str, k: int, first_step: bool = False,
                   goal_mark: bool = False) -> list[dict]:
  """k (user, assistant) message pairs: the same family's problems with their clean reference solutions
  (`first_step`, `goal_mark`: as `TrajectoryConfig`'s)."""
  return [dict(m) for m in _shots(problem.domain, mode, k, first_step, goal_mark)]


def with_done_mark(problem: Problem, steps: Sequence[str]) -> list[str]:
  """Line-mode step bodies with the family's `done_mark` added to the step after which the checker finds the chain
  complete (none added where the family has no mark or the steps never complete it)."""
  family = get_family(problem.domain)
  out = list(steps)
  if not family.done_mark:
    return out
  state = family.initial_state(problem)
  for i, body in enumerate(steps):
    parsed = family.parse_step(body)
    if parsed is None:
      break
    _, state = family.judge_step(problem, state, parsed, None)
    if family.is_done(problem, state):
      out[i] = body + family.done_mark
      break
  return out


@functools.lru_cache(maxsize=64)
def _shots(domain: str, mode: str, k: int, first_step: bool = False, goal_mark: bool = False) -> tuple:
  from reprobe_jax.tasks import make_problems
  from reprobe_jax.tasks.formats import render_line
  from reprobe_jax.tasks.traces import TraceNoise, solve

  if goal_mark and mode != "line":
    raise ConfigError(f"trajectories.goal_mark marks line-mode worked examples; answer mode is {mode!r}")
  turns = []
  for shot in make_problems(domain, k, SHOT_SEED, 1) if k > 0 else []:
    trace = solve(shot, shot.domain, np.random.default_rng(0), mode, TraceNoise.clean())
    text = render_line(with_done_mark(shot, trace.steps), trace.answer) if goal_mark else trace.text
    turns += [(("role", "user"), ("content", user_prompt(shot, mode, example=False, first_step=first_step))),
              (("role", "assistant"), ("content", text))]
  return tuple(turns)


def prompt_text(lm: LanguageModel, problem: Problem, mode: str, few_shot: int = 0, first_step: bool = False,
                goal_mark: bool = False) -> str:
  """The chat-formatted prompt (after `few_shot` worked examples; `first_step`, `goal_mark`: as
  `TrajectoryConfig`'s); without a chat template, plain text turns."""
  # With worked examples the hint drops its made-up step (`user_prompt`'s `example`); without, it is what shows
  # the format.
  messages = few_shot_turns(problem, mode, few_shot, first_step, goal_mark) + [
      {"role": "user", "content": user_prompt(problem, mode, example=few_shot == 0, first_step=first_step)}]
  if getattr(lm.tokenizer, "chat_template", None):
    return lm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  return "\n\n".join(m["content"] for m in messages) + ("\n\n" if few_shot else "")


def sample_trajectories(lm: LanguageModel, problems: Sequence[Problem], mode: str, cfg: TrajectoryConfig,
                        *, prompt_fn: Callable[[LanguageModel, Problem, str, int, bool, bool], str] = prompt_text,
                        on_batch: Callable[[int], None] | None = None,
                        feature_specs: Sequence[FeatureSpec] = (),
                        on_features: Callable[[list[Trajectory], dict[str, dict[str, np.ndarray]]], None] | None = None,
                        ) -> list[Trajectory]:
  """Samples `cfg.samples` trajectories per problem (the prompt is prefilled once per problem, its samples read it
  as a shared prefix) and aligns steps.

  feature_specs: the probe's feature sets to record while sampling (METHOD A3, next-token aligned, no second
  forward); after each batch `on_features(batch trajectories, {spec name: {trajectory id: [n_tokens, F]}})` gets
  them, so a caller can store them as they come instead of holding a whole split.
  """
  eos = lm.tokenizer.eos_token_id
  sampling = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)
  capture = union_capture(feature_specs) if feature_specs else CaptureSpec(token_stats=True)
  out = []
  for start in range(0, len(problems), cfg.batch_size):
    chunk = problems[start:start + cfg.batch_size]
    prompts = [prompt_fn(lm, p, mode, cfg.few_shot, cfg.first_step, cfg.goal_mark) for p in chunk]
    gen = lm.generate(prompts, sampling, max_new_tokens=cfg.max_new_tokens, n=cfg.samples,
                      seed=cfg.seed + start, capture=capture)
    batch = []
    for row in range(gen.tokens.shape[0]):
      problem = chunk[gen.prompt_index[row]]
      ids = gen.token_ids(row)
      n = len(ids) - (1 if ids and ids[-1] == eos else 0)
      ids = ids[:n]
      steps = step_lib.align(lm.tokenizer, ids, STEP_MODE[mode])
      batch.append(Trajectory(
          id=f"{problem.id}#{row % cfg.samples}", problem_id=problem.id, domain=problem.domain,
          mode=mode, sample=row % cfg.samples, prompt_ids=tuple(gen.prompt_ids[gen.prompt_index[row]]),
          response_ids=tuple(ids), response=lm.tokenizer.decode(ids), finish_reason=gen.finish_reason[row],
          logprobs=_floats(gen.logprobs[row, :n]), entropy=_floats(gen.features["token_entropy"][row, :n]),
          self_certainty=_floats(gen.features["token_self_certainty"][row, :n]),
          steps=tuple(StepSpan(s.text, s.start, s.end) for s in steps),
      ))
    if feature_specs and on_features is not None:
      feats = {}
      for spec in feature_specs:
        arr = np.asarray(spec.assemble(with_logprobs(gen.features, gen.logprobs), lm.config.num_layers))  # [R, N, F]
        feats[spec.name] = {t.id: arr[row, :len(t.response_ids)] for row, t in enumerate(batch)}
      on_features(batch, feats)
    out += batch
    if on_batch is not None:
      on_batch(len(chunk))
  return out


def _floats(x) -> tuple[float, ...]:
  return tuple(round(float(v), 6) for v in np.asarray(x))
