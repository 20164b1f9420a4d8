"""The RL loop (docs/method.md §B2): rollout -> reward -> dynamic sampling -> step potentials (SPAE) -> token-level
advantages -> clipped policy-gradient update, over a train state (policy params, optimizer state, step) that the shared
`Trainer` checkpoints with orbax and logs to TensorBoard.

    result = train_rl(lm, RLConfig(advantage="spae"), ProbeConfig(), workdir)

Functional core: the advantage estimators (`advantages`), the loss and the jitted, donated, micro-batched,
data-parallel update (`loss`), the rollout and probing calls (the decode-state API and `Prober`, both taking the
parameters as an argument, so new parameters compile nothing). Host code only orchestrates: `RLStep` is the
Trainer's step for step i, a function of (params, opt_state, i) and the config alone, so a killed run resumes to the
same parameters and metrics as an uninterrupted one. On a data file (`RLConfig.data`) the prompts come in
`tasks.data.PromptOrder`; the train state carries the data position (`DataPosition`, checkpointed with the optimizer
state), so a resumed run draws on where it stopped.

A method is an estimator plus the loss and sampling it is trained with (`config.METHODS`, overridable in
`RLConfig`). `check_run` checks everything a run needs before any work (train_rl and the RL job call it first).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from reprobe_jax.errors import CacheFullError, ConfigError
from reprobe_jax.features.extraction import model_fingerprint
from reprobe_jax.fields import check_seed, field_name
from reprobe_jax.models import make_mesh
from reprobe_jax.rl import advantages as adv_lib
from reprobe_jax.rl import update as update_lib
from reprobe_jax.rl.config import RLConfig, config_key, problems_fingerprint
from reprobe_jax.rl.probing import probe_kept, with_potentials
from reprobe_jax.rl.rollout import PromptSet, collect, rollout_fn, step_batch
from reprobe_jax.spae.potential import ProbeConfig
from reprobe_jax.spae.prober import Prober
from reprobe_jax.steps import THINK_CLOSE, THINK_OPEN
from reprobe_jax.tasks import Problem, make_problems
from reprobe_jax.tasks.data import PromptOrder, load_data
from reprobe_jax.tasks.splits import SPLIT_SEEDS
from reprobe_jax.train.optimizer import make_optimizer
from reprobe_jax.train.trainer import Trainer, TrainerConfig
from reprobe_jax.trajectories import check_thinking_template, prompt_text


def train_problems(cfg: RLConfig) -> list[Problem]:
  """The RL problems: `train_problems` per difficulty and train domain from the synthetic train split, or on a data
  file (`cfg.data`) the file's train split (`tasks.data.load_data`)."""
  if cfg.data.enabled:
    return list(load_data(cfg.data).problems["train"])
  problems = []
  for domain in cfg.train_domains:
    for d in cfg.train_difficulties:
      problems += make_problems(domain, cfg.train_problems, SPLIT_SEEDS["train"] + cfg.seed, d)
  return problems


def train_prompts(lm, cfg: RLConfig) -> PromptSet:
  """The RL prompt set (thinking mode) of `train_problems`; on a data file drawn in `PromptOrder(n, cfg.seed)`."""
  problems = train_problems(cfg)
  ids = lm.encode([prompt_text(lm, p, "thinking", cfg.few_shot) for p in problems])
  order = PromptOrder(len(problems), cfg.seed) if cfg.data.enabled and problems else None
  return PromptSet(problems=tuple(problems), prompt_ids=tuple(tuple(i) for i in ids), order=order)


class DataPosition(NamedTuple):
  """A data run's train state beside the policy: the optimizer's state and the data position (the prompts of the
  `PromptOrder` consumed so far, an int32 scalar), checkpointed and restored with it so a resumed run draws on where
  the uninterrupted one would."""

  opt_state: Any
  position: jax.Array  # [] int32


