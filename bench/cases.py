"""The four measurements, each reprobe-jax against PyTorch `transformers` on one `Pair`; each returns a row dict.

Every side is warmed up first (the warm-up's XLA compile time is reported apart), then timed over `repeats`
calls; throughput uses the median. Each row also records a parity check, so a fast but wrong side shows.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from bench import prm
from bench.pair import Pair, step_trajectories
from bench.timing import time_call
from reprobe_jax.models import CaptureSpec, LanguageModel, SamplingParams

ATTN_WINDOW = 5
TOP_K = 4


def _torch():
  import torch

  return torch


def _sync(pair: Pair):
  if pair.device.type == "cuda":
    _torch().cuda.synchronize()


def _side(timing, work: float, unit: str = "tokens") -> dict:
  return {f"{unit}_per_s": work / timing.median_s, unit: work, **timing.to_json()}


def _row(name: str, title: str, shape: dict, ours: dict, hf: dict, unit: str = "tokens", **extra) -> dict:
  key = f"{unit}_per_s"
  return {
    "name": name,
    "title": title,
    "shape": shape,
    "unit": key,
    "ours": ours,
    "hf": hf,
    "ratio": ours[key] / hf[key],
    "ratio_of_min_times": hf["min_s"] / ours["min_s"],
    **extra,
  }


def _rel_diff(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# ---------------------------------------------------------------------------------------------- prefill


def hf_capture(hf, ids, window: int, k: int):
  """What a PyTorch user runs to get our capture: every hidden state, full attention maps cut to the last
  `window` keys per query ([B, T, L, H, W], as CaptureSpec.attn_window) and the top-k next-token probabilities."""
  torch = _torch()
  out = hf(input_ids=ids, output_hidden_states=True, output_attentions=True)
  t = ids.shape[1]
  q = torch.arange(t, device=ids.device)
  keys = q[:, None] - torch.arange(window, device=ids.device)[None, :]  # [T, W]
  idx, valid = keys.clamp(min=0), (keys >= 0).float()
  wins = [a.gather(-1, idx.expand(*a.shape[:2], t, window)) * valid for a in out.attentions]  # [B, H, T, W]
  win = torch.stack(wins, dim=1).permute(0, 3, 1, 2, 4)  # [B, T, L, H, W]
  top = torch.softmax(out.logits, dim=-1).topk(k, dim=-1).values  # [B, T, K]
  return out.hidden_states, win, top


def prefill_capture(pair: Pair, ids: np.ndarray, repeats: int) -> dict:
  """Forward with capture (all hidden states, attention window 5, top-4 probs) vs HF eager with
  output_hidden_states and output_attentions (the only HF path that returns attention probabilities)."""
  torch = _torch()
  lm, cfg = pair.lm, pair.lm.config
  spec = CaptureSpec(hidden_layers=tuple(range(cfg.num_layers + 1)), attn_window=ATTN_WINDOW, top_k_probs=TOP_K)

  def ours():
    o = lm.forward(ids, capture=spec)
    return jax.block_until_ready((o.hidden_states, o.attn_window, o.top_probs, o.logits))

  t_ours, (hs, win, top, _) = time_call(ours, repeats)
  pair.hf.set_attn_implementation("eager")
  ids_t = torch.from_numpy(ids).long().to(pair.device)

  def hf():
    with torch.inference_mode():
      out = hf_capture(pair.hf, ids_t, ATTN_WINDOW, TOP_K)
    _sync(pair)
    return out

  try:
    t_hf, (hf_hs, hf_win, hf_top) = time_call(hf, repeats)
  finally:
    pair.hf.set_attn_implementation("sdpa")
  n = float(ids.size)
  parity = {
    "hidden_last_rel": _rel_diff(hs[cfg.num_layers], hf_hs[-1].cpu().numpy()),
    "attn_window_max_abs": float(np.max(np.abs(np.asarray(win) - hf_win.cpu().numpy()))),
    "top_probs_max_abs": float(np.max(np.abs(np.asarray(top) - hf_top.cpu().numpy()))),
  }
  return _row(
    "prefill_capture",
    "Prefill with capture (all hidden states, attention window 5, top-4 probs) "
    "vs HF eager + output_hidden_states + output_attentions",
    {"batch": ids.shape[0], "seq": ids.shape[1]},
    _side(t_ours, n),
    _side(t_hf, n),
    parity=parity,
  )


def prefill_plain(pair: Pair, ids: np.ndarray, repeats: int) -> dict:
  """Logits-only forward vs HF forward with SDPA attention."""
  torch = _torch()
  lm = pair.lm

  def ours():
    return lm.forward(ids).logits.block_until_ready()

  t_ours, logits = time_call(ours, repeats)
  pair.hf.set_attn_implementation("sdpa")
  ids_t = torch.from_numpy(ids).long().to(pair.device)

  def hf():
    with torch.inference_mode():
      out = pair.hf(input_ids=ids_t).logits
    _sync(pair)
    return out

  t_hf, hf_logits = time_call(hf, repeats)
  n = float(ids.size)
  return _row(
    "prefill_plain",
    "Plain prefill (logits only) vs HF forward (sdpa)",
    {"batch": ids.shape[0], "seq": ids.shape[1]},
    _side(t_ours, n),
    _side(t_hf, n),
    parity={"logits_rel": _rel_diff(logits, hf_logits.cpu().numpy())},
  )


# ---------------------------------------------------------------------------------------------- decode


def _without_eos(lm: LanguageModel) -> LanguageModel:
  """The same weights with no EOS token, so every row decodes max_new_tokens: our counterpart of HF's
  min_new_tokens (an instruct model otherwise ends some rows after a few tokens, and the two sides would
  time different work). Prompts are token ids, so no tokenizer is needed."""
  return lm.sharing_weights(config=dataclasses.replace(lm.config, eos_token_ids=()), tokenizer=None)


def _hf_generate(pair: Pair, prompts: np.ndarray, n_new: int, repeats: int, cache: str | None = None):
  """Times HF's greedy generate (min_new_tokens = max_new_tokens = n_new) on prompts [B, P]; returns (timing,
  new tokens [B, n_new]). cache: HF's `cache_implementation` ('static'), None for its default dynamic cache."""
  torch = _torch()
  ids_t = torch.from_numpy(prompts).long().to(pair.device)
  pair.hf.set_attn_implementation("sdpa")
  pad = _without_eos(pair.lm).pad_id()
  kw = {} if cache is None else {"cache_implementation": cache}

  def hf():
    with torch.inference_mode():
      out = pair.hf.generate(
        input_ids=ids_t,
        attention_mask=torch.ones_like(ids_t),
        do_sample=False,
        max_new_tokens=n_new,
        min_new_tokens=n_new,
        pad_token_id=pad,
        temperature=None,
        top_p=None,
        top_k=None,
        **kw,
      )
    _sync(pair)
    return out

  t_hf, out = time_call(hf, repeats)
  return t_hf, out[:, prompts.shape[1] :].cpu().numpy()


