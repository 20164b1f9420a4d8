"""The RL loop's host stages between the jitted pieces: rollout, reward, dynamic sampling, potentials,
and the device batches they feed (advantage inputs, the policy batch).

    plan = prompts.plan(step, rounds)                              # which prompts step i may draw (pure in i)
    groups, stats = collect(roll, plan, group_size, want, dynamic)  # rollout + reward, refilled (DAPO)
    pots = potentials(prober, groups)                              # SPAE: every boundary, one batched call
    inp = advantage_inputs(groups, pots, ...); batch = policy_batch(groups, ...)

Everything a step does is a function of (parameters, step index, config), so a resumed run repeats an
uninterrupted one: the prompts of step i come from a permutation seeded by (seed, i), the rollout keys from
(seed, i, round) and each problem's id.
"""

from __future__ import annotations

import dataclasses
import numbers
import zlib
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from reprobe_jax.errors import ConfigError
from reprobe_jax.fields import Int, check_seed
from reprobe_jax.models.capture import CaptureSpec
from reprobe_jax.models.decode_state import DecodeState
from reprobe_jax.models.sampling import SamplingParams
from reprobe_jax.rl.types import AdvantageInputs, PolicyBatch
from reprobe_jax.spae.potential import StepPotentials
from reprobe_jax.spae.prober import Prober
from reprobe_jax.tasks.base import Problem
from reprobe_jax.tasks.data import PromptOrder
from reprobe_jax.tasks.formats import check_response

FLOAT32_MAX = float(np.finfo(np.float32).max)  # rewards are float32 on device: a larger one would become inf
STEP_BUCKET = 8  # boundaries per row are padded to a multiple of this (few shapes to compile)
PROMPT_COLUMNS = 16  # the update's prompt columns: the longest prompt rounded up to a multiple of this (a power of
#                      two would spend up to half the update's forward and backward on padding)


@dataclasses.dataclass(frozen=True)
class PromptSet:
  """The RL prompts: problems with their encoded prompts (thinking mode). order: None for the synthetic world (each
  step's prompts by `plan`, a function of the step); a data file's `PromptOrder`, drawn from a position the run
  carries (`drawn`)."""

  problems: tuple[Problem, ...]
  prompt_ids: tuple[tuple[int, ...], ...]
  order: PromptOrder | None = None

  def __post_init__(self):
    if len(self.problems) != len(self.prompt_ids):
      raise ConfigError(f"PromptSet: {len(self.problems)} problems but {len(self.prompt_ids)} prompts")
    if self.order is not None and self.order.n != len(self.problems):
      raise ConfigError(f"PromptSet: an order of {self.order.n} prompts for {len(self.problems)} problems")

  def drawn(self, position: int, per_round: int, rounds: int) -> list[np.ndarray]:
    """The prompt indices of a data run's step whose rounds start at `position` of the order: round r holds
    positions [position + r * per_round, position + (r + 1) * per_round). A step that rolls out k rounds consumes
    k * per_round positions (the run stores where it stands: `rl.loop`), so no prompt is skipped; a prompt repeats
    within a step only across an epoch's end."""
    if self.order is None:
      raise ConfigError("PromptSet.drawn: a prompt set without an order (the synthetic world) plans by step")
    got = np.asarray(self.order.take(position, per_round * rounds), np.int64)
    return [got[r * per_round : (r + 1) * per_round] for r in range(rounds)]

  def __len__(self) -> int:
    return len(self.problems)

  def plan(self, seed: int, step: int, per_round: int, rounds: int) -> list[np.ndarray]:
    """The prompt indices of each of step `step`'s rounds: consecutive blocks of one permutation seeded by
    (seed, step), so no prompt repeats within a step. ConfigError when the set cannot fill `rounds` rounds."""
    check_seed(seed, "PromptSet.plan: seed")
    if not Int(0).ok(step):
      raise ConfigError(f"PromptSet.plan: step: expected {Int(0)}, got {step!r}")
    need = per_round * rounds
    if need > len(self):
      raise ConfigError(
        f"the RL prompt set has {len(self)} prompts; {rounds} rounds of {per_round} prompts "
        f"(1 + max_refill_rounds rounds of prompts_per_round) need {need}: use more prompts or "
        "fewer refill rounds"
      )
    order = np.random.default_rng([seed, step]).permutation(len(self))
    return [order[r * per_round : (r + 1) * per_round] for r in range(rounds)]


