"""Thinking-mode decoding with the step potential computed on device at every boundary, and probe-truncated
decoding (docs/method.md §B3): at a row's first saturated boundary `</think>` is appended and the row writes its answer.

    rows = decode_thinking(lm, prober, prompt_ids, answers, seeds, sampling=..., max_new_tokens=192, truncate=True)

The rows decode together to their next paragraph boundary (the sampler pauses each row there); the paused rows'
boundaries are probed in one batched call as side branches of the live rows (`Prober.probe_state`: N+1 rows per
boundary fork the row's own cache, nothing is re-prefilled); with `truncate`, saturated rows get `</think>` forced
in; every paused row then resumes. Rows truncate independently. Without `truncate` the same loop gives plain
decoding with its potential curve, which equals `Prober.potentials` of the finished trajectory (same keys).

Randomness: the rows draw from per-row key streams (`prompt_seeds`, docs/decoding.md), so a row's tokens do not
depend on the batch, and until its truncation a truncated row is the plain row token for token.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from reprobe_jax.errors import ConfigError
from reprobe_jax.fields import Int, check_seed, check_seeds
import reprobe_jax.models.decode_state as decode_state
from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.sampling import SamplingParams, bucket
from reprobe_jax.spae.potential import StepPotentials, step_potential
from reprobe_jax.spae.prober import Prober
from reprobe_jax.steps import THINK_CLOSE, StepBoundary


@dataclasses.dataclass(frozen=True)
class ThinkingRow:
  """One decoded thinking trajectory with the potentials of the boundaries it passed."""

  prompt_index: int
  sample: int
  response_ids: tuple[int, ...]  # without the final EOS
  finish_reason: str
  potentials: StepPotentials  # one entry per boundary probed (all of them, or up to the truncation)
  truncated_at: int | None  # the boundary (ordinal) after which `</think>` was forced in; None: not truncated


def trajectory_seed(prompt_seed: int, sample: int, samples: int) -> int:
  """The probe's per-trajectory seed of sample s of a prompt (unique per (prompt seed, sample), in [0, 2**32))."""
  return (check_seed(prompt_seed, "trajectory_seed: prompt_seed") * samples + sample) % (2**32)


