"""Step-level beam search (docs/method.md §A7) against a search-and-learn-style loop in PyTorch `transformers`, and
against our own Best-of-N at the same number of sampled steps.

The reference runs as search-and-learn does (one problem at a time, the scorer re-reading whole texts): per problem,
per round, per live beam, HF `generate` samples N candidate next steps (num_return_sequences=N, stopped at the step
boundary by a StoppingCriteria), then each candidate's whole text (prompt + every step so far) gets one full forward
of the same model, batch 1, whose log-probs of the newest step's tokens give its score (perplexity: -mean log p,
the `perplexity` scorer's definition); the top B of the candidates are kept, finished beams hold their slots.
Ours is `beam_search` with the `perplexity` scorer over all problems at once: the scorer reads the log-probs the
decode already captured, so both sides score the same quantity and, greedy, select the same steps.

The reference's stop rule is our StopTable run on the host (the same automaton, so both sides end a step on the same
token), its finish rules ours (EOS, an '<Answer>' line, the max_steps-th step, the trajectory's token budget).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from bench import sharded
from bench.pair import Pair
from bench.timing import time_call
from reprobe_jax.errors import ConfigError
from reprobe_jax.models import LanguageModel
from reprobe_jax.scorers import get_scorer
from reprobe_jax.steps import ANSWER_PREFIX, ENDS_BEFORE, StepBoundary
from reprobe_jax.tts import SearchConfig
from reprobe_jax.tts.beam import beam_search
from reprobe_jax.tts.best_of_n import best_of_n

SCORER = "perplexity"
LINE_WORD_EVERY = 4  # the tiny model's word vocabulary: every 4th word ends a line


def _torch():
  import torch

  return torch


# ------------------------------------------------------------------------------------------------ target and prompts


def word_tokenizer(vocab_size: int):
  """A WordLevel tokenizer over `vocab_size` words for the tiny random Llama (which has none): id i is 'w{i}', or
  'w{i}.\\n' for every LINE_WORD_EVERY-th id, so a random model takes line steps of a few tokens."""
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  words = ["<pad>"] + [
    f"w{i}.\n" if i % LINE_WORD_EVERY == LINE_WORD_EVERY - 1 else f"w{i}" for i in range(1, vocab_size)
  ]
  tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>")


def target(pair: Pair, n_problems: int, seed: int = 0) -> tuple[LanguageModel, list[list[int]], str]:
  """(the searched model, prompt ids per problem, what the prompts are). With a tokenizer: arithmetic problems of
  the synthetic world, prompted by `trajectories.prompt_text` in line mode (chat-formatted where the tokenizer has a
  template, plain text otherwise); without one (the tiny random model): the word tokenizer above and prompts of
  random words that end no line."""
  lm = pair.lm
  if pair.tokenizer is not None:
    from reprobe_jax import tasks
    from reprobe_jax.trajectories import prompt_text

    problems = tasks.make_problems("arithmetic", n_problems, seed=seed, difficulty=2)
    return lm, lm.encode([prompt_text(lm, p, "line") for p in problems]), "arithmetic problems (prompt_text, line mode)"
  lm = lm.sharing_weights(tokenizer=word_tokenizer(lm.config.vocab_size))
  rng = np.random.default_rng(seed)
  words = np.array([i for i in range(1, lm.config.vocab_size) if i % LINE_WORD_EVERY != LINE_WORD_EVERY - 1])
  prompts = [rng.choice(words, size=8 + 4 * (i % 3)).tolist() for i in range(n_problems)]
  return lm, prompts, "random words (tiny model, word tokenizer)"


# ------------------------------------------------------------------------------------------------ the reference


@dataclasses.dataclass
class RefBeam:
  """One beam of the reference: response ids (a step that ended before its last token leaves that token here, as
  the next step's first), the selected steps' spans and scores, the stop automaton's state after the response."""

  response: list[int]
  spans: list[tuple[int, int]]
  scores: list[float]
  stop_state: int
  reason: str | None = None  # None while live

  @property
  def step_end(self) -> int:
    return self.spans[-1][1] if self.spans else 0

  @property
  def last(self) -> float:
    return self.scores[-1] if self.scores else math.nan


def _stop_criteria(transitions: np.ndarray, ends: np.ndarray, eos: np.ndarray, states: np.ndarray, start: int):
  """A StoppingCriteria that runs the step boundary's StopTable per row (from the beams' automaton states [N]) over
  the tokens generate appends after `start`; it records where each row's step ended."""
  import transformers

  torch = _torch()

  class StepStop(transformers.StoppingCriteria):
    def __init__(self):
      self.q = states.copy()
      self.stop = np.full(states.shape, -1)  # response length at the stop (-1: not stopped)
      self.before = np.zeros(states.shape, bool)  # the stop token opens the next step
      self.eos = np.zeros(states.shape, bool)

    def __call__(self, input_ids, scores, **kwargs):
      tok = input_ids[:, -1].cpu().numpy()
      live = self.stop < 0
      e = ends[self.q, tok]
      self.q = np.where(live, transitions[self.q, tok], self.q)
      is_eos = live & eos[tok]
      hit = live & (is_eos | (e != 0))
      self.stop[hit] = input_ids.shape[1] - start
      self.before |= hit & ~is_eos & ((e & ENDS_BEFORE) != 0)
      self.eos |= is_eos
      return torch.from_numpy(self.stop >= 0).to(input_ids.device)

  return StepStop()


def _is_answer(tokenizer, ids) -> bool:
  prefix = ANSWER_PREFIX["line"]
  return any(line.lstrip(" \t\r\f\v").lower().startswith(prefix) for line in tokenizer.decode(ids).split("\n"))


def _score_step(hf, device, prompt: list[int], response: list[int], span: tuple[int, int]) -> float:
  """Perplexity of the step span [start, end) of `response`: one full forward of prompt + response[:end] (batch 1,
  as search-and-learn's PRM scores each completion), -mean log p of the step's tokens."""
  torch = _torch()
  start, end = span
  if end <= start:
    return math.nan
  ids = torch.tensor([prompt + response[:end]], device=device)
  keep = end - start + 1  # logits from the position before the step's first token
  with torch.inference_mode():
    logits = hf(input_ids=ids, logits_to_keep=keep).logits[0, :-1].float()  # [end - start, V]
  tok = ids[0, len(prompt) + start : len(prompt) + end]
  return float(-torch.log_softmax(logits, -1).gather(-1, tok[:, None]).mean())


def hf_beam_search(
  hf, device, tokenizer, table, eos_ids, pad_id: int, prompts: list[list[int]], cfg: SearchConfig
) -> list[dict]:
  """The search-and-learn-style loop (module docstring), one problem after another: per problem {'beams': its B
  RefBeams (best first by their last selected step's score), 'sampled_steps', 'generated_tokens'}."""
  import transformers

  torch = _torch()
  transitions = np.asarray(table.transitions)  # [S, V] automaton nodes (line mode counts no characters)
  ends = np.asarray(table.ends).astype(np.int32)
  eos = np.zeros(transitions.shape[1], bool)
  eos[list(eos_ids)] = True
  p = cfg.sampling
  greedy = p.greedy
  sample = (
    {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    if greedy
    else {"do_sample": True, "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p}
  )
  out = []
  for prompt in prompts:
    beams = [RefBeam([], [], [], 0) for _ in range(cfg.beams)]
    sampled = generated = 0
    for _ in range(cfg.max_steps):
      live = [b for b in beams if b.reason is None]
      if not live:
        break
      cands = []
      for beam in live:
        ctx = prompt + beam.response
        ids = torch.tensor([ctx], device=device)
        stop = _stop_criteria(transitions, ends, eos, np.full(cfg.n, beam.stop_state), len(ctx))
        if greedy:  # generate refuses num_return_sequences > 1 without sampling
          ids = ids.expand(cfg.n, -1)
        with torch.inference_mode():
          seqs = hf.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=cfg.max_new_tokens - len(beam.response),
            num_return_sequences=1 if greedy else cfg.n,
            stopping_criteria=transformers.StoppingCriteriaList([stop]),
            pad_token_id=pad_id,
            eos_token_id=list(eos_ids) or None,
            **sample,
          )
        new = seqs[:, len(ctx) :].cpu().numpy()
        for j in range(cfg.n):
          n_new = int(stop.stop[j]) if stop.stop[j] >= 0 else new.shape[1]
          response = beam.response + new[j, :n_new].tolist()
          span = (beam.step_end, len(response) - int(stop.before[j]))
          steps = len(beam.spans) + 1
          if stop.eos[j]:
            reason = "eos"
          elif stop.stop[j] < 0:
            reason = "length"
          elif _is_answer(tokenizer, response[span[0] : span[1]]):
            reason = "answer"
          elif steps >= cfg.max_steps:
            reason = "max_steps"
          elif len(response) >= cfg.max_new_tokens:
            reason = "length"
          else:
            reason = None
          score = _score_step(hf, device, prompt, response, span)
          cands.append(RefBeam(response, beam.spans + [span], beam.scores + [score], int(stop.q[j]), reason))
          sampled += 1
          generated += n_new
      kept = [b for b in beams if b.reason is not None]
      order = sorted(range(len(cands)), key=lambda i: (math.inf if math.isnan(cands[i].last) else cands[i].last, i))
      beams = kept + [cands[i] for i in order[: cfg.beams - len(kept)]]
    beams.sort(key=lambda b: (math.isnan(b.last), 0.0 if math.isnan(b.last) else b.last))
    out.append({"beams": beams, "sampled_steps": sampled, "generated_tokens": generated})
  return out


# ------------------------------------------------------------------------------------------------ measurements


def _reference_args(pair: Pair, lm: LanguageModel):
  table = StepBoundary("line").compile(lm.tokenizer, lm.config.vocab_size)
  if table.gate_at.size:
    raise ConfigError(
      "bench.search: the reference's host stop rule runs boundaries that count no characters "
      "(line mode); this StopTable counts them"
    )
  eos_ids = [int(i) for i in np.flatnonzero(np.asarray(lm.eos_mask()))]
  return pair.hf, pair.device, lm.tokenizer, table, eos_ids, lm.pad_id()


def _sync(pair: Pair):
  if pair.device.type == "cuda":
    _torch().cuda.synchronize()


def _side(timing, steps: int, tokens: int) -> dict:
  return {
    "sampled_steps": steps,
    "generated_tokens": tokens,
    "steps_per_s": steps / timing.median_s,
    "tokens_per_s": tokens / timing.median_s,
    **timing.to_json(),
  }


def _ours(lm, prompts, cfg, repeats: int, strategy=beam_search):
  scorer = get_scorer(SCORER)
  t, res = time_call(lambda: strategy(lm, scorer, prompts, cfg, mode="line"), repeats)
  return t, res, sum(r.sampled_steps for r in res), sum(r.generated_tokens for r in res)


def search_config(beams: int, n: int, steps: int, new_tokens: int, **kw) -> SearchConfig:
  return SearchConfig(strategy="beam", beams=beams, n=n, max_steps=steps, max_new_tokens=new_tokens, **kw)


def vs_reference(pair: Pair, lm: LanguageModel, prompts, cfg: SearchConfig, ours: dict, repeats: int) -> dict:
  """Our beam search over all problems at once (`ours`: its `_side`) vs the search-and-learn-style loop, same
  prompts, B, N, rounds and token budget, both sampling (T, top-k, top-p of cfg). Throughput: each side's own
  sampled steps (and generated tokens) per second, since rows that finish early make the counts differ."""
  torch = _torch()
  args = _reference_args(pair, lm)

  def ref():
    torch.manual_seed(cfg.seed)  # every repeat samples the same work
    out = hf_beam_search(*args, prompts, cfg)
    _sync(pair)
    return out

  t_ref, res = time_call(ref, repeats)
  hf = _side(t_ref, sum(r["sampled_steps"] for r in res), sum(r["generated_tokens"] for r in res))
  return {
    "name": "beam_vs_reference",
    "title": "Step-level beam search: reprobe-jax (all problems in one jitted "
    "search) vs a search-and-learn-style loop in PyTorch transformers (per problem, per beam generate, "
    "a full forward per candidate)",
    "ours": ours,
    "hf": hf,
    "ratio": ours["steps_per_s"] / hf["steps_per_s"],
    "tokens_ratio": ours["tokens_per_s"] / hf["tokens_per_s"],
    # the least-disturbed repeats: PyTorch's threads are hit hard when other processes share the cores
    "ratio_of_min_times": (ours["sampled_steps"] / ours["min_s"]) / (hf["sampled_steps"] / hf["min_s"]),
    "torch_threads": torch.get_num_threads(),
  }


def vs_best_of_n(lm: LanguageModel, prompts, cfg: SearchConfig, beam: dict, repeats: int) -> dict:
  """Our beam search (`beam`: its `_side`) vs our Best-of-N with n = B x N trajectories over the same prompts,
  max_steps and token budget (the same number of sampled steps at most); cost per sampled step, beam over
  Best-of-N."""
  bon_cfg = dataclasses.replace(cfg, strategy="best_of_n", n=cfg.beams * cfg.n, beams=1)
  t_bon, _, n_steps, n_tokens = _ours(lm, prompts, bon_cfg, repeats, strategy=best_of_n)
  bon = _side(t_bon, n_steps, n_tokens)
  return {
    "name": "beam_vs_best_of_n",
    "title": f"Our beam search (B={cfg.beams}, N={cfg.n}) vs our Best-of-N "
    f"(n={cfg.beams * cfg.n}), same prompts, steps and token budget",
    "beam": beam,
    "best_of_n": bon,
    "cost_ratio": bon["steps_per_s"] / beam["steps_per_s"],
  }


def same_steps(pair: Pair, lm: LanguageModel, prompts, cfg: SearchConfig) -> dict:
  """Greedy (temperature 0), same scorer: per problem, whether our best beam and the reference's hold the same
  response (EOS dropped) and step spans; and the largest difference of their step scores where they do."""
  cfg = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, temperature=0.0))
  ours = beam_search(lm, get_scorer(SCORER), prompts, cfg, mode="line")
  ref = hf_beam_search(*_reference_args(pair, lm), prompts, cfg)
  eos = np.asarray(lm.eos_mask())
  equal, diffs = [], []
  for o, r in zip(ours, ref):
    c, b = o.candidates[0], r["beams"][0]
    resp = b.response[:-1] if b.reason == "eos" and b.response and eos[b.response[-1]] else b.response
    spans = [(min(s, len(resp)), min(e, len(resp))) for s, e in b.spans]
    scores = b.scores
    if b.reason == "eos" and len(spans) > 1 and spans[-1] == (len(resp), len(resp)):
      spans, scores = spans[:-1], scores[:-1]  # the step that held only the final EOS (as ours drops it)
    same = list(c.response_ids) == resp and [tuple(s) for s in c.steps] == spans
    equal.append(same)
    if same:
      diffs.append(float(np.nanmax(np.abs(np.asarray(c.step_scores) - np.asarray(scores)))) if scores else 0.0)
  return {
    "beams": cfg.beams,
    "n": cfg.n,
    "max_steps": cfg.max_steps,
    "problems": len(prompts),
    "problems_equal": float(np.mean(equal)),
    "score_max_abs": max(diffs) if diffs else None,
    "steps_selected": [len(o.candidates[0].steps) for o in ours],
  }