@dataclasses.dataclass(frozen=True)
class Trajectory:
  """One sampled response of the current policy and its outcome reward."""

  prompt: int  # index into the PromptSet
  sample: int
  response_ids: tuple[int, ...]  # with the final EOS when the row ended on one
  ended: bool  # the row ended on EOS (else it ran out of budget)
  reward: float
  round: int = 0  # the rollout round that sampled it
  row: int = -1  # its row in that round's decode state (`Rollout.states`); -1: none kept

  @property
  def text_ids(self) -> tuple[int, ...]:
    return self.response_ids[:-1] if self.ended else self.response_ids


@dataclasses.dataclass(frozen=True)
class Group:
  prompt: int
  trajectories: tuple[Trajectory, ...]

  @property
  def rewards(self) -> np.ndarray:
    return np.array([t.reward for t in self.trajectories], np.float32)

  @property
  def mixed(self) -> bool:
    r = self.rewards
    return bool(np.any(r != r[0]))


@dataclasses.dataclass(frozen=True)
class CollectStats:
  """What dynamic sampling did in one step: rounds rolled out, groups sampled / dropped (all rewards equal) / kept,
  and the rewards and lengths of every sampled trajectory (the step's accuracy is measured before dropping)."""

  rounds: int
  sampled_groups: int
  dropped_groups: int
  kept_groups: int
  short_groups: int  # groups missing from a full batch when the refills ran out (trained on what was there)
  mean_reward: float
  mean_length: float
  ended_share: float


RolloutFn = Callable[[np.ndarray, int], list[Group]]  # (prompt indices, round) -> one group per prompt


def reward_of(
  check: Callable[[Problem, str], float], name: str, prompts: PromptSet, i: int, s: int, text: str
) -> float:
  """check(problem i, response text) as a float, refused where it enters (before any update): ConfigError naming
  the reward function, the problem and the response, unless it is a finite real number (a Python or NumPy int or
  float; not a bool, an array, a string or None) that float32 holds. An exception inside it is named the same way."""
  where = f"the reward function {name} on problem {i} ({prompts.problems[i].id!r}), response {s}"
  try:
    value = check(prompts.problems[i], text)
  except Exception as e:
    raise ConfigError(f"{where} raised {type(e).__name__}: {e}") from e
  ok = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
  if ok:
    try:
      ok = abs(float(value)) <= FLOAT32_MAX  # False for NaN and inf
    except OverflowError:  # an int past float's range
      ok = False
  if not ok:
    shown = repr(value) if len(repr(value)) <= 200 else repr(value)[:200] + "..."
    raise ConfigError(f"{where} returned {shown}: expected a finite number (an int or a float within float32)")
  return float(value)


def answer_reward(problem: Problem, text: str) -> float:
  """The default outcome reward R in {0, 1} (docs/method.md §B2): 1.0 when the thinking-mode response's final answer
  (`Task.parse_response`) is the problem's true answer by its task's `check_answer` (any task: a family's exact
  answer, the math task's equivalence), else 0.0."""
  return float(check_response(problem, text, "thinking").correct)


class Rollout:
  """One step's rollout, bound by `rollout_fn`: called with (prompt indices, round) it returns one group per prompt
  and, with `keep_states`, keeps the round's decode state on device in `states[round]` (the KV cache SPAE's
  probing forks, `rl.probing`) until the step drops it."""

  def __init__(self, lm, prompts: PromptSet, smp, *, group_size, max_new_tokens, seed, step, check, name, keep_states):
    self.lm, self.prompts, self.smp, self.keep_states = lm, prompts, smp, keep_states
    self.group_size, self.max_new_tokens, self.seed, self.step = group_size, max_new_tokens, seed, step
    self.check, self.name = check, name
    self.prompt_len = max(map(len, prompts.prompt_ids), default=0)
    self.states: dict[int, DecodeState] = {}

  def __call__(self, idx: np.ndarray, round_: int) -> list[Group]:
    prompts, smp, g = self.prompts, self.smp, self.group_size
    ids = [list(prompts.prompt_ids[i]) for i in idx]
    pseeds = [zlib.crc32(f"{prompts.problems[i].id}/{self.step}/{round_}".encode()) for i in idx]
    state = smp.prefill(
      ids,
      max_new_tokens=self.max_new_tokens,
      n=g,
      seed=self.seed,
      prompt_seeds=pseeds,
      prompt_len=self.prompt_len,  # every round of the run in one shape: nothing downstream compiles twice
    )
    state = smp.decode(state)
    if self.keep_states:
      self.states[round_] = state
    rows = smp.read(state, list(range(len(idx) * g)))
    eos = self.lm.tokenizer.eos_token_id
    groups = []
    for j, i in enumerate(idx):
      trajs = []
      for s in range(g):
        row = rows[j * g + s]
        ended = bool(row.tokens) and row.tokens[-1] == eos and row.finish_reason == "eos"
        body = row.tokens[:-1] if ended else row.tokens
        text = self.lm.tokenizer.decode(body)
        trajs.append(
          Trajectory(
            prompt=int(i),
            sample=s,
            response_ids=tuple(row.tokens),
            ended=ended,
            reward=reward_of(self.check, self.name, prompts, int(i), s, text),
            round=round_,
            row=j * g + s,
          )
        )
      groups.append(Group(prompt=int(i), trajectories=tuple(trajs)))
    return groups


