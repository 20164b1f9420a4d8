"""The two-stage LLM judge of docs/method.md §A2(b), with the target model as its own judge or an OpenAI-compatible
server.

Line mode (two calls per trajectory): stage 1 shows the judge the problem, a reference solution and the numbered
student steps and asks for a free-form critique of each step; stage 2 shows the critique again and asks for a
Python list of 0/1, one per step, 1 = correct. Judge 1 maps to label 0.0, judge 0 to label 1.0. A reply with no
parseable list, or a list of the wrong length, makes every step of that trajectory NaN.

Thinking mode (one call per step): the judge sees the problem, the reference, the previous steps and the new step,
and replies with a single 0/1; redundant steps (re-checks) count as correct. An unparseable reply makes that step
NaN.

All prompts of a stage, over all trajectories, go to the backend in one `complete` call, so a backend can batch
them. Prompt templates come from `configs/judge_prompts.py`, turned into `JudgePrompts` at the CLI edge.
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import http.client
import json
import math
import re
import string
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Mapping, NamedTuple, Protocol, Sequence

from absl import logging

from reprobe_jax.annotate.records import Record, as_trajectory, labelled, record_id
from reprobe_jax.errors import ConfigError, DataFormatError, JudgeBackendError, ReprobeError
from reprobe_jax.fields import check_seed
from reprobe_jax.models import LanguageModel, SamplingParams
from reprobe_jax.tasks.base import Problem, get_task


class JudgeBackend(Protocol):
  """What the judge needs from a model: one reply per prompt (a user message), in order."""

  name: str

  def complete(self, prompts: list[str]) -> list[str]: ...


# ------------------------------------------------------------------------------------------------ prompts

_FIELDS = {
  "critique": ({"problem", "reference", "steps", "num_steps"}, {"steps"}),
  "verdict": ({"problem", "reference", "steps", "num_steps", "critique"}, {"critique"}),
  "step": ({"problem", "reference", "previous", "step", "step_number"}, {"step"}),
}


@dataclasses.dataclass(frozen=True)
class JudgePrompts:
  """The judge's prompt templates (str.format with named fields; write a literal brace as '{{' or '}}').

  critique: stage 1, fields {problem} {reference} {steps} {num_steps}.
  verdict: stage 2, the same fields plus {critique} (the stage 1 reply).
  step: thinking mode, fields {problem} {reference} {previous} {step} {step_number}.
  no_previous: what {previous} says before the first step.
  """

  critique: str
  verdict: str
  step: str
  no_previous: str = "(none)"

  def __post_init__(self):
    for name, (allowed, required) in _FIELDS.items():
      template = getattr(self, name)
      if not isinstance(template, str):
        raise ConfigError(f"JudgePrompts.{name} must be a string, found {type(template).__name__}")
      try:
        fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
      except ValueError as e:
        raise ConfigError(
          f"JudgePrompts.{name} is not a valid format string ({e}); write literal braces as '{{{{' and '}}}}'"
        ) from None
      if "" in fields or any(not f.isidentifier() for f in fields):
        raise ConfigError(f"JudgePrompts.{name}: use named fields only, found {sorted(fields)}")
      if fields - allowed:
        raise ConfigError(
          f"JudgePrompts.{name} uses unknown field(s) {sorted(fields - allowed)}; allowed: {sorted(allowed)}"
        )
      if required - fields:
        raise ConfigError(f"JudgePrompts.{name} must contain {sorted(required)}")

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> JudgePrompts:
    """From a plain mapping (e.g. `get_config().prompts.to_dict()`); ConfigError on missing or unknown keys."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - names
    if unknown:
      raise ConfigError(f"judge prompts: unknown key(s) {sorted(unknown)}; known: {sorted(names)}")
    missing = {n for n in _FIELDS if n not in values}
    if missing:
      raise ConfigError(f"judge prompts: missing key(s) {sorted(missing)}")
    return cls(**dict(values))