def with_data_position(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` whose state also carries the data position (`DataPosition`, 0 at init; the RL step moves it)."""

  def init(params):
    return DataPosition(tx.init(params), jnp.zeros((), jnp.int32))

  def update(updates, state: DataPosition, params=None):
    updates, inner = tx.update(updates, state.opt_state, params)
    return updates, DataPosition(inner, state.position)

  return optax.GradientTransformation(init, update)


STEP_METRICS = (
  "loss",
  "reward",
  "kept_reward",
  "response_length",
  "ended_share",
  "rounds",
  "sampled_groups",
  "dropped_groups",
  "short_groups",
  "clip_fraction",
  "kl",
  "grad_norm",
  "ratio",
  "adv_abs",
  "phi_mean",
  "saturated_share",
  "checking_tokens",
  "probed_share",
  "time_rollout",
  "time_probe",
  "time_update",
  "skipped",
)


RESPONSE_COLUMNS = 64  # the update's response columns: the batch's longest response rounded up to a multiple of this


def response_columns(groups) -> int:
  """Response columns of a step's update: the longest kept response rounded up to RESPONSE_COLUMNS (a few shapes
  to compile; padding every batch to max_new_tokens would spend most of the update on padding)."""
  longest = max(len(t.response_ids) for g in groups for t in g.trajectories)
  return max(1, -(-longest // RESPONSE_COLUMNS)) * RESPONSE_COLUMNS


class RLStep:
  """The Trainer's step i: rollout with the current parameters, reward, dynamic sampling, potentials (SPAE),
  advantages, `mini_batches` jitted updates. Returns the parameters, the optimizer state and STEP_METRICS."""

  def __init__(
    self,
    lm,
    cfg: RLConfig,
    pcfg: ProbeConfig,
    prompts: PromptSet,
    tx,
    *,
    mesh=None,
    reward: Callable | None = None,
    ref_params=None,
  ):
    self.cfg, self.prompts, self.reward, self.tx = cfg, prompts, reward, tx
    self.policy = copy.copy(lm)  # the same model with the parameters of the step (set per call)
    self.estimator = adv_lib.get_estimator(cfg.advantage)
    self.adv_cfg = adv_lib.AdvantageConfig(alpha=cfg.alpha, xi=cfg.xi, eps_sat=pcfg.eps_sat)
    self.prober = Prober(self.policy, pcfg) if self.estimator.needs_potentials else None
    tok = lm.tokenizer
    think = tok.convert_tokens_to_ids(THINK_OPEN)
    self.think_id = think if isinstance(think, int) and think != tok.unk_token_id else None
    close = tok.convert_tokens_to_ids(THINK_CLOSE)
    self.close_id = close if isinstance(close, int) and close != tok.unk_token_id else None
    self._warned = False
    mb = cfg.micro_batches
    if cfg.kl_coef > 0 and ref_params is None:
      raise ConfigError("RLStep: kl_coef > 0 needs the reference parameters")
    with_ref = cfg.kl_coef > 0
    self.step_update = update_lib.make_step_update(
      lm.static_graph,
      tx,
      cfg.loss_config(),
      mini_batches=cfg.mini_batches,
      micro_batches=mb,
      mesh=mesh,
      with_ref=with_ref,
    )
    self.ref_params = self.step_update.put_params(ref_params) if with_ref else None  # placed once (FSDP: sharded)

  def __call__(self, params, opt_state, step, rng, frozen):
    del rng, frozen  # every key is derived from (seed, step) and problem ids
    cfg, step = self.cfg, int(step)
    t0 = time.perf_counter()
    self.policy.params = params
    if self.prompts.order is None:  # the synthetic world: the step's prompts are a function of the step
      plan, position = self.prompts.plan(cfg.seed, step, cfg.prompts_per_round, cfg.rounds), None
    else:  # a data file: the step draws on from the run's data position
      opt_state, position = opt_state.opt_state, int(opt_state.position)
      plan = self.prompts.drawn(position, cfg.prompts_per_round, cfg.rounds)
    params, opt_state, out = self._train(params, opt_state, step, plan, t0)
    if position is None:
      return params, opt_state, out
    position += int(out["rounds"]) * cfg.prompts_per_round  # the rounds rolled out consumed their prompts
    return params, DataPosition(opt_state, jnp.asarray(position, jnp.int32)), {**out, "data_position": position}

  def _train(self, params, opt_state, step: int, plan, t0: float):
    """The step over the prompts of `plan` (one index array per round) with the optimizer's own state."""
    cfg = self.cfg
    roll = rollout_fn(
      self.policy,
      self.prompts,
      group_size=cfg.group_size,
      max_new_tokens=cfg.max_new_tokens,
      sampling=cfg.sampling,
      seed=cfg.seed,
      step=step,
      reward=self.reward,
      keep_states=self.prober is not None,
    )
    groups, stats = collect(roll, plan, cfg.prompts_per_step, dynamic=cfg.method.dynamic_sampling)
    t1 = time.perf_counter()
    base = {
      "reward": stats.mean_reward,
      "response_length": stats.mean_length,
      "ended_share": stats.ended_share,
      "rounds": stats.rounds,
      "sampled_groups": stats.sampled_groups,
      "dropped_groups": stats.dropped_groups,
      "short_groups": stats.short_groups,
      "time_rollout": t1 - t0,
    }
    if not groups:  # every round's groups were all-equal: nothing to learn from, logged, no crash
      return (
        params,
        opt_state,
        {
          **{k: 0.0 for k in STEP_METRICS},
          **base,
          "skipped": 1.0,
          **{
            k: float("nan") for k in ("kept_reward", "phi_mean", "saturated_share", "checking_tokens", "probed_share")
          },
        },
      )
    kept = [t for g in groups for t in g.trajectories]
    pots = self._probe(roll, kept, step)
    roll.states.clear()  # the rounds' KV caches are not needed past the probe
    t2 = time.perf_counter()
    sb = step_batch(
      groups,
      None,
      self.prompts,
      want=cfg.prompts_per_step,
      group_size=cfg.group_size,
      response_len=response_columns(groups),
      pad_id=self.policy.pad_id(),
    )
    inp = sb.adv_inputs if pots is None else with_potentials(sb, pots)
    advantages = adv_lib.compute_advantages(cfg.advantage, inp, self.adv_cfg, check_values=False)
    params, opt_state, fetched, adv_abs = self._update(params, opt_state, sb, advantages)
    phi, valid = jax.device_get((pots.phi, pots.valid)) if pots is not None else (None, None)
    # token-weighted over the mini-batches (a mini-batch without tokens contributes nothing)
    w = np.array([float(f["tokens"]) for f in fetched])
    mean = lambda k: float(np.sum([float(f[k]) for f in fetched] * w) / max(w.sum(), 1.0))
    t3 = time.perf_counter()
    out = {
      **base,
      "loss": float(np.mean([float(f["loss"]) for f in fetched])),
      "kept_reward": float(np.mean([t.reward for t in kept])),
      "clip_fraction": mean("clip_frac"),
      "kl": mean("kl_mean"),
      "grad_norm": float(np.mean([float(f["grad_norm"]) for f in fetched])),
      "ratio": mean("ratio_mean"),
      "adv_abs": adv_abs,
      "time_probe": t2 - t1,
      "time_update": t3 - t2,
      "skipped": 0.0,
    }
    out.update(self._potential_stats(kept, pots, phi, valid))
    return params, opt_state, out

  def _probe(self, roll, kept, step: int):
    """The kept trajectories' step potentials from the rollout's own decode states (`rl.probing`), or None when
    the estimator reads none. Waits for the device (the phase's time is measured) but fetches nothing."""
    if self.prober is None:
      return None
    thinks = self.prober.thinks([self.prompts.prompt_ids[t.prompt] for t in kept], [t.text_ids for t in kept])
    pots = probe_kept(self.prober, roll.states, kept, self.prompts, step, thinks)
    jax.block_until_ready((pots.phi, pots.valid))  # the phase is timed: wait for the device, fetch nothing
    return pots

  def _update(self, params, opt_state, sb, advantages):
    """Old log-probs with the rollout's parameters and `mini_batches` updates in one compiled program
    (`update.make_step_update`); (params, opt_state, each mini-batch's metrics on the host, mean |advantage| over
    response tokens). The step's one fetch."""
    tokens, attn, resp = jnp.asarray(sb.tokens), jnp.asarray(sb.attention_mask), jnp.asarray(sb.response_mask)
    ref = (self.ref_params,) if self.ref_params is not None else ()
    params, opt_state, met = self.step_update(params, opt_state, tokens, attn, resp, advantages, *ref)
    adv_abs = jnp.sum(jnp.abs(advantages) * resp) / jnp.maximum(jnp.sum(resp), 1)
    met, adv_abs = jax.device_get((met, adv_abs))
    fetched = [{k: v[m] for k, v in met.items()} for m in range(self.cfg.mini_batches)]
    return params, opt_state, fetched, float(adv_abs)

  def _potential_stats(self, kept, pots, phi, valid) -> dict[str, float]:
    """Mean Phi over probed boundaries, share of trajectories with a saturated boundary, and checking tokens (from
    the first saturated boundary to `</think>`, mean over correct saturated trajectories; docs/method.md §B3)."""
    if pots is None:
      return {k: float("nan") for k in ("phi_mean", "saturated_share", "checking_tokens", "probed_share")}
    probed = valid.any(axis=1)
    if not probed.any() and not self._warned:
      self._warned = True
      logging.warning(
        "SPAE: no kept trajectory of this step has a probed boundary (no thinking block with a paragraph step): "
        "its advantages are RF-B's; see docs/method.md §B1 (the metric probed_share says how often this happens)"
      )
    sat = valid & (phi > self.adv_cfg.eps_sat)
    checking = []
    for r, t in enumerate(kept):
      hit = np.flatnonzero(sat[r])
      if t.reward > 0 and hit.size:
        ids = list(t.text_ids)
        end = ids.index(self.close_id) if self.close_id is not None and self.close_id in ids else len(ids)
        checking.append(max(0, end - int(pots.cuts[r][hit[0]]) - 1))
    return {
      "phi_mean": float(np.mean(phi[valid])) if valid.any() else float("nan"),
      "saturated_share": float(np.mean(sat.any(axis=1))),
      "checking_tokens": float(np.mean(checking)) if checking else float("nan"),
      "probed_share": float(np.mean(probed)),
    }


@dataclasses.dataclass
class RLResult:
  params: Any
  metrics: dict[str, list[float]]  # STEP_METRICS per step (1-based steps in order)
  step: int


def data_fingerprint(cfg: RLConfig) -> str:
  """Hash of a data run's train problems; '' on the synthetic world, whose problems the config decides."""
  return problems_fingerprint(train_problems(cfg)) if cfg.data.enabled else ""


def signature(lm, cfg: RLConfig, pcfg: ProbeConfig) -> dict:
  """What an RL checkpoint depends on: the start model, the RL and probe configs."""
  return {"rl": config_key(cfg), "probe": dataclasses.asdict(pcfg), "start_model": model_fingerprint(lm)}


def default_mesh(lm=None):
  """The update's mesh: the model's own (`--mesh=data,fsdp,tensor` placed it: an 'fsdp' axis above 1 shards the
  policy's parameters and optimizer state, `update.make_step_update`), else a 'data' mesh over every device when
  there is more than one (the rows split over them, parameters replicated), else None."""
  if lm is not None and getattr(lm, "shard", None) is not None:
    return lm.shard.mesh
  return make_mesh(data=jax.device_count()) if jax.device_count() > 1 else None


def check_run(lm, cfg: RLConfig, pcfg: ProbeConfig, *, mesh=None, reward=None, where: str = "") -> PromptSet:
  """Everything a run of `cfg` needs, checked before any work; returns its prompt set. ConfigError naming the field
  (`<where>.<field>`, where defaults to RLConfig): the configs' types and seed, the reward, the mesh split, the
  tokenizer, a prompt set that fills every round, and room in the context for the longest prompt + max_new_tokens
  (+ the probe's suffix and answer when the estimator reads step potentials)."""
  if not isinstance(cfg, RLConfig) or not isinstance(pcfg, ProbeConfig):
    raise ConfigError(f"RL: expected an RLConfig and a ProbeConfig, got {type(cfg).__name__}, {type(pcfg).__name__}")
  name = lambda f: f"{where}.{f}" if where else field_name(cfg, f)  # noqa: E731
  check_seed(cfg.seed, name("seed"))
  if reward is not None and not callable(reward):
    raise ConfigError(f"train_rl: reward must be a function (problem, response text) -> number, got {reward!r}")
  if mesh is not None:
    per = cfg.prompts_per_step * cfg.group_size // (cfg.mini_batches * cfg.micro_batches)
    split = update_lib.Placement.of(mesh, "train_rl").devices
    if per % split:
      raise ConfigError(
        f"{name('micro_batches')}: a micro-batch of {per} rows (prompts_per_step x group_size / (mini_batches x "
        f"micro_batches)) does not split over the mesh's {split} row devices ('data' x 'fsdp')"
      )
  if lm.tokenizer is None:
    raise ConfigError("train_rl needs the model's tokenizer (prompts, answer checks, boundaries)")
  prompts = train_prompts(lm, cfg)
  if len(prompts):  # a template that closes the thinking in the prompt leaves no thinking step to train or probe
    check_thinking_template(lm.tokenizer.decode(list(prompts.prompt_ids[0])), "thinking", where=name("train prompts"))
  if prompts.order is None:
    try:
      prompts.plan(cfg.seed, 0, cfg.prompts_per_round, cfg.rounds)  # a set too small to refill every round
    except ConfigError as e:
      raise ConfigError(f"{name('train_problems')}={cfg.train_problems}: {e}") from None
  elif len(prompts) < cfg.prompts_per_round:  # the order repeats its prompts only across an epoch's end
    raise ConfigError(
      f"{name('prompts_per_round')}={cfg.prompts_per_round}: the train split of {cfg.data.path} has "
      f"{len(prompts)} problems; a round draws distinct prompts (use more problems or a smaller round)"
    )
  longest = max(range(len(prompts)), key=lambda i: len(prompts.prompt_ids[i]))
  room = lm.config.max_position_embeddings
  if len(prompts.prompt_ids[longest]) + cfg.max_new_tokens > room:
    raise ConfigError(
      f"{name('max_new_tokens')}={cfg.max_new_tokens}: RL prompts of up to {len(prompts.prompt_ids[longest])} tokens "
      f"+ {cfg.max_new_tokens} new tokens exceed the model's max_position_embeddings={room}"
    )
  if adv_lib.get_estimator(cfg.advantage).needs_potentials:
    check_probe_room(
      Prober(lm, pcfg),
      prompts.prompt_ids,
      [p.answer for p in prompts.problems],
      cfg.max_new_tokens,
      name("max_new_tokens"),
    )
  return prompts


def check_probe_room(prober: Prober, prompt_ids, answers, max_new_tokens: int, field: str) -> None:
  """ConfigError naming `field` unless the longest prompt + max_new_tokens leaves the probe its suffix and the
  longest answer (in-context ids) or its samples (`Prober.check_budget`, docs/method.md §B1)."""
  try:
    prober.check_budget(max(map(len, prompt_ids)), max_new_tokens, sorted(set(answers)))
  except CacheFullError as e:
    raise ConfigError(f"{field}: {e}") from None


def train_rl(
  lm,
  cfg: RLConfig,
  pcfg: ProbeConfig,
  workdir: str,
  *,
  mesh=None,
  reward: Callable | None = None,
  on_step: Callable[[int, dict], None] | None = None,
) -> RLResult:
  """Trains `lm`'s parameters with RL from `lm.params` (or resumes from `workdir`); `lm` itself is not changed.
  mesh: the update's mesh (a 'data' axis, optionally 'fsdp'); default `default_mesh(lm)`.
  reward(problem, response text) -> a finite number (default: the task's answer check, 1.0 or 0.0)."""
  if mesh is None:
    mesh = default_mesh(lm)
  prompts = check_run(lm, cfg, pcfg, mesh=mesh, reward=reward)
  tx, lr = make_optimizer(cfg.optimizer, cfg.steps * cfg.mini_batches)  # one optimizer update per mini-batch
  start = jax.tree.map(jnp.array, lm.params)  # a copy: the update donates its input buffers
  step = RLStep(lm, cfg, pcfg, prompts, tx, mesh=mesh, reward=reward, ref_params=lm.params if cfg.kl_coef > 0 else None)
  tcfg = TrainerConfig(steps=cfg.steps, seed=cfg.seed, log_every=cfg.log_every, checkpoint_every=cfg.checkpoint_every)
  state_tx = tx if prompts.order is None else with_data_position(tx)  # a data run checkpoints its data position
  trainer = Trainer(
    None, state_tx, tcfg, workdir, step_fn=step, learning_rate=lr, on_step=on_step, signature=signature(lm, cfg, pcfg)
  )
  res = trainer.fit(start, lambda i: i)
  return RLResult(params=res.params, metrics=res.metrics, step=res.step)