def rollout_fn(
  lm,
  prompts: PromptSet,
  *,
  group_size: int,
  max_new_tokens: int,
  sampling: SamplingParams,
  seed: int,
  step: int,
  reward: Callable[[Problem, str], float] | None = None,
  keep_states: bool = False,
) -> Rollout:
  """Binds the rollout of one step: G samples per prompt from the decode-state API with `lm.params` as they are
  now (the jitted decode takes the parameters as an argument: new parameters compile nothing). Rows read their
  prompt's prefill as a shared prefix; row (problem, sample) of round r draws from a key of (seed, step, r, the
  problem's id, sample). reward(problem, response text) -> R; default: `answer_reward`, the task's answer check.
  The reward is called on the host once per response of each rolled-out batch; everything else stays on device.
  keep_states: keep each round's decode state (`Rollout.states`) for probing the kept rows' boundaries."""
  check_seed(seed, "rollout_fn: seed")
  if reward is None:
    check, name = answer_reward, "(the task's answer check)"
  elif callable(reward):
    check, name = reward, getattr(reward, "__qualname__", None) or repr(reward)
  else:
    raise ConfigError(f"rollout_fn: reward must be a function (problem, response text) -> number, got {reward!r}")
  smp = lm.sampler(sampling, capture=CaptureSpec())
  return Rollout(
    lm,
    prompts,
    smp,
    group_size=group_size,
    max_new_tokens=max_new_tokens,
    seed=seed,
    step=step,
    check=check,
    name=name,
    keep_states=keep_states,
  )


def collect(
  roll: RolloutFn, plan: Sequence[np.ndarray], want: int, *, dynamic: bool
) -> tuple[list[Group], CollectStats]:
  """Rolls out round after round of `plan` until `want` groups are kept. dynamic (DAPO): groups whose rewards are
  all equal are dropped and further rounds refill the batch, at most len(plan) rounds; when they run out the
  step trains on the groups it has (counted in short_groups), never a crash. Without dynamic sampling one round,
  every group kept. Extra kept groups beyond `want` are left out (in round order)."""
  kept: list[Group] = []
  sampled: list[Group] = []
  rounds = 0
  for r, idx in enumerate(plan if dynamic else plan[:1]):
    groups = roll(np.asarray(idx), r)
    rounds += 1
    sampled += groups
    kept += [g for g in groups if g.mixed or not dynamic]
    if len(kept) >= want:
      break
  kept = kept[:want]
  trajs = [t for g in sampled for t in g.trajectories]
  dropped = sum(1 for g in sampled if dynamic and not g.mixed)
  stats = CollectStats(
    rounds=rounds,
    sampled_groups=len(sampled),
    dropped_groups=dropped,
    kept_groups=len(kept),
    short_groups=want - len(kept),
    mean_reward=float(np.mean([t.reward for t in trajs])),
    mean_length=float(np.mean([len(t.response_ids) for t in trajs])),
    ended_share=float(np.mean([t.ended for t in trajs])),
  )
  return kept, stats


def trajectory_seed(t: Trajectory, prompts: PromptSet, step: int) -> int:
  """The probe's seed of a trajectory: its continuations differ per (problem, step, sample)."""
  return zlib.crc32(f"{prompts.problems[t.prompt].id}/{step}/{t.sample}".encode())


def potentials(
  prober: Prober, groups: Sequence[Group], prompts: PromptSet, step: int, think_id: int | None
) -> list[StepPotentials]:
  """Every kept trajectory's step potentials in batched probing calls (the prober's parameters are the policy's
  now). A trajectory without `<think>` has no thinking steps: no boundary, no potential (docs/method.md §B1)."""
  trajs = [t for g in groups for t in g.trajectories]
  thinking = [i for i, t in enumerate(trajs) if think_id is not None and think_id in t.text_ids]
  none = StepPotentials.of(np.zeros(0, int), np.zeros(0), np.zeros(0), prober.cfg.eps_sat)
  out = [none] * len(trajs)
  if thinking:
    got = prober.potentials(
      [prompts.prompt_ids[trajs[i].prompt] for i in thinking],
      [trajs[i].text_ids for i in thinking],
      [prompts.problems[trajs[i].prompt].answer for i in thinking],
      [trajectory_seed(trajs[i], prompts, step) for i in thinking],
    )
    for i, p in zip(thinking, got):
      out[i] = p
  return out