def _generate_pair(pair: Pair, prompts: np.ndarray, n_new: int, repeats: int, cache: str | None = None):
  """Times our greedy generate and HF's (min_new_tokens = max_new_tokens = n_new, `cache_implementation=cache`) on
  the same prompts [B, P]."""
  lm = _without_eos(pair.lm)
  lists = prompts.tolist()
  greedy = SamplingParams(temperature=0)
  t_ours, gen = time_call(lambda: lm.generate(lists, greedy, max_new_tokens=n_new), repeats)
  t_hf, hf_tokens = _hf_generate(pair, prompts, n_new, repeats, cache)
  return t_ours, gen, t_hf, hf_tokens


def decode_loop_step(lm: LanguageModel, prompts: np.ndarray, n_new: int, repeats: int) -> dict:
  """Our greedy decode loop timed alone: each repeat prefills (untimed), then times `Sampler.decode` over the
  n_new tokens, which runs n_new - 1 forwards (the first token comes from the prefill's logits). The step is the
  fastest repeat over n_new - 1, so the last iteration's sampling is counted in, never a forward left out. No
  difference of two runs: a difference of two fastest runs of ~0.6 s over a 15-step gap moved the batch-1 step by
  +-4 ms (9.7 to 21 ms) between two passes on one machine."""
  lm = _without_eos(lm)
  smp = lm.sampler(SamplingParams(temperature=0))
  lists = prompts.tolist()
  warm = smp.decode(smp.prefill(lists, max_new_tokens=n_new))  # compiles both programs
  jax.block_until_ready(warm)
  lengths = np.asarray(warm.lengths)[: len(lists)]
  times = []
  for _ in range(repeats):
    state = jax.block_until_ready(smp.prefill(lists, max_new_tokens=n_new))
    t0 = time.perf_counter()
    jax.block_until_ready(smp.decode(state))
    times.append(time.perf_counter() - t0)
  return {
    "step_s": min(times) / (n_new - 1),
    "forwards": n_new - 1,
    "times_s": times,
    "valid": bool(n_new > 1 and np.all(lengths == n_new)),
  }


