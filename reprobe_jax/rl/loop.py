"""The RL loop (docs/method.md §B2): rollout -> reward -> dynamic sampling -> step potentials (SPAE) -> token-level
advantages -> clipped policy-gradient update, over a train state (policy params, optimizer state, step) that the shared
`Trainer` checkpoints with orbax and logs to TensorBoard.

    result = train_rl(lm, RLConfig(advantage="spae"), ProbeConfig(), workdir)

Functional core: the advantage estimators (`advantages`), the loss and the jitted, donated, micro-batched,
data-parallel update (`loss`), the rollout and probing calls (the decode-state API and `Prober`, both taking the
parameters as an argument, so new parameters compile nothing). Host code only orchestrates: `RLStep` is the
Trainer's step for step i, a function of (params, opt_state, i) and the config alone, so a killed run resumes to the
same parameters and metrics as an uninterrupted one.

A method is an estimator plus the loss and sampling it is trained with (`METHODS`): GRPO (group z-score,
sequence-mean token-mean loss, symmetric clip 0.2, no dynamic sampling), DAPO (group z-score, token-mean, clip
0.2 / 0.28, dynamic sampling), RF-B (group mean baseline, batch whitening; DAPO's loss and sampling) and SPAE
(docs/method.md §B2; DAPO's loss and sampling, groups dropped before probing). Any of them can be overridden in
RLConfig.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from reprobe_jax.fields import SEED, Int, OneOf, Real, Seq, check_fields, field_name
from reprobe_jax.errors import ConfigError
from reprobe_jax.features.extraction import model_fingerprint
from reprobe_jax.models import make_mesh
from reprobe_jax.models.sampling import SamplingParams
from reprobe_jax.rl import advantages as adv_lib
from reprobe_jax.rl import loss as loss_lib
from reprobe_jax.rl.rollout import PromptSet, collect, policy_batch, potentials, rollout_fn, step_batch
from reprobe_jax.spae.potential import ProbeConfig
from reprobe_jax.spae.prober import Prober
from reprobe_jax.steps import THINK_CLOSE, THINK_OPEN
from reprobe_jax.tasks import DIFFICULTIES, DOMAINS, make_problems
from reprobe_jax.tasks.splits import SPLIT_SEEDS
from reprobe_jax.train.optimizer import OptimizerConfig, make_optimizer
from reprobe_jax.train.trainer import Trainer, TrainerConfig
from reprobe_jax.trajectories import prompt_text


@dataclasses.dataclass(frozen=True)
class Method:
  """The loss and sampling an estimator is trained with (the defaults RLConfig's None fields take)."""

  aggregation: str
  clip_high: float
  dynamic_sampling: bool


_DAPO = Method(aggregation="token-mean", clip_high=0.28, dynamic_sampling=True)
METHODS = {
  "grpo": Method(aggregation="seq-mean-token-mean", clip_high=0.2, dynamic_sampling=False),
  "dapo": _DAPO,
  "rf_b": _DAPO,
  "spae": _DAPO,
}


@dataclasses.dataclass(frozen=True)
class RLConfig:
  """advantage: an estimator's name (`advantages.ESTIMATORS`). Per step: `prompts_per_step` groups of
  `group_size` samples are trained on; rollout rounds draw `prompts_per_round` prompts each, at most
  1 + max_refill_rounds rounds when dynamic sampling refills the batch. mini_batches: optimizer updates per
  rollout batch (clipping acts from the second); micro_batches: gradient accumulation within each. None fields
  take the method's default (`METHODS`). Train prompts: `train_problems` problems per difficulty of each train
  domain from the RL train split (disjoint from the target's own data and from val / test)."""

  advantage: str = "spae"
  steps: int = 20
  prompts_per_step: int = 8
  group_size: int = 8
  prompts_per_round: int = 8
  max_refill_rounds: int = 2
  dynamic_sampling: bool | None = None
  max_new_tokens: int = 192
  sampling: SamplingParams = SamplingParams(temperature=1.0, top_k=0, top_p=1.0)  # of the rollouts: top_k stays 0
  optimizer: OptimizerConfig = OptimizerConfig(
    learning_rate=5e-4, schedule="constant", warmup_steps=0, weight_decay=0.0, grad_clip=1.0
  )
  mini_batches: int = 2
  micro_batches: int = 1
  clip_low: float = 0.2
  clip_high: float | None = None
  aggregation: str | None = None
  kl_coef: float = 0.0
  alpha: float = 0.5
  xi: float = 0.5
  train_domains: tuple[str, ...] = ("arithmetic",)
  train_difficulties: tuple[int, ...] = (1, 2, 3)
  train_problems: int = 200
  few_shot: int = 0
  seed: int = 0
  log_every: int = 1
  checkpoint_every: int = 10

  def __post_init__(self):
    check_fields(self, {"advantage": OneOf(adv_lib.ESTIMATORS.names())})  # the ones registered now, by field
    check_fields(
      self,
      {
        "steps": Int(1),
        "prompts_per_step": Int(1),
        "group_size": Int(2),
        "prompts_per_round": Int(1),
        "max_refill_rounds": Int(0),
        "max_new_tokens": Int(1),
        "mini_batches": Int(1),
        "micro_batches": Int(1),
        "clip_low": Real(0.0, 1.0),
        "kl_coef": Real(0.0),
        "alpha": Real(0.0, 1.0),
        "xi": Real(0.0),
        "train_domains": Seq(OneOf(DOMAINS)),
        "train_difficulties": Seq(OneOf(DIFFICULTIES)),
        "train_problems": Int(1),
        "few_shot": Int(0),
        "seed": SEED,
        "log_every": Int(1),
        "checkpoint_every": Int(1),
      },
    )
    check_fields(self.sampling, {"temperature": Real(0.0, low_open=True)}, field_name(self, "sampling"))
    if self.sampling.top_k != 0:
      raise ConfigError(
        f"{field_name(self, 'sampling')}.top_k: expected 0 (off), got {self.sampling.top_k!r}: the "
        "RL rollouts never filter by top-k (temperature and top_p are theirs to set)"
      )
    if self.clip_high is not None and not 0.0 <= self.clip_high:
      raise ConfigError(f"{field_name(self, 'clip_high')} must be >= 0, got {self.clip_high}")
    if self.aggregation is not None and self.aggregation not in loss_lib.AGGREGATIONS:
      raise ConfigError(
        f"{field_name(self, 'aggregation')} must be one of {loss_lib.AGGREGATIONS}, got {self.aggregation!r}"
      )
    if not self.train_domains or not self.train_difficulties:
      raise ConfigError(f"{field_name(self, 'train_domains')} and train_difficulties must not be empty")
    rows = self.prompts_per_step * self.group_size
    if rows % self.mini_batches or (rows // self.mini_batches) % self.micro_batches:
      raise ConfigError(
        f"{field_name(self, 'mini_batches')}={self.mini_batches} and micro_batches="
        f"{self.micro_batches} must divide the {rows} rows of a step (prompts_per_step x "
        "group_size), micro-batches within each mini-batch"
      )

  @property
  def method(self) -> Method:
    base = METHODS.get(self.advantage, _DAPO)
    return Method(
      aggregation=self.aggregation or base.aggregation,
      clip_high=base.clip_high if self.clip_high is None else self.clip_high,
      dynamic_sampling=base.dynamic_sampling if self.dynamic_sampling is None else self.dynamic_sampling,
    )

  @property
  def rounds(self) -> int:
    return 1 + (self.max_refill_rounds if self.method.dynamic_sampling else 0)

  def loss_config(self) -> loss_lib.LossConfig:
    m = self.method
    return loss_lib.LossConfig(
      clip_low=self.clip_low, clip_high=m.clip_high, aggregation=m.aggregation, kl_coef=self.kl_coef
    )


def train_prompts(lm, cfg: RLConfig) -> PromptSet:
  """The RL prompt set (thinking mode): `train_problems` per difficulty and train domain, from the train split."""
  problems = []
  for domain in cfg.train_domains:
    for d in cfg.train_difficulties:
      problems += make_problems(domain, cfg.train_problems, SPLIT_SEEDS["train"] + cfg.seed, d)
  ids = lm.encode([prompt_text(lm, p, "thinking", cfg.few_shot) for p in problems])
  return PromptSet(problems=tuple(problems), prompt_ids=tuple(tuple(i) for i in ids))


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
    self.cfg, self.prompts, self.reward = cfg, prompts, reward
    self.policy = copy.copy(lm)  # the same model with the parameters of the step (set per call)
    self.estimator = adv_lib.get_estimator(cfg.advantage)
    self.adv_cfg = adv_lib.AdvantageConfig(alpha=cfg.alpha, xi=cfg.xi, eps_sat=pcfg.eps_sat)
    self.prober = Prober(self.policy, pcfg) if self.estimator.needs_potentials else None
    tok = lm.tokenizer
    think = tok.convert_tokens_to_ids(THINK_OPEN)
    self.think_id = think if isinstance(think, int) and think != tok.unk_token_id else None
    close = tok.convert_tokens_to_ids(THINK_CLOSE)
    self.close_id = close if isinstance(close, int) and close != tok.unk_token_id else None
    mb = cfg.micro_batches
    self.update = loss_lib.make_update(lm.static_graph, tx, cfg.loss_config(), micro_batches=mb, mesh=mesh)
    self.logprobs = loss_lib.make_logprobs(lm.static_graph, micro_batches=mb * cfg.mini_batches, mesh=mesh)
    self.ref_params = ref_params
    if cfg.kl_coef > 0 and ref_params is None:
      raise ConfigError("RLStep: kl_coef > 0 needs the reference parameters")

  def __call__(self, params, opt_state, step, rng, frozen):
    del rng, frozen  # every key is derived from (seed, step) and problem ids
    cfg, step = self.cfg, int(step)
    t0 = time.perf_counter()
    self.policy.params = params
    plan = self.prompts.plan(cfg.seed, step, cfg.prompts_per_round, cfg.rounds)
    roll = rollout_fn(
      self.policy,
      self.prompts,
      group_size=cfg.group_size,
      max_new_tokens=cfg.max_new_tokens,
      sampling=cfg.sampling,
      seed=cfg.seed,
      step=step,
      reward=self.reward,
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
          **{k: float("nan") for k in ("kept_reward", "phi_mean", "saturated_share", "checking_tokens")},
        },
      )
    pots = None
    if self.prober is not None:
      pots = potentials(self.prober, groups, self.prompts, step, self.think_id)
    t2 = time.perf_counter()
    sb = step_batch(
      groups,
      pots,
      self.prompts,
      want=cfg.prompts_per_step,
      group_size=cfg.group_size,
      response_len=response_columns(groups),
      pad_id=self.policy.pad_id(),
    )
    advantages = adv_lib.compute_advantages(cfg.advantage, sb.adv_inputs, self.adv_cfg)
    tokens, attn, resp = jnp.asarray(sb.tokens), jnp.asarray(sb.attention_mask), jnp.asarray(sb.response_mask)
    old = self.logprobs(params, tokens, attn, resp)
    ref = self.logprobs(self.ref_params, tokens, attn, resp) if cfg.kl_coef > 0 else None
    pb = policy_batch(sb, advantages, old, ref)
    per = pb.tokens.shape[0] // cfg.mini_batches
    fetched = []
    for m in range(cfg.mini_batches):
      part = jax.tree.map(lambda x: x[m * per : (m + 1) * per], pb)
      n_tok, n_seq = loss_lib.batch_counts(part)
      params, opt_state, met = self.update(params, opt_state, part, n_tok, n_seq)
      fetched.append(met)
    fetched = jax.device_get(fetched)
    # token-weighted over the mini-batches (a mini-batch without tokens contributes nothing)
    w = np.array([float(f["tokens"]) for f in fetched])
    mean = lambda k: float(np.sum([float(f[k]) for f in fetched] * w) / max(w.sum(), 1.0))
    t3 = time.perf_counter()
    kept = [t for g in groups for t in g.trajectories]
    out = {
      **base,
      "loss": float(np.mean([float(f["loss"]) for f in fetched])),
      "kept_reward": float(np.mean([t.reward for t in kept])),
      "clip_fraction": mean("clip_frac"),
      "kl": mean("kl_mean"),
      "grad_norm": float(np.mean([float(f["grad_norm"]) for f in fetched])),
      "ratio": mean("ratio_mean"),
      "adv_abs": float(jnp.sum(jnp.abs(advantages) * pb.response_mask) / jnp.maximum(jnp.sum(pb.response_mask), 1)),
      "time_probe": t2 - t1,
      "time_update": t3 - t2,
      "skipped": 0.0,
    }
    out.update(self._potential_stats(kept, pots))
    return params, opt_state, out

  def _potential_stats(self, kept, pots) -> dict[str, float]:
    """Mean Phi over probed boundaries, share of trajectories with a saturated boundary, and checking tokens (from
    the first saturated boundary to `</think>`, mean over correct saturated trajectories; docs/method.md §B3)."""
    if pots is None:
      return {"phi_mean": float("nan"), "saturated_share": float("nan"), "checking_tokens": float("nan")}
    phis = [x for p in pots for x in p.phi if np.isfinite(x)]
    sat = [p.first_saturated is not None for p in pots]
    checking = []
    for t, p in zip(kept, pots):
      if t.reward > 0 and p.first_saturated is not None:
        ids = list(t.text_ids)
        end = ids.index(self.close_id) if self.close_id is not None and self.close_id in ids else len(ids)
        checking.append(max(0, end - int(p.cuts[p.first_saturated]) - 1))
    return {
      "phi_mean": float(np.mean(phis)) if phis else float("nan"),
      "saturated_share": float(np.mean(sat)),
      "checking_tokens": float(np.mean(checking)) if checking else float("nan"),
    }


@dataclasses.dataclass
class RLResult:
  params: Any
  metrics: dict[str, list[float]]  # STEP_METRICS per step (1-based steps in order)
  step: int


def signature(lm, cfg: RLConfig, pcfg: ProbeConfig) -> dict:
  """What an RL checkpoint depends on: the start model, the RL and probe configs."""
  return {"rl": dataclasses.asdict(cfg), "probe": dataclasses.asdict(pcfg), "start_model": model_fingerprint(lm)}


def default_mesh():
  """A 'data' mesh over every device when there is more than one (the update's rows split over them), else None."""
  return make_mesh(data=jax.device_count()) if jax.device_count() > 1 else None


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
  mesh: the update's data-parallel mesh ('data' axis); None on one device, else `default_mesh()`'s over all."""
  if mesh is None:
    mesh = default_mesh()
  if mesh is not None:
    per = cfg.prompts_per_step * cfg.group_size // (cfg.mini_batches * cfg.micro_batches)
    if per % mesh.shape["data"]:
      raise ConfigError(
        f"a micro-batch of {per} rows (prompts_per_step x group_size / (mini_batches x "
        f"micro_batches)) does not split over the mesh's {mesh.shape['data']} 'data' devices"
      )
  if lm.tokenizer is None:
    raise ConfigError("train_rl needs the model's tokenizer (prompts, answer checks, boundaries)")
  prompts = train_prompts(lm, cfg)
  prompts.plan(cfg.seed, 0, cfg.prompts_per_round, cfg.rounds)  # a set too small to refill fails here, before work
  longest = max(map(len, prompts.prompt_ids))
  if longest + cfg.max_new_tokens > lm.config.max_position_embeddings:
    raise ConfigError(
      f"RL prompts of up to {longest} tokens + max_new_tokens={cfg.max_new_tokens} exceed "
      f"max_position_embeddings={lm.config.max_position_embeddings}"
    )
  tx, lr = make_optimizer(cfg.optimizer, cfg.steps * cfg.mini_batches)  # one optimizer update per mini-batch
  start = jax.tree.map(jnp.array, lm.params)  # a copy: the update donates its input buffers
  step = RLStep(lm, cfg, pcfg, prompts, tx, mesh=mesh, reward=reward, ref_params=lm.params if cfg.kl_coef > 0 else None)
  tcfg = TrainerConfig(steps=cfg.steps, seed=cfg.seed, log_every=cfg.log_every, checkpoint_every=cfg.checkpoint_every)
  trainer = Trainer(
    None, tx, tcfg, workdir, step_fn=step, learning_rate=lr, on_step=on_step, signature=signature(lm, cfg, pcfg)
  )
  res = trainer.fit(start, lambda i: i)
  return RLResult(params=res.params, metrics=res.metrics, step=res.step)