def token_steps(cuts: np.ndarray, length: int) -> np.ndarray:
  """k(j) for the tokens j < length of a response whose boundaries end at tokens `cuts` (docs/method.md §B2): the step
  whose boundary closes at or after j; tokens after the last boundary take the last step; -1 with no boundary."""
  if len(cuts) == 0:
    return np.full(length, -1, np.int32)
  k = np.searchsorted(np.asarray(cuts), np.arange(length), side="left")
  return np.minimum(k, len(cuts) - 1).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class StepBatch:
  """A step's device inputs: the advantage inputs and the policy batch without advantages (filled in after)."""

  adv_inputs: AdvantageInputs
  tokens: np.ndarray  # [B, P + T]
  attention_mask: np.ndarray
  response_mask: np.ndarray  # [B, T] float32
  real_rows: int


def step_batch(
  groups: Sequence[Group],
  pots: Sequence[StepPotentials] | None,
  prompts: PromptSet,
  *,
  want: int,
  group_size: int,
  response_len: int,
  pad_id: int,
) -> StepBatch:
  """Lays out `want` groups (short batches padded with copies of the first group, masked out) as fixed shapes:
  B = want * G rows, prompts left-padded to a multiple of PROMPT_COLUMNS, responses right-padded to `response_len`."""
  if not groups:
    raise ConfigError("step_batch: no group to train on")
  trajs = [t for g in groups for t in g.trajectories]
  n = len(trajs)
  b = want * group_size
  pad_rows = [trajs[i % n] for i in range(b - n)]
  rows = trajs + pad_rows
  plen = -(-max(len(prompts.prompt_ids[t.prompt]) for t in rows) // PROMPT_COLUMNS) * PROMPT_COLUMNS
  tokens = np.full((b, plen + response_len), pad_id, np.int32)
  attn = np.zeros((b, plen + response_len), np.int32)
  resp = np.zeros((b, response_len), np.float32)
  token_step = np.full((b, response_len), -1, np.int32)
  k_max = max([len(p.cuts) for p in pots] if pots else [0])
  k = max(STEP_BUCKET, -(-k_max // STEP_BUCKET) * STEP_BUCKET)
  phi = np.zeros((b, k), np.float32)
  valid = np.zeros((b, k), bool)
  rewards = np.zeros(b, np.float32)
  real = np.arange(b) < n
  for r, t in enumerate(rows):
    p = prompts.prompt_ids[t.prompt]
    ids = t.response_ids[:response_len]
    tokens[r, plen - len(p) : plen] = p
    attn[r, plen - len(p) : plen + len(ids)] = 1
    tokens[r, plen : plen + len(ids)] = ids
    rewards[r] = t.reward
    if not real[r]:
      continue
    resp[r, : len(ids)] = 1.0
    if pots is not None:
      pot = pots[r]
      token_step[r, : len(ids)] = token_steps(pot.cuts, len(ids))
      kk = len(pot.cuts)
      phi[r, :kk] = np.nan_to_num(pot.phi, nan=0.0)
      valid[r, :kk] = np.isfinite(pot.phi)
  inp = AdvantageInputs(
    rewards=jnp.asarray(rewards),
    row_mask=jnp.asarray(real),
    response_mask=jnp.asarray(resp > 0),
    token_step=jnp.asarray(token_step),
    phi=jnp.asarray(phi),
    step_valid=jnp.asarray(valid),
    group_size=group_size,
  )
  return StepBatch(adv_inputs=inp, tokens=tokens, attention_mask=attn, response_mask=resp, real_rows=n)


def policy_batch(
  sb: StepBatch,
  advantages: Float[Array, "b t"],
  old_logprobs: Float[Array, "b t"],
  ref_logprobs: Float[Array, "b t"] | None = None,
) -> PolicyBatch:
  """The step batch's sequences with their advantages and log-probabilities [B, T] (checked: `PolicyBatch.check`)."""
  resp = jnp.asarray(sb.response_mask)
  batch = PolicyBatch(
    tokens=jnp.asarray(sb.tokens),
    attention_mask=jnp.asarray(sb.attention_mask),
    response_mask=resp,
    old_logprobs=old_logprobs,
    advantages=advantages * resp,
    ref_logprobs=jnp.zeros_like(resp) if ref_logprobs is None else ref_logprobs,
  )
  batch.check()
  return batch
