"""SPAE step potentials: our batched probe against the released design's one request per boundary.

- Ours: `Prober.potentials`, every paragraph boundary x N samples of a chunk of trajectories in one jitted `probe`
  call that forks each trajectory's own KV cache at its boundaries (docs/method.md §B1; the question and earlier steps
  are fed through the model once per trajectory).
- The released design (cii030/SPAE-RL, inference/probe_mechanism_example.py): one completion request per step
  boundary, each re-sending the whole formatted prompt + the response truncated at the boundary + the probe suffix.
  Here each request is a fresh prefill of prompt + response[:cut + 1] (`Prober.teacher_forced_state` on that one
  truncated trajectory) and one `Prober.probe_state` call on that single boundary (cuts [[cut]], ordinals [[c]]),
  whose result the loop waits for before the next request, as the script waits for each HTTP reply.

Same model, same trajectories, boundaries, N, suffix and token budget; the c-th boundary of a trajectory draws its
samples from the same key on both sides (`prober.cut_keys`), so both give the same Acc and Conf: `compare` checks
that they agree within PARITY_TOL before it reports a ratio, so the ratio compares equal work.

Trajectories: thinking-mode samples of arithmetic problems from the model (`trajectories.prompt_text`, EOS dropped)
when its tokenizer has a `<think>` token (the built-in target); the task solver's thinking traces, teacher-forced,
on other tokenizers (SmolLM2 writes no thinking of its own); and random words split into paragraphs inside
`<think>` for a model without a tokenizer (bench.run's tiny random Llama, through `word_tokenizer`).

    python -m bench.spae [--model=<model dir | .gguf | smollm2>] [--trajectories=16] [--batch-size=16] [--out=DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

from bench.timing import time_call
from reprobe_jax.errors import ConfigError, ReprobeError
from reprobe_jax.models import LanguageModel, SamplingParams
from reprobe_jax.models.sampling import bucket
from reprobe_jax.spae.potential import ProbeConfig, StepPotentials, step_potential
from reprobe_jax.spae.prober import CUT_STEP, Prober, cut_columns

PARITY_TOL = 1e-3  # largest |Acc| or |Conf| difference between the two sides (float32 in different batch shapes)
DIFFICULTY = 2
THINKING_NEW_TOKENS = 192  # the built-in target's thinking-mode budget (configs/target_synthetic.py)
TARGET_CONFIG = "configs/target_synthetic.py"
SPECIAL_WORDS = ("<pad>", "<think>", "</think>", ".\n\n", "}", "**Final", "Answer**", "\\boxed{")


@dataclasses.dataclass(frozen=True)
class ThinkingSet:
  """Thinking trajectories to probe: prompt and response ids (no EOS) per trajectory, its true answer and seed."""

  prompt_ids: tuple[tuple[int, ...], ...]
  response_ids: tuple[tuple[int, ...], ...]
  answers: tuple[str, ...]
  seeds: tuple[int, ...]
  source: str  # 'sampled', 'traces' or 'random words'
  dropped: int = 0  # sampled trajectories left out: no `<think>` or no boundary before `</think>`

  def __len__(self) -> int:
    return len(self.response_ids)


def default_model() -> str:
  """The built-in target's model folder: `<workdir>/<build hash>/model` of configs/target_synthetic.py, as
  `python train.py --config=configs/target_synthetic.py` builds it (the other bench cases' built-in target)."""
  import importlib.util

  from reprobe_jax.jobs.target_config import config_from_dict

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  spec = importlib.util.spec_from_file_location("target_synthetic", os.path.join(root, TARGET_CONFIG))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  return os.path.join(c.workdir, config_from_dict(c).key(), "model")


def word_tokenizer(vocab_size: int):
  """A WordLevel tokenizer over `vocab_size` ids for a model without one: the words a probe needs (`<think>`,
  `</think>`, the paragraph end `.\\n\\n`, `}` and the suffix's words) then 'w{i}'."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  if vocab_size <= len(SPECIAL_WORDS) + 8:
    raise ConfigError(f"bench.spae: a vocabulary of {vocab_size} ids is too small for the word tokenizer")
  words = list(SPECIAL_WORDS) + [f"w{i}" for i in range(len(SPECIAL_WORDS), vocab_size)]
  tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")


def with_tokenizer(lm: LanguageModel) -> LanguageModel:
  """`lm` itself, or the same weights with `word_tokenizer` when it has no tokenizer."""
  if lm.tokenizer is not None:
    return lm
  return lm.sharing_weights(tokenizer=word_tokenizer(lm.config.vocab_size))


def _random_words(lm: LanguageModel, n: int, seed: int) -> ThinkingSet:
  tok = lm.tokenizer
  think, close, par = (tok.convert_tokens_to_ids(w) for w in ("<think>", "</think>", ".\n\n"))
  rng = np.random.default_rng(seed)
  words = np.arange(len(SPECIAL_WORDS), lm.config.vocab_size)
  prompts, responses, answers = [], [], []
  for i in range(n):
    prompts.append(tuple(rng.choice(words, size=8 + 4 * (i % 3)).tolist()))
    ids = [think]
    for _ in range(2 + i % 5):  # paragraphs
      ids += rng.choice(words, size=int(rng.integers(3, 9))).tolist() + [par]
    responses.append(tuple(ids + [close]))
    answers.append(f"w{int(rng.choice(words))}")
  return ThinkingSet(tuple(prompts), tuple(responses), tuple(answers), tuple(range(n)), "random words")


SOURCES = ("sampled", "traces", "random words")


def thinking_set(
  lm: LanguageModel, n: int, *, source: str | None = None, seed: int = 0, max_new_tokens: int = THINKING_NEW_TOKENS
) -> ThinkingSet:
  """`n` thinking trajectories for `lm` (module docstring). source: 'sampled' (default when the tokenizer has a
  `<think>` token), 'traces' (the default otherwise) or 'random words' (a `word_tokenizer` model)."""
  from reprobe_jax import tasks
  from reprobe_jax.trajectories import prompt_text

  if lm.tokenizer is None:
    raise ConfigError("bench.spae: the model needs a tokenizer (wrap it with bench.spae.with_tokenizer)")
  prober = Prober(lm)
  source = source or ("sampled" if prober.think_id is not None else "traces")
  if source not in SOURCES:
    raise ConfigError(f"bench.spae: source must be one of {SOURCES}, got {source!r}")
  if source == "random words":
    return _random_words(lm, n, seed)
  problems = tasks.make_problems("arithmetic", n, seed=seed, difficulty=DIFFICULTY)
  prompts = [prompt_text(lm, p, "thinking") for p in problems]
  prompt_ids = [tuple(ids) for ids in lm.encode(prompts)]
  if source == "traces":
    rng = np.random.default_rng(seed)
    traces = [tasks.solve(p, "arithmetic", rng, "thinking").text for p in problems]
    responses = [tuple(lm.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in traces]
    return ThinkingSet(tuple(prompt_ids), tuple(responses), tuple(p.answer for p in problems), tuple(range(n)), source)
  gen = lm.generate(prompts, SamplingParams(temperature=1.0), max_new_tokens=max_new_tokens, seed=seed)
  eos = np.asarray(lm.eos_mask())
  rows, responses = [], []
  for row in range(gen.tokens.shape[0]):
    ids = gen.token_ids(row)
    ids = tuple(ids[:-1] if ids and eos[ids[-1]] else ids)
    if prober.think_id in ids:
      rows.append(row)
      responses.append(ids)
  cuts = prober.boundaries(responses)
  kept = [k for k in range(len(rows)) if len(cuts[k])]
  if not kept:
    raise ConfigError(f"bench.spae: none of the {n} sampled trajectories holds a thinking boundary")
  idx = [gen.prompt_index[rows[k]] for k in kept]
  return ThinkingSet(
    tuple(prompt_ids[i] for i in idx),
    tuple(responses[k] for k in kept),
    tuple(problems[i].answer for i in idx),
    tuple(rows[k] for k in kept),
    source,
    dropped=n - len(kept),
  )


PARAGRAPH_TOKENS = (15, 25)  # long trajectories: a boundary every 15-25 tokens, as in R1-style traces
PROBLEMS_PER_TOKEN = 1 / 30  # solver problems drawn per response token (each gives ~50-80 tokens of paragraphs)


def _solver_paragraphs(lm: LanguageModel, problems, rng) -> list[list[int]]:
  """Token ids of paragraphs made of the solver's thinking sentences (steps, 'So the answer is', re-checks) of
  `problems`, consecutive sentences joined until a paragraph holds PARAGRAPH_TOKENS[0] tokens, each ending '.\\n\\n'."""
  from reprobe_jax import tasks
  from reprobe_jax.tasks.response import parse_thinking

  tok = lm.tokenizer
  out, group = [], []
  for p in problems:
    for sentence in parse_thinking(tasks.solve(p, "arithmetic", rng, "thinking").text)[0]:
      group.append(sentence)
      ids = list(tok(" ".join(group) + "\n\n", add_special_tokens=False)["input_ids"])
      if len(ids) >= PARAGRAPH_TOKENS[0]:
        out.append(ids)
        group = []
  return out


def _word_paragraphs(lm: LanguageModel, count: int, rng) -> list[list[int]]:
  par = lm.tokenizer.convert_tokens_to_ids(".\n\n")
  words = np.arange(len(SPECIAL_WORDS), lm.config.vocab_size)
  lo, hi = PARAGRAPH_TOKENS
  return [rng.choice(words, size=int(rng.integers(lo, hi))).tolist() + [par] for _ in range(count)]


def is_word_tokenizer(lm: LanguageModel) -> bool:
  """Whether `lm` carries `word_tokenizer` (its first ids are SPECIAL_WORDS)."""
  tok = lm.tokenizer
  return tok is not None and tok.convert_ids_to_tokens(list(range(len(SPECIAL_WORDS)))) == list(SPECIAL_WORDS)


def long_set(lm: LanguageModel, n: int, length: int, *, seed: int = 0) -> ThinkingSet:
  """`n` thinking trajectories of at most `length` response tokens (within one paragraph of it): `<think>`, then
  paragraphs of PARAGRAPH_TOKENS tokens each ending '.\\n\\n' (the task solver's thinking sentences of many arithmetic
  problems; random words on a `word_tokenizer` model), then `</think>`. Not a coherent trace (a throughput
  measurement: both sides compute the same potentials); prompt and answer are those of the trajectory's first
  problem (random words on a `word_tokenizer` model)."""
  from reprobe_jax import tasks
  from reprobe_jax.trajectories import prompt_text

  if lm.tokenizer is None:
    raise ConfigError("bench.spae: the model needs a tokenizer (wrap it with bench.spae.with_tokenizer)")
  tok, words = lm.tokenizer, is_word_tokenizer(lm)
  open_ids = list(tok("<think>\n", add_special_tokens=False)["input_ids"])
  close_ids = list(tok("</think>", add_special_tokens=False)["input_ids"])
  if length < len(open_ids) + len(close_ids) + PARAGRAPH_TOKENS[1]:
    raise ConfigError(
      f"bench.spae: a thinking length of {length} tokens holds no paragraph of up to {PARAGRAPH_TOKENS[1]} tokens"
    )
  rng = np.random.default_rng(seed)
  per = int(length * PROBLEMS_PER_TOKEN) + 4
  problems = tasks.make_problems("arithmetic", n * per, seed=seed, difficulty=DIFFICULTY)
  vocab = np.arange(len(SPECIAL_WORDS), lm.config.vocab_size)
  prompts, responses, answers = [], [], []
  for i in range(n):
    own = problems[i * per : (i + 1) * per]
    if words:
      pars = _word_paragraphs(lm, length // PARAGRAPH_TOKENS[0] + 1, rng)
      prompts.append(tuple(rng.choice(vocab, size=8).tolist()))
      answers.append(f"w{int(rng.choice(vocab))}")
    else:
      pars = _solver_paragraphs(lm, own, rng)
      prompts.append(tuple(lm.encode([prompt_text(lm, own[0], "thinking")])[0]))
      answers.append(own[0].answer)
    ids = list(open_ids)
    for par in pars:
      if len(ids) + len(par) + len(close_ids) > length:
        break
      ids += par
    responses.append(tuple(ids + close_ids))
  return ThinkingSet(
    tuple(prompts),
    tuple(responses),
    tuple(answers),
    tuple(range(n)),
    "random-word paragraphs" if words else "solver paragraphs",
  )


# ------------------------------------------------------------------------------------------------ the two sides


def per_boundary(prober: Prober, data: ThinkingSet, stride: int = 1) -> list[StepPotentials]:
  """The released design: per trajectory, per boundary c (cut = its last response token), one request: a fresh
  prefill of prompt + response[:cut + 1], batch 1, and the probe of that one boundary (ordinal c, so it draws the
  batched path's random streams); the loop waits for each reply. Host preparation as `Prober.potentials` does.
  stride > 1: only boundaries c = 0, stride, 2 stride, ... (each request is independent of the others, so its
  boundaries/s is that of the whole loop; a long trajectory's loop is timed in minutes, not hours)."""
  import jax

  prober.check_thinking(data.response_ids)
  answers = prober.answer_ids(data.answers)
  cuts = [c[::stride] for c in prober.boundaries(data.response_ids)]
  out = []
  for prompt, response, ans, seed, cut_i in zip(data.prompt_ids, data.response_ids, answers, data.seeds, cuts):
    acc, conf = np.zeros(len(cut_i)), np.zeros(len(cut_i))
    for k, cut in enumerate(cut_i):
      state = prober.teacher_forced_state([prompt], [response[: cut + 1]])
      a, f = jax.device_get(
        prober.probe_state(state, np.array([[cut]], np.int32), np.array([[k * stride]], np.int32), [ans], [seed])
      )
      acc[k], conf[k] = a[0, 0], f[0, 0]
    out.append(StepPotentials(np.asarray(cut_i, np.int64), acc, conf, step_potential(acc, conf), prober.cfg.eps_sat))
  return out


def every(pots: list[StepPotentials], stride: int) -> list[StepPotentials]:
  """Boundaries 0, stride, 2 stride, ... of each trajectory's potentials (what `per_boundary(..., stride)` probes)."""
  return [StepPotentials(p.cuts[::stride], p.acc[::stride], p.conf[::stride], p.phi[::stride], p.eps_sat) for p in pots]


def batched(prober: Prober, data: ThinkingSet) -> list[StepPotentials]:
  """Ours: `Prober.potentials` over the whole set (chunks of `ProbeConfig.batch_size` trajectories)."""
  return prober.potentials(data.prompt_ids, data.response_ids, data.answers, data.seeds)


def parity(ours: list[StepPotentials], ref: list[StepPotentials]) -> dict:
  """Largest |Acc| and |Conf| differences over every boundary (NaN on both sides counts as equal)."""

  def gap(x, y):
    return float(
      max((np.nanmax(np.abs(a - b)) if np.isfinite(a - b).any() else 0.0 for a, b in zip(x, y)), default=0.0)
    )

  same_nan = all(
    np.array_equal(np.isnan(o.phi), np.isnan(r.phi)) and np.array_equal(o.cuts, r.cuts) for o, r in zip(ours, ref)
  )
  acc, conf = gap([o.acc for o in ours], [r.acc for r in ref]), gap([o.conf for o in ours], [r.conf for r in ref])
  return {
    "acc_max_abs": acc,
    "conf_max_abs": conf,
    "same_boundaries": same_nan,
    "tolerance": PARITY_TOL,
    "equal": same_nan and max(acc, conf) <= PARITY_TOL,
  }


def probe_slots(cuts: list[np.ndarray], response_lens: list[int], batch_size: int) -> int:
  """Boundary slots the batched path computes, padding included: `Prober.potentials` sorts the trajectories by
  boundary count and probes chunks of `batch_size` as [bucket(b), max boundaries rounded up to CUT_STEP] grids (each
  slot N + 1 rows), so this is the work it does against the real boundaries (the per-boundary loop computes one
  slot each)."""
  order = sorted(range(len(cuts)), key=lambda i: (len(cuts[i]), response_lens[i]))
  total = 0
  for start in range(0, len(order), batch_size):
    idx = [i for i in order[start : start + batch_size] if len(cuts[i])]
    if idx:
      total += bucket(len(idx), minimum=1) * cut_columns(max(len(cuts[i]) for i in idx))
  return total


def token_positions(prober: Prober, data: ThinkingSet, cuts: list[np.ndarray]) -> dict:
  """The token positions each side feeds through the model (no padding): the context (ours: prompt + response once
  per trajectory; the loop: prompt + response[:cut + 1] at every boundary) and the probe's, the same on both sides
  per boundary: the boundary token again, the suffix, the teacher-forced answer (paper reading) and N x max_tokens
  sampled positions (a sampling step runs for every row until the last closes). ratio = reference / ours is what
  the speedup tends to where time is proportional to positions (large models, long contexts)."""
  cfg = prober.cfg
  answers = prober.answer_ids(data.answers)
  probe_each = [
    1 + len(prober.suffix_ids) + (len(a) if cfg.reading == "paper" else 0) + cfg.samples * cfg.max_tokens
    for a in answers
  ]
  probe = int(sum(w * len(c) for w, c in zip(probe_each, cuts)))
  ours = int(sum(len(p) + len(r) for p, r in zip(data.prompt_ids, data.response_ids))) + probe
  ref = int(sum(len(p) + int(c) + 1 for p, cut_i in zip(data.prompt_ids, cuts) for c in cut_i)) + probe
  # padding included: prompts to bucket(P) (min 16), forced responses to bucket(len), ours in chunks of batch_size
  # (bucket(b) rows, boundaries to CUT_STEP), each slot's probe as long as the chunk's longest answer's
  w_max = max(probe_each)
  resp_len = [len(r) for r in data.response_ids]
  order = sorted(range(len(cuts)), key=lambda i: (len(cuts[i]), resp_len[i]))
  ours_pad = 0
  for start in range(0, len(order), cfg.batch_size):
    idx = [i for i in order[start : start + cfg.batch_size] if len(cuts[i])]
    if idx:
      ours_pad += bucket(len(idx), minimum=1) * (
        bucket(max(len(data.prompt_ids[i]) for i in idx)) + bucket(max(resp_len[i] for i in idx), minimum=1)
      )
  ours_pad += probe_slots(cuts, resp_len, cfg.batch_size) * w_max
  ref_pad = int(
    sum(
      bucket(len(p)) + bucket(int(c) + 1, minimum=1) + w
      for p, cut_i, w in zip(data.prompt_ids, cuts, probe_each)
      for c in cut_i
    )
  )
  return {
    "probe_per_boundary_mean": float(np.mean(probe_each)),
    "probe": probe,
    "ours": ours,
    "reference": ref,
    "ratio": ref / ours,
    "padded": {"ours": ours_pad, "reference": ref_pad, "ratio": ref_pad / ours_pad},
  }


def _side(timing, boundaries: int, samples: int) -> dict:
  return {
    "boundaries_per_s": boundaries / timing.median_s,
    "continuations_per_s": boundaries * samples / timing.median_s,
    **timing.to_json(),
  }


def compare(
  lm: LanguageModel, data: ThinkingSet, cfg: ProbeConfig, repeats: int, log=print, reference_stride: int = 1
) -> dict:
  """Times both sides on `data` (each warmed up by one untimed call that compiles its shapes), checks that they
  give the same Acc and Conf (raises ReprobeError otherwise), and returns the 'spae' section of bench.run.
  reference_stride > 1 times the loop on every stride-th boundary only (`per_boundary`; its boundaries/s)."""
  if reference_stride < 1:
    raise ConfigError(f"bench.spae: reference_stride must be >= 1, got {reference_stride}")
  prober = Prober(lm, cfg)
  cuts = prober.boundaries(data.response_ids)
  n_bound = int(sum(len(c) for c in cuts))
  n_ref = int(sum(len(c[::reference_stride]) for c in cuts))
  load = os.getloadavg()[0]
  t_ours, ours = time_call(lambda: batched(prober, data), repeats)
  log(f"  batched: {n_bound / t_ours.median_s:.1f} boundaries/s (first call {t_ours.first_s:.1f} s)")
  t_ref, ref = time_call(lambda: per_boundary(prober, data, reference_stride), repeats)
  log(f"  per-boundary loop: {n_ref / t_ref.median_s:.1f} boundaries/s (first call {t_ref.first_s:.1f} s)")
  par = parity(every(ours, reference_stride), ref)
  if not par["equal"]:
    raise ReprobeError(
      f"bench.spae: the batched potentials and the per-boundary loop disagree (Acc by "
      f"{par['acc_max_abs']:.2e}, Conf by {par['conf_max_abs']:.2e}, tolerance {PARITY_TOL:g}; "
      f"same boundaries: {par['same_boundaries']}): the ratio would not compare equal work"
    )
  prompt_len = [len(p) for p in data.prompt_ids]
  resp_len = [len(r) for r in data.response_ids]
  ours_side, ref_side = _side(t_ours, n_bound, cfg.samples), _side(t_ref, n_ref, cfg.samples)
  ref_side["boundaries_timed"] = n_ref
  return {
    "name": "spae_potential",
    "title": "SPAE step potentials: batched probe (every boundary x N samples of a "
    "chunk in one jitted call, forking each trajectory's cache) vs one request per boundary with the prefix "
    "re-sent (the released design)",
    "source": data.source,
    "trajectories": len(data),
    "dropped": data.dropped,
    "boundaries": n_bound,
    "samples": cfg.samples,
    "max_tokens": cfg.max_tokens,
    "batch_size": cfg.batch_size,
    "reading": cfg.reading,
    "reference_stride": reference_stride,
    "load_1min_start": load,
    "prompt_tokens_mean": float(np.mean(prompt_len)),
    "response_tokens_mean": float(np.mean(resp_len)),
    # context tokens fed through the model before probing: once per trajectory, against once per boundary
    "prefill_tokens": {
      "ours": int(sum(prompt_len) + sum(resp_len)),
      "reference": int(sum(p + int(c) + 1 for p, cut_i in zip(prompt_len, cuts) for c in cut_i)),
    },
    "token_positions": token_positions(prober, data, cuts),
    "ours_probe_slots": probe_slots(cuts, resp_len, cfg.batch_size),
    "answer_tokens_max": int(max(len(a) for a in prober.answer_ids(data.answers))),
    "ours": ours_side,
    "reference": ref_side,
    "ratio": ours_side["boundaries_per_s"] / ref_side["boundaries_per_s"],
    "ratio_of_min_times": (ref_side["min_s"] / n_ref) / (ours_side["min_s"] / n_bound),
    "parity": par,
    "mean_phi": float(np.nanmean(np.concatenate([o.phi for o in ours]))) if n_bound else None,
  }


def run_all(
  lm: LanguageModel,
  *,
  trajectories: int,
  repeats: int,
  cfg: ProbeConfig = ProbeConfig(),
  source: str | None = None,
  seed: int = 0,
  log=print,
) -> dict:
  """The SPAE section of bench.run on one model (a model without a tokenizer probes random words)."""
  if lm.tokenizer is None:
    lm, source = with_tokenizer(lm), "random words"
  data = thinking_set(lm, trajectories, source=source, seed=seed)
  log(f"SPAE potentials: {len(data)} trajectories ({data.source}), N={cfg.samples}, batch_size={cfg.batch_size}")
  return compare(lm, data, cfg, repeats, log=log)


def run_long(
  lm: LanguageModel,
  *,
  lengths,
  trajectories: int,
  repeats: int,
  cfg: ProbeConfig = ProbeConfig(),
  reference_stride: int = 1,
  seed: int = 0,
  log=print,
) -> dict:
  """The long-trajectory section: `compare` on `long_set(lm, trajectories, L)` for each L of `lengths` (a model
  without a tokenizer gets `word_tokenizer` and random-word paragraphs), one row per L."""
  if lm.tokenizer is None:
    lm = with_tokenizer(lm)
  rows = []
  for length in lengths:
    data = long_set(lm, trajectories, int(length), seed=seed)
    log(f"SPAE potentials, thinking of {length} tokens: {len(data)} trajectories ({data.source})")
    rows.append({"length": int(length), **compare(lm, data, cfg, repeats, log=log, reference_stride=reference_stride)})
  return {
    "name": "spae_long",
    "title": "SPAE step potentials on long thinking (a boundary every "
    f"{PARAGRAPH_TOKENS[0]}-{PARAGRAPH_TOKENS[1]} tokens): batched probe vs one request per boundary",
    "trajectories": trajectories,
    "repeats": repeats,
    "reference_stride": reference_stride,
    "rows": rows,
  }


# ------------------------------------------------------------------------------------------------ CLI


def markdown(section: dict) -> list[str]:
  """The section as Markdown lines (bench.run's results.md and this CLI's spae.md)."""
  o, r = section["ours"], section["reference"]
  p = section["parity"]
  return [
    "## SPAE step potentials",
    "",
    f"{section['trajectories']} thinking trajectories ({section['source']}), {section['boundaries']} boundaries, "
    f"N={section['samples']} continuations of at most {section['max_tokens']} tokens each "
    f"({section['reading']} reading; batched in chunks of {section['batch_size']} trajectories). Context tokens "
    f"prefilled: {section['prefill_tokens']['ours']} (ours, once per trajectory) against "
    f"{section['prefill_tokens']['reference']} (once per boundary); boundary slots probed: "
    f"{section['ours_probe_slots']} (ours, chunk padding included) against {section['boundaries']}.",
    "",
    "| side | boundaries/s | continuations/s | median s | min s | first call / XLA compile (s) |",
    "|---|---|---|---|---|---|",
    *[
      f"| {name} | {s['boundaries_per_s']:.1f} | {s['continuations_per_s']:.1f} | {s['median_s']:.3f} | "
      f"{s['min_s']:.3f} | {s['first_call_s']:.1f} / {s['xla_compile_s']:.1f} |"
      for name, s in (("reprobe-jax, batched", o), ("one request per boundary", r))
    ],
    "",
    f"Batched / per-boundary: **{section['ratio']:.2f}x** ({section['ratio_of_min_times']:.2f}x on the fastest "
    f"repeats). Same Acc and Conf on both sides: within {p['acc_max_abs']:.1e} and {p['conf_max_abs']:.1e}.",
  ]


def long_markdown(section: dict) -> list[str]:
  """The long-trajectory section as Markdown lines (bench.run's results.md and this CLI's spae.md)."""
  rows = section["rows"]
  if not rows:
    return []
  r0 = rows[0]
  lines = [
    "## SPAE step potentials on long thinking",
    "",
    f"{section['trajectories']} trajectories per length ({r0['source']}: a boundary every "
    f"{PARAGRAPH_TOKENS[0]}-{PARAGRAPH_TOKENS[1]} tokens), N={r0['samples']} continuations of at most "
    f"{r0['max_tokens']} tokens, batched in chunks of {r0['batch_size']}; {section['repeats']} timed repeats "
    "(median). Context tokens: prompt + response fed through the model (ours once per trajectory, the loop "
    "once per boundary). Token positions: context + the probe's (the same per boundary on both sides); their "
    "ratio is the speedup where time is proportional to positions (padded: as computed, prompts and forced "
    "blocks to powers of two, ours in chunk grids)."
    + (
      f" The loop is timed on every {section['reference_stride']}-th boundary."
      if section["reference_stride"] > 1
      else ""
    ),
    "",
    "| thinking tokens (mean) | boundaries (loop timed) | context tokens ours / loop | token positions ours / "
    "loop (ratio) | ours boundaries/s | loop boundaries/s | **ratio** (min times) | 1-min load |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    tp = r["token_positions"]
    lines.append(
      f"| {r['length']} ({r['response_tokens_mean']:.0f}) | {r['boundaries']} "
      f"({r['reference']['boundaries_timed']}) | {r['prefill_tokens']['ours']:,} / "
      f"{r['prefill_tokens']['reference']:,} | {tp['ours']:,} / {tp['reference']:,} ({tp['ratio']:.1f}x; "
      f"padded {tp['padded']['ratio']:.1f}x) | "
      f"{r['ours']['boundaries_per_s']:.1f} | {r['reference']['boundaries_per_s']:.1f} | "
      f"**{r['ratio']:.2f}x** ({r['ratio_of_min_times']:.2f}x) | {r['load_1min_start']:.2f} -> "
      f"{r['reference']['load_1min']:.2f} |"
    )
  worst = max(max(r["parity"]["acc_max_abs"], r["parity"]["conf_max_abs"]) for r in rows)
  return lines + ["", f"Same Acc and Conf on both sides at every timed boundary: within {worst:.1e}."]


def parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m bench.spae", description=__doc__.split("\n\n")[0])
  p.add_argument(
    "--model", default=None, help=f"model folder, .gguf or 'smollm2' (default: the built-in target of {TARGET_CONFIG})"
  )
  p.add_argument("--trajectories", type=int, default=16, help="arithmetic problems, one trajectory each")
  p.add_argument("--batch-size", type=int, default=ProbeConfig.batch_size, help="ProbeConfig.batch_size (ours)")
  p.add_argument(
    "--source",
    default=None,
    choices=SOURCES,
    help="trajectories (default: sampled on a model with a <think> token, solver traces otherwise)",
  )
  p.add_argument("--repeats", type=int, default=5, help="timed repeats of each side (median)")
  p.add_argument(
    "--lengths",
    default=None,
    help="comma-separated thinking lengths in tokens: times long "
    "trajectories of solver paragraphs (`long_set`) instead of the sampled / traced ones",
  )
  p.add_argument(
    "--reference-stride",
    type=int,
    default=1,
    help="with --lengths: time the per-boundary loop on every k-th boundary only",
  )
  p.add_argument("--out", default="bench_results", help="writes spae.json and spae.md here")
  return p.parse_args(argv)


def parse_lengths(text: str) -> tuple[int, ...]:
  """'256,512' -> (256, 512); ConfigError naming --lengths otherwise."""
  try:
    out = tuple(int(x) for x in text.split(",") if x.strip())
  except ValueError:
    raise ConfigError(f"--lengths: expected comma-separated token counts, got {text!r}") from None
  if not out or min(out) < 1:
    raise ConfigError(f"--lengths: expected positive token counts, got {text!r}")
  return out


def main(argv=None) -> int:
  from reprobe_jax.eval.machine import describe
  from reprobe_jax.models import load_pretrained, resolve_path, smollm2_gguf_path

  args = parse_args(sys.argv[1:] if argv is None else argv)
  try:
    if args.trajectories < 1 or args.repeats < 1:
      raise ConfigError(f"--trajectories and --repeats must be >= 1, got {args.trajectories} and {args.repeats}")
    model = args.model or default_model()
    path = smollm2_gguf_path() if model == "smollm2" else resolve_path(model)
    if not os.path.exists(path):
      raise ConfigError(
        f"--model={model}: no such model folder (build the built-in target with `python train.py "
        f"--config={TARGET_CONFIG}`, or pass --model)"
      )
    t0 = time.perf_counter()
    load = os.getloadavg()
    lengths = parse_lengths(args.lengths) if args.lengths is not None else None
    lm = load_pretrained(path, dtype="float32")
    cfg = ProbeConfig(batch_size=args.batch_size)
    if lengths is None:
      key, section = (
        "spae",
        run_all(lm, trajectories=args.trajectories, repeats=args.repeats, cfg=cfg, source=args.source),
      )
    else:
      key, section = (
        "spae_long",
        run_long(
          lm,
          lengths=lengths,
          trajectories=args.trajectories,
          repeats=args.repeats,
          cfg=cfg,
          reference_stride=args.reference_stride,
        ),
      )
  except ReprobeError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  result = {
    "model": model,
    "source_path": path,
    "machine": str(describe()),
    "load_start": list(load),
    "load_end": list(os.getloadavg()),
    "wall_s": time.perf_counter() - t0,
    key: section,
  }
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "spae.json"), "w") as f:
    json.dump(result, f, indent=2)
  lines = (markdown(section) if key == "spae" else long_markdown(section)) + [
    "",
    f"{result['machine']}; 1-min load {load[0]:.2f} at start, {result['load_end'][0]:.2f} at end; "
    f"{args.repeats} repeats.",
  ]
  with open(os.path.join(args.out, "spae.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