def decode(pair: Pair, prompts: np.ndarray, n_new: int, repeats: int, *, step_time: bool = False) -> dict:
  """Batched greedy decoding (prefill included, as a user sees it) vs HF generate.

  Both sides decode n_new tokens per row (EOS off on ours, min_new_tokens on HF); throughput counts the tokens
  actually produced. HF's min_new_tokens masks EOS while ours only ignores it, so the greedy parity check compares
  each row up to our first EOS token. With step_time, the per-token decode time without the prefill (the
  bandwidth roofline reads batch 1's): ours from our decode loop timed alone (`decode_loop_step`), HF's from the
  difference of a second pair of runs with fewer new tokens (same length bucket: no recompile), since `generate`
  cannot be timed apart from its prefill; and a third pair with one new token gives the time to the first token
  (prefill included).
  """
  b, p = prompts.shape
  t_ours, gen, t_hf, hf_tokens = _generate_pair(pair, prompts, n_new, repeats)
  produced = float(gen.lengths.sum())
  eos = np.asarray(pair.lm.eos_mask())
  same = []
  for i in range(b):
    row = gen.tokens[i, : gen.lengths[i]]
    stop = int(np.argmax(eos[row])) if eos[row].any() else len(row)
    same.append(np.array_equal(row[:stop], hf_tokens[i, :stop]))
  extra = {
    "parity": {
      "greedy_rows_equal": float(np.mean(same)),
      "ours_tokens_produced": produced,
      "hf_tokens_produced": float(hf_tokens.size),
    }
  }
  if step_time:
    n_short = n_new // 2 + 1
    t_hf2, _ = _hf_generate(pair, prompts, n_short, repeats)
    loop = decode_loop_step(pair.lm, prompts, n_new, repeats)
    # Fastest runs, not medians: a difference of two medians on a loaded machine can come out near zero or negative
    # (a step "faster" than the memory allows); the fastest run of each length is the least disturbed one.
    hf_step = (t_hf.min_s - t_hf2.min_s) / (n_new - n_short)
    extra["decode_step_s"] = {
      "ours": loop["step_s"],
      "hf": hf_step,
      "from_new_tokens": [n_short, n_new],
      "ours_from": f"decode loop alone, {loop['forwards']} forwards",
      "of": "fastest runs",
      "ours_loop_times_s": loop["times_s"],
      "valid": loop["valid"] and bool(np.all(gen.lengths == n_new)) and hf_step > 0,
    }
    # The other phase: prefill and the first token alone (one new token), so a batch's end-to-end ratio can be read
    # as its two phases (at batch 32 the 64-token prompts' prefill is about half of our end-to-end time).
    t_ours1, _, t_hf1, _ = _generate_pair(pair, prompts, 1, repeats)
    extra["first_token_s"] = {"ours": t_ours1.min_s, "hf": t_hf1.min_s, "of": "fastest runs"}
  return _row(
    f"decode_b{b}",
    f"Greedy decode, batch {b} ({p}-token prompts, {n_new} new tokens) vs HF generate",
    {"batch": b, "prompt": p, "new_tokens": n_new},
    _side(t_ours, produced),
    _side(t_hf, float(b * n_new)),
    **extra,
  )


