"""What runs data-parallel over a mesh's data axis (docs/scale.md): probe training and probe scoring, Best-of-N,
beam search, DVTS and the SPAE Prober, on 8 CPU devices in one subprocess. Each part asserts where its inputs, its
carries (the decode state's KV cache and buffers, the search's book, the optimiser state) and its outputs live
(rows on 'data', parameters whole on every device), and that it gives what one device gives."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(r"""
    import os, re, sys, tempfile
    import jax
    import numpy as np
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec as P
    sys.path.insert(0, sys.argv[1])
    from test_probe_train import F, _examples
    from test_tts_search import MODEL, PROMPTS, make_tokenizer
    from reprobe_jax.features import FeatureSpec
    from reprobe_jax.models import LanguageModel, ModelConfig, load_pretrained, make_mesh
    from reprobe_jax.models.sharding import ShardingCtx
    from reprobe_jax.probe import Probe, ProbeBundle, ProbeConfig
    from reprobe_jax.probe import train as probe_train
    from reprobe_jax.scorers import ProbeScorer, get_scorer
    from reprobe_jax.tts import SearchConfig
    from reprobe_jax.tts.beam import beam_search
    from reprobe_jax.tts.dvts import dvts

    best_of_n_mod, search_mod = sys.modules["reprobe_jax.tts.best_of_n"], sys.modules["reprobe_jax.tts.search"]
    assert jax.device_count() == 8, jax.devices()
    mesh = make_mesh(data=8, fsdp=1, tensor=1)
    ROWS, WHOLE = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    out_dir = tempfile.mkdtemp()

    def rows(tree, what):  # every array split by its rows over the 8 devices of 'data'
      for path, x in jax.tree_util.tree_leaves_with_path(tree):
        assert x.sharding.is_equivalent_to(ROWS, x.ndim), f"{what}{jax.tree_util.keystr(path)}: {x.sharding}"

    def whole(tree, what):  # every array whole on each of the 8 devices
      for path, x in jax.tree_util.tree_leaves_with_path(tree):
        ok = x.sharding.is_equivalent_to(WHOLE, x.ndim) and len(x.sharding.device_set) == 8
        assert ok, f"{what}{jax.tree_util.keystr(path)}: {x.sharding}"

    def same_results(a, b, what):
      for x, y in zip(a, b, strict=True):
        assert [c.response_ids for c in x.candidates] == [c.response_ids for c in y.candidates], what
        assert [c.steps for c in x.candidates] == [c.steps for c in y.candidates], what
        assert (x.sampled_steps, x.generated_tokens) == (y.sampled_steps, y.generated_tokens), what
        for c, d in zip(x.candidates, y.candidates):
          np.testing.assert_allclose(c.step_scores, d.step_scores, atol=1e-5, err_msg=what)

    # ---- probe training: batch rows split, parameters and optimiser state replicated, the gradient all-reduced
    train, val = _examples(64, 0), _examples(32, 1)
    pcfg = ProbeConfig(feature_dim=F, d_model=16, n_layers=1, n_heads=2, ff_dim=32, dropout=0.1)
    tcfg = probe_train.ProbeTrainConfig(batch_size=16, epochs=2)
    g1, p1, r1, h1 = probe_train.train_probe(pcfg, train, val, tcfg, os.path.join(out_dir, "one"))
    seen = {}

    class Spy(probe_train.Trainer):
      def fit(self, params, batches, *, frozen=None):
        seen["params"], seen["batch"] = params, batches(0)
        seen["result"] = super().fit(params, batches, frozen=frozen)
        return seen["result"]

    probe_train.Trainer = Spy
    g8, p8, r8, h8 = probe_train.train_probe(pcfg, train, val, tcfg, os.path.join(out_dir, "dp"), mesh=mesh)
    batch = seen["batch"]
    rows({"features": batch["features"], "labels": batch["labels"], "pack": batch["pack"]}, "probe batch")
    whole(seen["params"], "probe params (in)")
    whole(seen["result"].params, "probe params (out)")
    whole(seen["result"].opt_state, "probe optimiser state")
    whole(p8, "probe best params")
    # The same parameters as one device. Not the attention's key bias: its gradient is zero in exact arithmetic
    # (it adds q.b to every logit of a query's row, which softmax cancels), so Adam turns the reduction order's
    # rounding noise into steps of the learning rate's size; every other tensor moved ~1e-3 and agrees to ~3e-8.
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(p1), jax.tree.leaves(p8), strict=True):
      if "'key']['bias'" not in jax.tree_util.keystr(path):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, err_msg=jax.tree_util.keystr(path))
    for x, y in zip(h1, h8, strict=True):
      assert x["val_pr_auc"] == y["val_pr_auc"] and abs(x["train_loss"] - y["train_loss"]) < 1e-5, (x, y)
    ctx = ShardingCtx(mesh)
    grad = jax.jit(jax.grad(probe_train.probe_loss(g8, 3.0, ctx)))
    hlo = grad.lower(p8, batch, jax.random.key(0), r8).compile().as_text()
    assert "all-reduce" in hlo, "the data-parallel probe step has no all-reduce of the gradient"
    one = probe_train.predict_examples(g1, p1, r1, val, 16, F)
    dp = probe_train.predict_examples(g8, p8, r8, val, 16, F, mesh=mesh)
    for a, b in zip(one, dp, strict=True):
      np.testing.assert_allclose(a, b, atol=1e-5)
    print("probe training OK")

    # ---- a sharded target; its search and Best-of-N
    directory = os.path.join(out_dir, "lm")
    LanguageModel.random(MODEL, seed=0, tokenizer=make_tokenizer()).save_pretrained(directory)
    plain, sharded = load_pretrained(directory), load_pretrained(directory, mesh=mesh)
    spec = FeatureSpec(parts=("hidden", "attn", "logit"), hidden_layers=(-1,), attn_window=3, top_k=4)
    qc = ProbeConfig(feature_dim=spec.dim(plain.config), d_model=16, n_layers=1, n_heads=2, ff_dim=16)
    probe = get_scorer("probe", bundle=ProbeBundle.create(qc, nnx.split(Probe(qc, rngs=nnx.Rngs(0)))[1], spec))
    prompts = PROMPTS + [[1, 40, 41]]  # 4 prompts x 4 rows: 2 rows per device

    def spy(module, name, store):
      fn = getattr(module, name)
      def wrapped(*a, **k):
        out = fn(*a, **k)
        store.append((a, out, *k.values()))
        return out
      setattr(module, name, wrapped)
      return fn

    # ---- the sampler's prefill never makes a KV cache whole on one device: every buffer of its rows is made inside a
    # jitted program on the rows' sharding (an eager one would sit on the first device before the rows are split)
    import reprobe_jax.models.decode_state as decode_state_mod
    from reprobe_jax.models.kv_cache import KVCache
    made, eager = [], []
    kv_zeros, ds_share, ds_take = KVCache.zeros.__func__, decode_state_mod.share, decode_state_mod.take
    def zeros_spy(cls, *a, **k):
      out = kv_zeros(cls, *a, **k)
      (made if isinstance(out.valid, jax.core.Tracer) else eager).append("KVCache.zeros")
      return out
    def rows_spy(fn, name):
      def wrapped(state, *a, **k):
        out = fn(state, *a, **k)
        (made if isinstance(out.cache.valid, jax.core.Tracer) else eager).append(name)
        return out
      return wrapped
    KVCache.zeros = classmethod(zeros_spy)
    decode_state_mod.share = rows_spy(ds_share, "share")
    decode_state_mod.take = rows_spy(ds_take, "take")
    try:
      for share in (True, False):  # 4 prompts x 4 rows: the rows' own buffers split 2 per device
        made.clear(), eager.clear()
        st = sharded.sampler().prefill(prompts, max_new_tokens=8, n=4, share=share)
        assert not eager and len(made) >= 2, (share, made, eager)
        c = st.cache
        rows((c.k, c.v, c.valid, c.index, st.tokens, st.logprobs, st.lengths), f"prefill (share={share})")
        made.clear(), eager.clear()
        plain.sampler().prefill(prompts, max_new_tokens=8, n=4, share=share)  # one device: eager, as before
        assert eager, (share, made, eager)
    finally:
      KVCache.zeros = classmethod(kv_zeros)
      decode_state_mod.share, decode_state_mod.take = ds_share, ds_take
    print("prefill OK")

    decoded, feats, scored, cut = [], [], [], []
    spy(best_of_n_mod, "_decode_rows", decoded)
    spy(best_of_n_mod, "_features", feats)
    spy(best_of_n_mod, "candidate_rows", cut)
    spy(ProbeScorer, "dispatch_trajectories", scored)
    bcfg = SearchConfig("best_of_n", n=4, max_steps=3, max_new_tokens=16, seed=2)
    a = best_of_n_mod.best_of_n(plain, probe, prompts, bcfg)
    decoded.clear(), feats.clear(), scored.clear(), cut.clear()
    b = best_of_n_mod.best_of_n(sharded, probe, prompts, bcfg)
    same_results(a, b, "best_of_n")
    (args, state, *_), = decoded
    rows(args[2].cache.k + args[2].cache.v + (args[2].tokens, args[2].features), "best_of_n decode state (in)")
    c = state.cache
    rows((c.k, c.v, c.valid, c.index, state.tokens, state.logprobs, state.features, state.lengths, state.finish),
         "best_of_n decode state (out)")
    rows(feats[0][1], "best_of_n scorer features")
    rows(cut[0][1], "best_of_n candidates (steps aligned and cut on device)")
    rows(scored[0][1].values, "best_of_n probe scores")
    print("best_of_n OK")

    runs = []
    search_fn = spy(search_mod, "_search", runs)  # the jitted program itself, for its compiled text
    for strategy, run in (("beam", beam_search), ("dvts", dvts)):
      scfg = SearchConfig(strategy, n=2, beams=2, max_steps=4, max_new_tokens=24, seed=1)
      a = run(plain, probe, prompts, scfg)
      runs.clear()
      b = run(sharded, probe, prompts, scfg)
      same_results(a, b, strategy)
      (args, (state, book), _), = runs
      env, start = args
      rows(start.cache.k + start.cache.v + (start.tokens, start.features, start.lengths, start.rng), f"{strategy} in")
      rows(env.prompts, f"{strategy} scorer prompts")
      whole((env.params, env.scorer), f"{strategy} target and scorer params")
      c = state.cache
      rows((c.k, c.v, c.valid, state.tokens, state.features, state.lengths, state.done, state.rng), f"{strategy} out")
      rows((book.ended, book.scores, book.spans, book.n_steps, book.last), f"{strategy} book (the scores)")
      if strategy == "dvts":  # groups of W x N = 2 rows, each on one device: the survivors' take stays local
        placed = lambda x: x.sharding if isinstance(x.sharding, NamedSharding) else None  # uncommitted: left free
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed(x)), args)
        hlo = search_fn.lower(*abstract, plan=runs[0][2]).compile().as_text()
        gathered = set(re.findall(r"= \w+\[([\d,]*)\]\S* all-gather", hlo))  # the dims of each all-gather
        buffers = start.cache.k + tuple(x for x in jax.tree.leaves(start.features) if x.ndim > 2)  # [R, N, ...]
        assert not gathered & {",".join(map(str, x.shape)) for x in buffers}, f"{strategy}: KV cache all-gathered"
      print(strategy, "OK")

    # ---- the SPAE Prober on a sharded target (8 thinking trajectories: one per device)
    from reprobe_jax.spae.potential import ProbeConfig as SpaeProbeConfig
    from reprobe_jax.spae.prober import Prober
    from reprobe_jax.synthetic.tokenizer import build_tokenizer
    from reprobe_jax.tasks import make_problems
    from reprobe_jax.tasks.formats import user_prompt
    from reprobe_jax.tasks.traces import TraceNoise, solve_many
    from reprobe_jax.trajectories import prompt_text

    texts = []
    for fam in ("arithmetic", "planning", "qa"):
      ps = make_problems(fam, 10, 0, 1)
      texts += [user_prompt(p, "line") + t.text for p, t in zip(ps, solve_many(ps, "line", 0))]
    tok = build_tokenizer(texts, 500)
    scfg = ModelConfig(family="llama", vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=2,
                       num_heads=2, num_kv_heads=1, head_dim=16, tie_word_embeddings=True,
                       eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id)
    directory = os.path.join(out_dir, "spae")
    LanguageModel.random(scfg, seed=0, tokenizer=tok).save_pretrained(directory)
    plain, sharded = load_pretrained(directory), load_pretrained(directory, mesh=mesh)
    problems = make_problems("arithmetic", 8, 11, 2)
    traces = solve_many(problems, "thinking", 0, TraceNoise.clean())
    close = tok.convert_tokens_to_ids("</think>")
    responses = []
    for t in traces:
      ids = tok(t.text, add_special_tokens=False)["input_ids"]
      responses.append(ids[: ids.index(close) + 1])
    answers = [p.answer for p in problems]
    pcfg = SpaeProbeConfig(samples=2, max_tokens=4, batch_size=8)
    pots = []
    for lm in (plain, sharded):
      prober = Prober(lm, pcfg)
      pots.append(prober.potentials(lm.encode([prompt_text(lm, p, "thinking") for p in problems]), responses,
                                    answers, list(range(8))))
    for x, y in zip(*pots, strict=True):
      assert x.cuts.tolist() == y.cuts.tolist()
      np.testing.assert_allclose(x.acc, y.acc, atol=1e-5)
      np.testing.assert_allclose(x.conf, y.conf, atol=1e-5)
    prompt_ids = sharded.encode([prompt_text(sharded, p, "thinking") for p in problems])
    state = prober.teacher_forced_state(prompt_ids, responses)
    rows((state.cache.k, state.cache.v, state.tokens, state.lengths), "Prober teacher-forced state")
    cuts = prober.boundaries(responses)
    c = max(map(len, cuts))
    cut_arr = np.full((8, c), -1, np.int32)
    for r, k in enumerate(cuts):
      cut_arr[r, : len(k)] = k
    ords = np.broadcast_to(np.arange(c, dtype=np.int32), (8, c))
    acc, conf = prober.probe_state(state, cut_arr, ords, prober.answer_ids(answers), list(range(8)))
    rows((acc, conf), "Prober.probe_state (acc, conf)")
    print("prober OK")
    print("SHARDED DP OK")
""")


@pytest.mark.slow  # one subprocess on 8 host devices (a few minutes on 2 cores)
def test_probe_search_and_prober_run_data_parallel_on_8_devices(tmp_path):
  script = tmp_path / "sharded_dp.py"
  script.write_text(_SCRIPT)
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join(
    [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env.get("PYTHONPATH", "")]
  )
  for k in ("JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS"):
    env.pop(k, None)
  proc = subprocess.run(
    [sys.executable, str(script), os.path.dirname(os.path.abspath(__file__))],
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert proc.returncode == 0 and "SHARDED DP OK" in proc.stdout, (
    f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}"
  )