def reference_solution(problem: Problem | str) -> str:
  """The reference the judge sees: the task's correct steps (`Task.reference_steps`: a family's scripted solution, a
  math problem's worked solution cut into steps), then 'Final answer: X' with the true answer; the final answer line
  alone when the task has no steps for it (a math problem without a worked solution), so the prompt's 'Reference
  solution:' still shows what is right; a note when only the question is known."""
  if isinstance(problem, str):
    return "(no reference solution given)"
  try:
    steps = get_task(problem.domain).reference_steps(problem)
  except (ReprobeError, KeyError, IndexError, TypeError, ValueError):
    steps = []  # a problem without checker data (e.g. imported): the answer alone
  lines = [f"Step {k}: {body}" for k, body in enumerate(steps, start=1)]
  return "\n".join(lines + [f"Final answer: {problem.answer}"])


_STEP_PREFIX = re.compile(r"^\s*[-*]?\s*step\s*\d+\s*[:.]\s*", re.IGNORECASE)


def _numbered(texts: Sequence[str], start: int = 1) -> str:
  """'Step k: body' lines; the student's own '- Step k:' prefix is dropped so numbers are not doubled."""
  return "\n".join(f"Step {k}: {_STEP_PREFIX.sub('', t, count=1)}" for k, t in enumerate(texts, start=start))


# ------------------------------------------------------------------------------------------------ reply parsing

_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_DIGIT = re.compile(r"(?<![\w.])([01])(?!\w|\.\d)")


def _after_thinking(reply: str) -> str:
  """The reply after a reasoning model's last '</think>' (lists inside the thinking are drafts)."""
  cut = reply.rfind("</think>")
  return reply if cut < 0 else reply[cut + len("</think>") :]


def parse_verdict_list(reply: str, n: int) -> list[int] | None:
  """The judge's stage-2 list: the last bracketed Python list in the reply, of exactly `n` ints each 0 or 1;
  None when there is none, it holds anything else, or its length is not `n`."""
  for m in reversed(list(_BRACKETS.finditer(_after_thinking(reply or "")))):
    try:
      value = ast.literal_eval(m.group(0))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
      continue
    if not isinstance(value, list):
      continue
    ok = all(type(v) is int and v in (0, 1) for v in value)
    return value if ok and len(value) == n else None
  return None


def parse_verdict(reply: str) -> int | None:
  """A thinking-mode judge's single verdict: a one-element list '[0]'/'[1]' if the reply has one, else the last
  standalone digit 0 or 1 (not part of a number); None when there is none."""
  text = _after_thinking(reply or "")
  one = parse_verdict_list(text, 1)
  if one is not None:
    return one[0]
  found = _DIGIT.findall(text)
  return int(found[-1]) if found else None


def _label(verdict: int | None) -> float:
  """Judge verdict (1 = correct) -> label (1.0 = incorrect); None -> NaN."""
  return math.nan if verdict is None else float(1 - verdict)


# ------------------------------------------------------------------------------------------------ annotate


class _Item(NamedTuple):
  """One trajectory to judge."""

  record: Record
  texts: list[str]  # the aligned steps' texts
  question: str
  reference: str
  per_step: bool


def annotate_judge(
  records: Sequence[Record],
  problems: Mapping[str, Problem | str],
  backend: JudgeBackend,
  prompts: JudgePrompts,
  *,
  reference_fn: Callable[[Problem | str], str] = reference_solution,
  per_step: bool | None = None,
  keep_replies: bool = False,
) -> list[Record]:
  """New records labelled by an LLM judge (docs/method.md §A2(b)); `annotator` = 'judge:<backend name>'.

  problems: problem id -> Problem, or -> question text (for data without checker data). reference_fn gives the
    reference solution shown to the judge (default: the task's reference steps and the true answer).
  per_step: True = one call per step (the thinking-mode variant), False = two-stage over the whole trajectory;
    None = by each record's `mode` ('thinking' per step, otherwise two-stage).
  keep_replies: add `judge_replies` (the raw replies) to each record, for auditing.
  """
  items: list[_Item] = []
  references: dict[str, str] = {}  # N samples of a problem share its reference
  for index, record in enumerate(records):
    traj = as_trajectory(record, index)
    rid = record_id(record, index)
    pid = traj.problem_id
    if pid not in problems:
      raise DataFormatError(f"trajectory {rid}: problem {pid!r} is not among the {len(problems)} problems given")
    problem = problems[pid]
    question = problem if isinstance(problem, str) else problem.question
    step_mode = traj.mode == "thinking" if per_step is None else per_step
    if pid not in references:
      references[pid] = reference_fn(problem)
    items.append(_Item(record, [s.text for s in traj.steps], question, references[pid], step_mode))

  replies: list[dict] = [{} for _ in items]
  labels: list[list[float]] = [[] for _ in items]
  _two_stage(items, backend, prompts, labels, replies)
  _per_step(items, backend, prompts, labels, replies)

  name = f"judge:{getattr(backend, 'name', type(backend).__name__)}"
  out, unknown, total = [], 0, 0
  for item, lab, rep in zip(items, labels, replies):
    unknown += sum(math.isnan(v) for v in lab)
    total += len(lab)
    extra = {"judge_replies": rep} if keep_replies else {}
    out.append(labelled(item.record, lab, name, **extra))
  if total:
    logging.info("%s: %d of %d step labels unknown (unparseable or mismatched replies)", name, unknown, total)
  return out