def probe_vs_prm(lm: LanguageModel, prompts, cfg: SearchConfig, repeats: int) -> dict:
  """Cost per searched problem: the same beam search guided by the probe (docs/method.md §A4 at the paper's
  shape over captured last-layer hidden states; random weights: only its cost matters), by the PRM (the target's
  backbone and a random head, scoring incrementally from its own KV cache) and by perplexity (which reads only the
  captured log-probs: the search without a scorer's cost). Selections differ with the scorer, so each side reports
  its own sampled steps; the scorers' cost is each side's time over perplexity's."""
  from flax import nnx

  from reprobe_jax.features import FeatureSpec, model_fingerprint
  from reprobe_jax.prm.model import from_target
  from reprobe_jax.probe import Probe, ProbeConfig
  from reprobe_jax.probe.bundle import ProbeBundle
  from reprobe_jax.scorers import PRMScorer, ProbeScorer

  spec = FeatureSpec.from_name("hidden")
  pcfg = ProbeConfig(feature_dim=spec.dim(lm.config))
  _, params = nnx.split(Probe(pcfg, rngs=nnx.Rngs(0)))
  scorers = {
    "probe": ProbeScorer(ProbeBundle.create(pcfg, params, spec, model_fingerprint(lm))),
    "prm": PRMScorer(from_target(lm, separator_id=lm.pad_id(), seed=0)),
    "perplexity": get_scorer(SCORER),
  }
  sides = {}
  for name, scorer in scorers.items():
    t, res = time_call(lambda scorer=scorer: beam_search(lm, scorer, prompts, cfg, mode="line"), repeats)
    sides[name] = {
      **_side(t, sum(r.sampled_steps for r in res), sum(r.generated_tokens for r in res)),
      "seconds_per_problem": t.median_s / len(prompts),
    }
  floor = sides["perplexity"]["seconds_per_problem"]
  over = {k: max(sides[k]["seconds_per_problem"] - floor, 0.0) for k in ("probe", "prm")}
  return {
    "name": "probe_vs_prm_search",
    "sides": sides,
    "problems": len(prompts),
    "per_problem_ratio": sides["prm"]["seconds_per_problem"] / sides["probe"]["seconds_per_problem"],
    "scoring_seconds_per_problem": over,
    "scoring_ratio": over["prm"] / over["probe"] if over["probe"] > 0 else None,
  }