def decode_static(pair: Pair, prompts: np.ndarray, n_new: int, repeats: int) -> dict:
  """Batched greedy decoding vs HF generate with a static KV cache (`cache_implementation="static"`: preallocated to
  the prompt plus n_new, the cache torch.compile needs; not compiled here). End to end, as `decode` times it."""
  b, p = prompts.shape
  t_ours, gen, t_hf, hf_tokens = _generate_pair(pair, prompts, n_new, repeats, cache="static")
  same = [np.array_equal(gen.tokens[i, : gen.lengths[i]], hf_tokens[i, : gen.lengths[i]]) for i in range(b)]
  return _row(
    f"decode_b{b}_hf_static",
    f"Greedy decode, batch {b} ({p}-token prompts, {n_new} new tokens) vs HF generate with a static cache",
    {"batch": b, "prompt": p, "new_tokens": n_new},
    _side(t_ours, float(gen.lengths.sum())),
    _side(t_hf, float(b * n_new)),
    parity={"greedy_rows_equal": float(np.mean(same))},
  )


# ---------------------------------------------------------------------------------------------- step scoring


def _probe_side(pair: Pair, ids, mask, spans, repeats: int) -> dict:
  """The probe (docs/method.md §A4, paper shape) over packed windows [0, step end) of the response's captured last-layer
  hidden states (next-token aligned, docs/method.md §A3); the features are the generation pass's, not timed."""
  from flax import nnx

  from reprobe_jax.features import FeatureSpec, forward_values
  from reprobe_jax.probe import Probe, ProbeConfig, count_params
  from reprobe_jax.probe.data import pack_spans, spans_shape
  from reprobe_jax.probe.model import score_packed

  lm = pair.lm
  spec = FeatureSpec.from_name("hidden")
  out = lm.forward(ids, mask, capture=spec.capture())
  h = np.asarray(spec.assemble(forward_values({"hidden_states": out.hidden_states}), lm.config.num_layers))
  _, _, tokens, rel_spans, first = prm.split_rows(ids, mask, spans)  # the steps the PRM scores
  t = tokens.shape[1]
  feats = np.zeros((len(ids), t, h.shape[-1]), np.float32)  # response token j reads position first + j - 1
  for i in range(len(ids)):
    n = int(mask[i].sum() - first[i])
    feats[i, :n] = h[i, first[i] - 1 : first[i] - 1 + n]
  rel = [np.asarray([(a, e) for a, e in sp if e > a], np.int32) for sp in rel_spans]
  chosen = [(i, k) for i, sp in enumerate(rel) for k in range(len(sp))]
  pack = jax.tree.map(jax.numpy.asarray, pack_spans(rel, chosen, spans_shape(rel, len(ids), t)))
  probe = Probe(ProbeConfig(feature_dim=lm.config.hidden_size), rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(probe)
  feats_j = jax.numpy.asarray(feats)
  timing, _ = time_call(lambda: score_packed(graphdef, params, feats_j, pack).block_until_ready(), repeats)
  cfg = probe.config
  return {
    "status": "measured",
    **_side(timing, float(len(chosen)), "steps"),
    "params": count_params(probe),
    "config": {
      "d_model": cfg.d_model,
      "n_layers": cfg.n_layers,
      "n_heads": cfg.n_heads,
      "feature_dim": cfg.feature_dim,
    },
    "window_tokens": int(sum(int(rel[i][k][1]) for i, k in chosen)),
    "features": "last-layer hidden states captured by the generation pass (not timed)",
  }, cfg


def step_scoring(pair: Pair, batch: int, length: int, repeats: int) -> dict:
  """Step scoring: the PRM (target backbone + Linear-ReLU-Linear head) on the whole text in both
  frameworks and incrementally in ours, against the probe over packed windows. Work unit: steps scored; the
  probe's ratio is against the PRM's fastest path."""
  torch = _torch()
  from reprobe_jax.prm.model import from_target

  lm = pair.lm
  ids, mask, _, valid, spans = step_trajectories(pair, batch, length)
  model = from_target(lm, separator_id=lm.pad_id(), seed=0)
  prompt, pmask, tokens, rel = (jax.numpy.asarray(x) for x in prm.split_rows(ids, mask, spans)[:4])
  t_ours, r_ours = time_call(lambda: prm.rewards_whole(model, prompt, pmask, tokens, rel).block_until_ready(), repeats)
  room = int(tokens.shape[1] + rel.shape[1])
  t_inc, r_inc = time_call(
    lambda: prm.rewards_incremental(model, prompt, pmask, tokens, rel, room=room).block_until_ready(), repeats
  )
  head = {
    k: torch.from_numpy(np.array(v)).to(pair.device)
    for k, v in {"w1": model.head.w1, "b1": model.head.b1, "w2": model.head.w2, "b2": model.head.b2}.items()
  }
  j_ids, j_mask, j_pos, j_sep = (
    torch.from_numpy(x).long().to(pair.device) for x in prm.joined_inputs(model, prompt, pmask, tokens, rel)
  )

  def hf():
    with torch.inference_mode():
      out = prm.torch_step_rewards(pair.hf, head, j_ids, j_mask, j_pos, j_sep)
    _sync(pair)
    return out

  t_hf, r_hf = time_call(hf, repeats)
  steps = float(valid.sum())
  ours, hf_side, inc = (_side(t, steps, "steps") for t in (t_ours, t_hf, t_inc))
  tokens_read = float(np.asarray(j_mask).sum())
  for side in (ours, hf_side):
    side["tokens_per_s"] = tokens_read / side["median_s"]
  probe, pcfg = _probe_side(pair, ids, mask, spans, repeats)
  fastest = max(ours["steps_per_s"], hf_side["steps_per_s"], inc["steps_per_s"])
  probe["vs_best_prm"] = probe["steps_per_s"] / fastest
  r_ours, r_inc = np.asarray(r_ours), np.asarray(r_inc)
  return _row(
    "step_scoring",
    "Step scoring: PRM (target backbone + Linear-ReLU-Linear head, whole text), reprobe-jax vs PyTorch",
    {"batch": batch, "seq": int(j_ids.shape[1]), "steps": int(steps)},
    ours,
    hf_side,
    unit="steps",
    probe=probe,
    prm_incremental=inc,
    flops=prm.flops(lm.config, pcfg, np.asarray(rel)),
    parity={
      "step_reward_max_abs": float(np.max(np.abs(r_ours - r_hf.cpu().numpy())[valid])),
      "incremental_max_abs": float(np.max(np.abs(r_inc - r_ours)[valid])),
    },
  )


# ---------------------------------------------------------------------------------------------- shared context


def _cache_bytes(cache) -> int:
  """Bytes of every buffer a KV cache holds, its shared prefix included (each buffer counted once)."""
  return int(sum(x.nbytes for x in jax.tree.leaves(cache)))


def shared_context(pair: Pair, context: np.ndarray, n: int, n_new: int, repeats: int) -> dict:
  """N continuations of one context (Best-of-N, beam candidates, SPAE's probes): rows that read the context's cache
  as a shared prefix (no copy) vs rows that each hold a copy of it (`KVCache.take`). Both sides: prefill the
  context once, branch n rows, greedy-decode n_new tokens. Reports time, cache bytes and parity (both in-library:
  PyTorch has no shared-prefix decode to compare with)."""
  lm = pair.lm
  smp = lm.sampler(SamplingParams(temperature=0))
  ids = [context.tolist()]

  def run(share: bool):
    state = smp.decode(smp.prefill(ids, max_new_tokens=n_new, n=n, share=share))
    return jax.block_until_ready(state)

  out = {}
  states = {}
  for name, share in (("shared", True), ("copied", False)):
    t, state = time_call(lambda share=share: run(share), repeats)
    states[name] = state
    out[name] = {**_side(t, float(n * n_new)), "cache_bytes": _cache_bytes(state.cache)}
  a, b = states["shared"], states["copied"]
  parity = {
    "tokens_equal": float(np.mean(np.asarray(a.tokens) == np.asarray(b.tokens))),
    "logprob_max_abs": float(np.max(np.abs(np.asarray(a.logprobs) - np.asarray(b.logprobs)))),
  }
  return {
    "name": "shared_context",
    "shape": {"context": int(context.size), "continuations": n, "new_tokens": n_new},
    "shared": out["shared"],
    "copied": out["copied"],
    "speedup": out["copied"]["median_s"] / out["shared"]["median_s"],
    "memory_ratio": out["copied"]["cache_bytes"] / out["shared"]["cache_bytes"],
    "parity": parity,
  }