def decode_thinking(
  lm,
  prober: Prober,
  prompt_ids: Sequence[Sequence[int]],
  answers: Sequence[str],
  prompt_seeds: Sequence[int],
  *,
  sampling: SamplingParams,
  max_new_tokens: int,
  samples: int = 1,
  seed: int = 0,
  truncate: bool = False,
  close: str = THINK_CLOSE,
  progress: Callable[[int], None] | None = None,
) -> list[ThinkingRow]:
  """`samples` thinking trajectories per prompt, each boundary probed on device; with `truncate`, each row gets
  `close` forced in at its first saturated boundary. Rows come back prompt-major (prompt p, sample s)."""
  if lm.tokenizer is None:
    raise ConfigError("decode_thinking needs the model's tokenizer")
  if not isinstance(prober, Prober) or prober.lm is not lm:
    raise ConfigError(f"decode_thinking: prober: expected a Prober of this model, got {type(prober).__name__}")
  for name, value in (("max_new_tokens", max_new_tokens), ("samples", samples)):
    if not Int(1).ok(value):
      raise ConfigError(f"decode_thinking: {name}: expected {Int(1)}, got {value!r}")
  prompt_ids = prober.token_rows(prompt_ids, "decode_thinking: prompt_ids")
  prompt_seeds = check_seeds(prompt_seeds, "decode_thinking: prompt_seeds")
  seed = check_seed(seed, "decode_thinking: seed")
  ans = prober.answer_ids(answers, "decode_thinking: answers")
  if len(prompt_ids) != len(answers) or len(prompt_ids) != len(prompt_seeds):
    raise ConfigError(
      f"decode_thinking: {len(prompt_ids)} prompts, {len(answers)} answers, {len(prompt_seeds)} "
      "prompt seeds; need one of each per prompt"
    )
  close_ids = list(lm.tokenizer(close, add_special_tokens=False)["input_ids"])
  if truncate and not close_ids:
    raise ConfigError(f"decode_thinking: the closing text {close!r} tokenizes to nothing")
  for p, a in zip(prompt_ids, ans):
    prober.check_room(len(p) + max_new_tokens, len(a))
  smp = lm.sampler(
    sampling, capture=CaptureSpec(), stop=StepBoundary("paragraph").compile(lm.tokenizer, lm.config.vocab_size)
  )
  n_prompts = len(prompt_ids)
  state = smp.prefill(
    [list(p) for p in prompt_ids],
    max_new_tokens=max_new_tokens,
    n=samples,
    seed=seed,
    share=False,
    extra_slots=len(close_ids),
    prompt_seeds=list(prompt_seeds),
  )
  b = state.batch
  rows = n_prompts * samples
  row_prompt = np.minimum(np.arange(b) // samples, n_prompts - 1)  # batch padding rows borrow a real prompt
  row_ans = [ans[p] for p in row_prompt]
  row_seed = [trajectory_seed(prompt_seeds[p], r % samples, samples) for r, p in enumerate(row_prompt)]
  ordinal = np.zeros(b, np.int32)
  cuts: list[list[int]] = [[] for _ in range(b)]
  accs: list[list[float]] = [[] for _ in range(b)]
  confs: list[list[float]] = [[] for _ in range(b)]
  truncated_at: list[int | None] = [None] * b
  eps = prober.cfg.eps_sat
  finished_before = 0
  while True:
    state = smp.decode(state)
    host = jax.device_get({"done": state.done, "finish": state.finish, "step_end": state.step_end})
    paused = host["done"] & (host["finish"] == decode_state.FINISH_STOP)
    paused[rows:] = False
    finished = int(np.sum(host["done"][:rows] & ~paused[:rows]))
    if progress is not None and finished > finished_before:
      progress(finished - finished_before)
      finished_before = finished
    if not paused.any():
      break
    # Only the paused rows are probed: gathered into a batch of their own, padded with copies to a power of two
    # of at least an eighth of the batch (at most four shapes to compile).
    live = np.flatnonzero(paused)
    pad = np.resize(live, bucket(len(live), minimum=max(1, b // 8)))
    cut = (host["step_end"][pad] - 1).astype(np.int32)[:, None]
    cut[len(live) :] = -1
    sub = decode_state.take(state, jnp.asarray(pad, jnp.int32))
    acc, conf = jax.device_get(
      prober.probe_state(sub, cut, ordinal[pad][:, None], [row_ans[r] for r in pad], [row_seed[r] for r in pad])
    )
    phi = np.full(b, np.nan)
    phi[live] = step_potential(acc[: len(live), 0], conf[: len(live), 0])
    for j, r in enumerate(live):
      cuts[r].append(int(cut[j, 0]))
      accs[r].append(float(acc[j, 0]))
      confs[r].append(float(conf[j, 0]))
    ordinal = ordinal + paused
    if truncate:
      hit = paused & (phi > eps) & np.array([t is None for t in truncated_at])
      for r in np.flatnonzero(hit):
        truncated_at[r] = len(cuts[r]) - 1
      if hit.any():
        state = smp.force(state, close_ids, rows=hit)
    state = smp.resume(state, paused)
  eos = lm.tokenizer.eos_token_id
  out = []
  for r, row in enumerate(smp.read(state, list(range(rows)))):
    ids = row.tokens[:-1] if row.tokens and row.tokens[-1] == eos else row.tokens
    out.append(
      ThinkingRow(
        prompt_index=int(row_prompt[r]),
        sample=r % samples,
        response_ids=tuple(ids),
        finish_reason=row.finish_reason or "length",
        potentials=StepPotentials.of(cuts[r], accs[r], confs[r], eps),
        truncated_at=truncated_at[r],
      )
    )
  return out