def run_all(
  pair: Pair,
  *,
  problems: int,
  beams: int,
  n: int,
  steps: int,
  new_tokens: int,
  repeats: int,
  check_steps: int,
  devices: int = 8,
  log=print,
) -> dict:
  """Every search measurement on one target: the 'search' section of bench.run's results. devices: the info row of
  the probe-guided beam search on that many virtual CPU devices against one (`bench.sharded`; 0 skips it)."""
  lm, prompts, what = target(pair, problems)
  cfg = search_config(beams, n, steps, new_tokens)
  log(f"search: {len(prompts)} problems ({what}), B={beams}, N={n}, {steps} steps, {new_tokens} tokens")
  t, _, sampled, tokens = _ours(lm, prompts, cfg, repeats)
  beam = _side(t, sampled, tokens)
  ref = vs_reference(pair, lm, prompts, cfg, beam, repeats)
  log(
    f"  beam search {ref['ours']['steps_per_s']:.1f} vs reference {ref['hf']['steps_per_s']:.1f} sampled steps/s "
    f"({ref['ratio']:.1f}x)"
  )
  bon = vs_best_of_n(lm, prompts, cfg, beam, repeats)
  log(
    f"  beam search {bon['beam']['steps_per_s']:.1f} vs Best-of-N {bon['best_of_n']['steps_per_s']:.1f} sampled "
    f"steps/s (beam costs {bon['cost_ratio']:.2f}x per step)"
  )
  parity = same_steps(pair, lm, prompts, search_config(min(beams, 2), 1, check_steps, new_tokens))
  log(f"  greedy: same selected steps on {parity['problems_equal']:.0%} of the problems")
  scorers = probe_vs_prm(lm, prompts, cfg, repeats)
  log(
    f"  per searched problem: probe {scorers['sides']['probe']['seconds_per_problem']:.2f} s, PRM "
    f"{scorers['sides']['prm']['seconds_per_problem']:.2f} s, perplexity "
    f"{scorers['sides']['perplexity']['seconds_per_problem']:.2f} s"
  )
  sharded_row = None
  if devices:
    # One problem per device, so each problem's rows (and the survivors' gathers) stay on one device.
    _, spread, _ = target(pair, max(problems, devices))
    log(f"  probe-guided beam search on {devices} CPU devices against one, {len(spread)} problems (own processes)")
    sharded_row = sharded.run(lm, spread, cfg, repeats, devices=devices, log=log)
  return {
    "prompts": what,
    "problems": len(prompts),
    "prompt_tokens": [len(p) for p in prompts],
    "config": dataclasses.asdict(cfg),
    "scorer": SCORER,
    "rows": [ref, bon],
    "parity": parity,
    "scorers": scorers,
    "sharded": sharded_row,  # info, not a goal (bench/sharded.py)
  }