def _complete(backend: JudgeBackend, prompts: list[str]) -> list[str]:
  if not prompts:
    return []
  replies = list(backend.complete(prompts))
  if len(replies) != len(prompts):
    raise JudgeBackendError(
      f"judge backend {getattr(backend, 'name', backend)!r} returned {len(replies)} replies for {len(prompts)} prompts"
    )
  return [r if isinstance(r, str) else "" for r in replies]


def _two_stage(items: list[_Item], backend, prompts: JudgePrompts, labels, replies) -> None:
  todo = [i for i, item in enumerate(items) if not item.per_step and item.texts]  # no steps: no call
  fields = {}
  for i in todo:
    item = items[i]
    fields[i] = dict(
      problem=item.question, reference=item.reference, steps=_numbered(item.texts), num_steps=len(item.texts)
    )
  critiques = _complete(backend, [prompts.critique.format(**fields[i]) for i in todo])
  # A reasoning judge's thinking is left out of stage 2: the critique is what it concluded.
  verdicts = _complete(
    backend, [prompts.verdict.format(critique=_after_thinking(c).strip(), **fields[i]) for i, c in zip(todo, critiques)]
  )
  for i, critique, verdict in zip(todo, critiques, verdicts):
    n = len(items[i].texts)
    parsed = parse_verdict_list(verdict, n)
    labels[i] = [math.nan] * n if parsed is None else [_label(v) for v in parsed]
    replies[i] = {"critique": critique, "verdict": verdict}


def _per_step(items: list[_Item], backend, prompts: JudgePrompts, labels, replies) -> None:
  where, batch = [], []
  for i, item in enumerate(items):
    if not item.per_step:
      continue
    labels[i] = [math.nan] * len(item.texts)
    replies[i] = {"steps": [""] * len(item.texts)}
    for k, text in enumerate(item.texts):
      previous = _numbered(item.texts[:k]) if k else prompts.no_previous
      batch.append(
        prompts.step.format(
          problem=item.question,
          reference=item.reference,
          previous=previous,
          step=_STEP_PREFIX.sub("", text, count=1),
          step_number=k + 1,
        )
      )
      where.append((i, k))
  for (i, k), reply in zip(where, _complete(backend, batch)):
    labels[i][k] = _label(parse_verdict(reply))
    replies[i]["steps"][k] = reply


# ------------------------------------------------------------------------------------------------ backends


class SelfJudge:
  """Self-annotation: the target model judges its own steps through our sampler (docs/method.md §A2(b); paper: T=0.7,
  top-k 20, top-p 0.95). Prompts go through the tokenizer's chat template when it has one, `batch_size` at a time.
  """

  name = "self"

  def __init__(
    self,
    lm: LanguageModel,
    sampling: SamplingParams = SamplingParams(0.7, 20, 0.95),
    *,
    max_new_tokens: int = 1024,
    seed: int = 0,
    batch_size: int = 8,
  ):
    if lm.tokenizer is None:
      raise ConfigError("SelfJudge needs a LanguageModel with a tokenizer")
    if max_new_tokens < 1 or batch_size < 1:
      raise ConfigError(f"SelfJudge: max_new_tokens and batch_size must be >= 1, found {max_new_tokens}, {batch_size}")
    self.lm, self.sampling, self.max_new_tokens, self.batch_size = lm, sampling, max_new_tokens, batch_size
    self.seed = check_seed(seed, "SelfJudge seed")
    self._calls = 0  # each call samples with fresh seeds, the same ones on every run

  def chat(self, prompt: str) -> str:
    tok = self.lm.tokenizer
    if getattr(tok, "chat_template", None):
      return tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    return prompt

  def complete(self, prompts: list[str]) -> list[str]:
    out = []
    base = self.seed + 1_000_003 * self._calls
    self._calls += 1
    for start in range(0, len(prompts), self.batch_size):
      chunk = [self.chat(p) for p in prompts[start : start + self.batch_size]]
      gen = self.lm.generate(chunk, self.sampling, max_new_tokens=self.max_new_tokens, seed=base + start)
      out.extend(self.lm.tokenizer.decode(gen.token_ids(row), skip_special_tokens=True) for row in range(len(chunk)))
    return out


class OpenAICompatibleJudge:
  """A judge behind an OpenAI-compatible chat API (vLLM, SGLang, llama.cpp server, hosted APIs), via urllib.

  Posts {"model", "messages": [user prompt], "temperature", "top_p"[, "max_tokens"]} to {base_url}/chat/completions
  and reads choices[0].message.content. Connection errors, timeouts, HTTP 429 and 5xx are retried `retries` times
  with exponential backoff; other HTTP errors fail at once. `max_workers` requests run at the same time.
  """

  def __init__(
    self,
    base_url: str,
    model: str,
    api_key: str | None = None,
    *,
    temperature: float = 0.7,
    top_p: float = 0.95,
    max_tokens: int | None = None,
    timeout: float = 120.0,
    retries: int = 3,
    backoff: float = 1.0,
    max_workers: int = 4,
  ):
    if not base_url or not base_url.startswith(("http://", "https://")):
      raise ConfigError(f"judge base_url must start with http:// or https://, found {base_url!r}")
    if retries < 1 or max_workers < 1 or timeout <= 0:
      raise ConfigError(
        f"judge: retries and max_workers must be >= 1 and timeout > 0, found {retries}, {max_workers}, {timeout}"
      )
    self.url = base_url.rstrip("/") + "/chat/completions"
    self.model, self.api_key = model, api_key
    self.temperature, self.top_p, self.max_tokens = temperature, top_p, max_tokens
    self.timeout, self.retries, self.backoff, self.max_workers = timeout, retries, backoff, max_workers
    self.name = f"openai:{model}"

  def _request(self, prompt: str) -> str:
    body: dict[str, Any] = {
      "model": self.model,
      "messages": [{"role": "user", "content": prompt}],
      "temperature": self.temperature,
      "top_p": self.top_p,
    }
    if self.max_tokens is not None:
      body["max_tokens"] = self.max_tokens
    headers = {"Content-Type": "application/json"}
    if self.api_key:
      headers["Authorization"] = f"Bearer {self.api_key}"
    data = json.dumps(body).encode()
    last = ""
    for attempt in range(self.retries):
      if attempt:
        time.sleep(self.backoff * 2 ** (attempt - 1))
      request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
      try:
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
          payload = response.read()
      except urllib.error.HTTPError as e:
        detail = e.read()[:300].decode("utf-8", "replace")
        last = f"HTTP {e.code} {e.reason}: {detail}"
        if e.code == 429 or e.code >= 500:
          continue
        raise JudgeBackendError(f"judge request to {self.url} failed: {last}") from None
      except (urllib.error.URLError, http.client.HTTPException, OSError) as e:  # incl. timeouts
        last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
        continue
      try:
        content = json.loads(payload)["choices"][0]["message"]["content"]
      except (ValueError, KeyError, IndexError, TypeError):
        raise JudgeBackendError(f"judge response from {self.url} is not a chat completion: {payload[:300]!r}") from None
      return content or ""
    raise JudgeBackendError(f"judge request to {self.url} failed after {self.retries} tries: {last}")

  def complete(self, prompts: list[str]) -> list[str]:
    if len(prompts) <= 1 or self.max_workers == 1:
      return [self._request(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(self.max_workers) as pool:
      return list(pool.map(self._request, prompts))
