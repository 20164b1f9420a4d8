"""Step-level beam search and DVTS (docs/method.md §A7): the one jitted search held to greedy step-by-step decoding
and to a host loop of the sampler's own operations (decode, score, select, take, re-key, resume) round by round;
batch independence, no recompiles, 8-device parity, lookahead, finished rows, answer lines and bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, struct

from reprobe_jax.errors import CacheFullError, ConfigError
from reprobe_jax.features import FeatureSpec, union_capture
from reprobe_jax.models import LanguageModel, ModelConfig, SamplingParams
import reprobe_jax.models.decode_state as decode_state
from reprobe_jax.probe import Probe, ProbeBundle, ProbeConfig
from reprobe_jax.scorers import StepScorer, get_scorer, inputs_from_state, score_newest, step_token_mask
from reprobe_jax.steps import StepBoundary
from reprobe_jax.tasks.response import is_answer_line
from reprobe_jax.tts import SearchConfig
from reprobe_jax.tts import search
from reprobe_jax.tts.beam import beam_search
from reprobe_jax.tts.dvts import dvts

# A word-level vocabulary in which a quarter of the words end a line and a few open an answer line, so a tiny random
# model takes steps of a few tokens and now and then answers.
WORDS = (
  ["<pad>", "<s>", "</s>"]
  + [f"w{i}" for i in range(40)]
  + [f"w{i}.\n" for i in range(16)]
  + ["<Answer>:", "<answer>", "<ANSWER>", "<Answer>", "x"]
)
PROMPTS = [[1, 5, 6, 7], [1, 8, 9], [1, 10, 11, 12, 13]]
SPEC = FeatureSpec(parts=("hidden",), hidden_layers=(0,))  # the embedding of the token before each response token


def make_tokenizer():
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


MODEL = ModelConfig(
  family="llama",
  vocab_size=len(WORDS),
  hidden_size=32,
  intermediate_size=64,
  num_layers=2,
  num_heads=2,
  num_kv_heads=1,
  head_dim=16,
  max_position_embeddings=256,
  bos_token_id=1,
  eos_token_ids=(2,),
  pad_token_id=0,
)


@pytest.fixture(scope="module")
def lm():
  return LanguageModel.random(MODEL, seed=0, tokenizer=make_tokenizer())


@struct.dataclass
class WordScorer(StepScorer):
  """A toy scorer that prefers steps whose features (SPEC: the embedding of the token before each step token) hold
  one word: 0 if the word is there, else 1, plus 0.01 per token (so shorter steps win ties)."""

  target: jax.Array  # [D] the word's embedding
  name = "word"

  def score(self, inputs, spans):
    in_step = step_token_mask(spans, inputs.token_mask)  # [B, S, T]
    hit = jnp.all(jnp.abs(inputs.get("features", self.name) - self.target) < 1e-6, axis=-1)  # [B, T]
    has = jnp.any(in_step & hit[:, None, :], axis=-1)
    return jnp.where(has, 0.0, 1.0) + 0.01 * jnp.sum(in_step, axis=-1)


def word_scorer(lm, word):
  return WordScorer(target=jnp.asarray(lm.params["embed_tokens"].get_value())[WORDS.index(word)])


# ------------------------------------------------------------------------------------------------ references


def _answer_in(lm, ids) -> bool:
  return any(is_answer_line(line) for line in lm.tokenizer.decode(list(ids)).split("\n"))


def reference_search(lm, scorer, prompts, cfg, *, groups, width, spec, seeds):
  """The search as a host loop of the sampler's public operations, one round at a time (docs/method.md §A7): returns
  (per prompt: the kept rows as (tokens, spans, scores, reason), sampled steps, generated tokens; and per round, per
  row: the candidates' scores, and the rows each group kept)."""
  capture = union_capture([spec]) if spec is not None else union_capture([], token_stats=True)
  smp = lm.sampler(cfg.sampling, capture=capture, stop=StepBoundary("line").compile(lm.tokenizer, lm.config.vocab_size))
  greedy = lm.sampler(SamplingParams(0.0), capture=capture, stop=smp.stop)
  n, per = cfg.n, groups * width * cfg.n
  state = smp.prefill(prompts, max_new_tokens=cfg.max_new_tokens, n=per, seed=cfg.seed, prompt_seeds=seeds)
  rows = state.batch
  n_prompts = rows // per
  keys = decode_state.prompt_keys(cfg.seed, list(seeds) + [0] * (n_prompts - len(seeds)))
  ended = np.asarray(state.done).copy()
  reason = np.where(ended, "length", None).astype(object)
  primary = np.ones(rows, bool)
  hist = [[] for _ in range(rows)]  # (span, score) per selected step
  last = np.full(rows, np.nan)
  sampled, generated = np.zeros(n_prompts, int), np.zeros(n_prompts, int)
  log = []
  for rnd in range(cfg.max_steps):
    if ended.all():
      break
    live = ~ended
    before = np.asarray(state.lengths)
    state = smp.decode(state)
    read = smp.read(state)
    spans = np.asarray(decode_state.newest_step_spans(state))
    why = np.full(rows, None, object)
    for r in np.flatnonzero(live):
      row = read[r]
      if row.finish_reason != "stop":
        why[r] = row.finish_reason
      elif _answer_in(lm, row.tokens[spans[r, 0] : spans[r, 1]]):
        why[r] = "answer"
      elif len(hist[r]) + 1 >= cfg.max_steps:
        why[r] = "max_steps"
      elif len(row.tokens) >= cfg.max_new_tokens:
        why[r] = "length"
    scored, score_spans, extra_steps, extra_tokens = state, spans, np.zeros(rows, int), np.zeros(rows, int)
    if cfg.lookahead:
      scored = jax.tree.map(jnp.copy, state)
      go = live & np.array([w is None for w in why])
      for _ in range(cfg.lookahead):
        scored = greedy.resume(scored, go)
        la_before = np.asarray(scored.lengths)
        scored = greedy.decode(scored)
        newest = np.asarray(decode_state.newest_step_spans(scored))
        new = go & (newest[:, 1] > newest[:, 0])
        score_spans = np.where(new[:, None], newest, score_spans)
        extra_steps += new
        extra_tokens += np.asarray(scored.lengths) - la_before
        la = greedy.read(scored)
        go = new & np.array(
          [
            la[r].finish_reason == "stop"
            and len(la[r].tokens) < cfg.max_new_tokens
            and not _answer_in(lm, la[r].tokens[newest[r, 0] : newest[r, 1]])
            for r in range(rows)
          ]
        )
    score = np.asarray(
      score_newest(scorer, inputs_from_state(scored, spec, lm.config.num_layers), jnp.asarray(score_spans))
    )
    src, kept_log = [], []
    for grp in range(rows // (width * n)):
      members = range(grp * width * n, (grp + 1) * width * n)
      rank = lambda r: (
        (0 if primary[r] else 2) if ended[r] else 1,
        0.0 if ended[r] else (np.inf if np.isnan(score[r]) else score[r]),
        r,
      )
      kept = sorted(members, key=rank)[:width]
      kept_log.append(kept)
      src += [r for r in kept for _ in range(n)]
    log.append({"score": score, "live": live, "kept": kept_log})
    for r in np.flatnonzero(live):
      hist[r] = hist[r] + [(tuple(int(v) for v in spans[r]), float(score[r]))]
      last[r] = score[r]
      if why[r] is not None:
        ended[r], reason[r] = True, why[r]
    for p in range(n_prompts):
      block = slice(p * per, (p + 1) * per)
      sampled[p] += live[block].sum() + extra_steps[block].sum()
      generated[p] += (np.asarray(state.lengths) - before)[block].sum() + extra_tokens[block].sum()
    src = np.asarray(src)
    ended, reason, last = ended[src], reason[src], last[src]
    hist = [hist[s] for s in src]
    primary = np.arange(rows) % n == 0
    state = smp.take(state, src)
    state = decode_state.rekey(state, search.round_keys(keys, rnd + 1, per))
    state = smp.resume(state, ~ended)
  read = smp.read(state)
  out = []
  for p in range(len(prompts)):
    kept = []
    for grp in range(groups):
      rows_g = [(p * groups + grp) * width * n + w * n for w in range(width)]
      rows_g.sort(key=lambda r: (bool(np.isnan(last[r])), 0.0 if np.isnan(last[r]) else last[r]))
      kept += [(read[r].tokens, [s for s, _ in hist[r]], [v for _, v in hist[r]], reason[r]) for r in rows_g]
    out.append((kept, int(sampled[p]), int(generated[p])))
  return out, log


def assert_same_as_reference(results, ref, lm):
  eos = lm.eos_mask()
  for res, (kept, sampled, generated) in zip(results, ref):
    assert (res.sampled_steps, res.generated_tokens) == (sampled, generated)
    assert len(res.candidates) == len(kept)
    for cand, (tokens, spans, scores, reason) in zip(res.candidates, kept):
      ids = tokens[:-1] if reason == "eos" and tokens and eos[tokens[-1]] else tokens
      assert list(cand.response_ids) == ids and cand.finish_reason == reason
      ref_spans = [(min(a, len(ids)), min(b, len(ids))) for a, b in spans]
      if reason == "eos" and len(spans) > 1 and ref_spans[-1] == (len(ids), len(ids)):
        ref_spans, scores = ref_spans[:-1], scores[:-1]  # the step that held only the EOS
      assert list(cand.steps) == ref_spans
      np.testing.assert_allclose(cand.step_scores, scores, atol=1e-6)


# ------------------------------------------------------------------------------------------------ tests


def test_beam_of_one_with_one_greedy_candidate_is_greedy_step_by_step_decoding(lm):
  cfg = SearchConfig(n=1, beams=1, max_steps=5, max_new_tokens=24, sampling=SamplingParams(0.0, top_k=50, top_p=0.95))
  scorer = get_scorer("perplexity")
  results = beam_search(lm, scorer, PROMPTS, cfg)
  smp = lm.sampler(
    SamplingParams(0.0),
    capture=union_capture([], token_stats=True),
    stop=StepBoundary("line").compile(lm.tokenizer, lm.config.vocab_size),
  )
  for prompt, res in zip(PROMPTS, results):
    state = smp.prefill([prompt], max_new_tokens=24)
    spans, scores = [], []
    for k in range(cfg.max_steps):
      state = smp.decode(state)
      span = decode_state.newest_step_spans(state)
      spans.append(tuple(int(v) for v in np.asarray(span)[0]))
      scores.append(float(np.asarray(score_newest(scorer, inputs_from_state(state), span))[0]))
      row = smp.read(state, [0])[0]
      if row.finish_reason != "stop" or _answer_in(lm, row.tokens[spans[-1][0] : spans[-1][1]]):
        break
      state = smp.resume(state)
    tokens = smp.read(state, [0])[0].tokens
    (cand,) = res.candidates
    ids = tokens[:-1] if row.finish_reason == "eos" else tokens
    assert list(cand.response_ids) == ids
    if row.finish_reason == "eos" and spans[-1][0] == len(ids) and len(spans) > 1:
      spans, scores = spans[:-1], scores[:-1]
    assert list(cand.steps) == [(a, min(b, len(ids))) for a, b in spans]
    np.testing.assert_allclose(cand.step_scores, scores, atol=1e-5)
    assert res.generated_tokens == len(tokens) and res.sampled_steps == k + 1
  assert len({r.candidates[0].finish_reason for r in results} | {len(r.candidates[0].steps) for r in results}) > 2


@pytest.fixture(scope="module")
def beam_runs(lm):
  """Beam search B=3, N=2 over 3 prompts (batch bucket 4) with a scorer that prefers answer lines, and its host
  reference."""
  cfg = SearchConfig(
    n=2, beams=3, max_steps=5, max_new_tokens=24, sampling=SamplingParams(1.0, top_k=0, top_p=1.0), seed=3
  )
  scorer = word_scorer(lm, "<Answer>:")
  seeds = [11, 12, 13]
  results = beam_search(lm, scorer, PROMPTS, cfg, feature_spec=SPEC, prompt_seeds=seeds)
  ref, log = reference_search(lm, scorer, PROMPTS, cfg, groups=1, width=3, spec=SPEC, seeds=seeds)
  return cfg, scorer, seeds, results, ref, log


def test_beam_search_equals_the_host_loop_and_keeps_the_preferred_steps(lm, beam_runs):
  cfg, _, _, results, ref, log = beam_runs
  assert_same_as_reference(results, ref, lm)
  # The scorer's preferred steps (an '<Answer>:' among the step's inputs, score < 1) survive far more often than
  # they are sampled: whenever a group's candidates held one, a kept row holds it.
  for rnd in log:
    for grp, kept in enumerate(rnd["kept"]):
      members = [r for r in range(grp * 6, grp * 6 + 6) if rnd["live"][r]]
      if any(rnd["score"][r] < 1 for r in members):
        assert any(rnd["score"][r] < 1 for r in kept if rnd["live"][r])
  preferred = sum(int(np.sum(rnd["score"][rnd["live"]] < 1)) for rnd in log)
  kept = sum(s < 1 for res in results for c in res.candidates for s in c.step_scores)
  assert preferred >= 3 and kept >= 3
  assert {c.finish_reason for res in results for c in res.candidates} >= {"answer"}
  for res in results:
    assert len(res.candidates) == cfg.beams
    last = [c.step_scores[-1] for c in res.candidates]
    assert last == sorted(last)  # best first


def test_finished_rows_are_carried_not_expanded_and_fill_one_slot(lm, beam_runs):
  _, _, _, results, _, log = beam_runs
  carried = 0
  for res in results:
    texts = [tuple(c.response_ids) for c in res.candidates]
    assert len(set(texts)) == len(texts), "copies of one finished row took several slots"
    for c in res.candidates:
      if c.finish_reason == "answer":  # its last step is its answer line: nothing was added after it
        a, b = c.steps[-1]
        assert _answer_in(lm, c.response_ids[a:b]) and b == len(c.response_ids)
        assert not any(_answer_in(lm, c.response_ids[x:y]) for x, y in c.steps[:-1])
    n_steps = sorted(len(c.steps) for c in res.candidates)
    carried += n_steps[0] < n_steps[-1]  # one beam finished rounds before another
  assert carried >= 1
  # a finished row stands in later rounds once (its first copy, with its slot), its copies never
  for rnd in log[1:]:
    for kept in rnd["kept"]:
      assert all(r % 2 == 0 for r in kept if not rnd["live"][r])


def test_a_prompt_gets_the_same_result_alone_as_in_a_batch(lm, beam_runs):
  cfg, scorer, seeds, results, _, _ = beam_runs
  for p in (0, 2):
    (alone,) = beam_search(lm, scorer, [PROMPTS[p]], cfg, feature_spec=SPEC, prompt_seeds=[seeds[p]])
    assert alone == results[p]
  # default seeds come from the prompt's tokens: the same in any batch, too
  default = beam_search(lm, scorer, PROMPTS, cfg, feature_spec=SPEC)
  assert beam_search(lm, scorer, PROMPTS[2:], cfg, feature_spec=SPEC)[0] == default[2] != results[2]


def test_a_second_search_in_the_same_buckets_compiles_nothing(lm, beam_runs, compile_counter):
  cfg, scorer, _, results, _, _ = beam_runs
  before = compile_counter.count
  again = beam_search(
    lm,
    word_scorer(lm, "w3"),
    [[1, 30, 31], [1, 32, 33, 34, 35], [1, 36]],
    SearchConfig(
      n=2, beams=3, max_steps=4, max_new_tokens=20, sampling=SamplingParams(0.7, top_k=0, top_p=1.0), seed=9
    ),
    feature_spec=SPEC,
    prompt_seeds=[1, 2, 3],
  )
  assert compile_counter.count == before, f"{compile_counter.count - before} compilations in a same-bucket search"
  assert len(again) == 3 and again != results


def test_dedupe_keeps_distinct_beams_where_plain_beam_search_keeps_copies(lm):
  """Where a beam's N candidates are often one text (2 tokens to choose from, T = 0.5), plain beam search keeps
  copies of one trajectory; with dedupe a copy is kept only when its group has no distinct candidate left."""
  base = dict(n=4, beams=3, max_steps=4, max_new_tokens=6, sampling=SamplingParams(0.5, top_k=2, top_p=1.0), seed=5)
  scorer = get_scorer("perplexity")
  plain = beam_search(lm, scorer, PROMPTS, SearchConfig(**base))
  deduped = beam_search(lm, scorer, PROMPTS, SearchConfig(**base, dedupe=True))
  distinct = lambda res: len({tuple(c.response_ids) for c in res.candidates})
  assert any(distinct(r) < 3 for r in plain), "no copies to remove: the test would not see dedupe work"
  assert sum(map(distinct, deduped)) > sum(map(distinct, plain))
  for r in deduped:
    assert len(r.candidates) == 3
  with pytest.raises(ConfigError, match="SearchConfig.dedupe: best_of_n samples independent trajectories"):
    SearchConfig(strategy="best_of_n", dedupe=True)


def test_dvts_keeps_each_subtrees_best_candidate_after_a_lookahead(lm):
  """DVTS B=2 subtrees, N=3 candidates, lookahead 1: equal to the host loop; every kept step is its subtree's argmin
  among its own N candidates of that round (scored on the lookahead step); candidates, not lookahead steps, are
  kept; sampled_steps counts the lookahead steps too."""
  cfg = SearchConfig(
    strategy="dvts",
    n=3,
    beams=2,
    max_steps=4,
    max_new_tokens=24,
    lookahead=1,
    sampling=SamplingParams(1.0, top_k=0, top_p=1.0),
    seed=5,
  )
  scorer = word_scorer(lm, "w7")
  seeds = [4, 5, 6]
  results = dvts(lm, scorer, PROMPTS, cfg, feature_spec=SPEC, prompt_seeds=seeds)
  ref, log = reference_search(lm, scorer, PROMPTS, cfg, groups=2, width=1, spec=SPEC, seeds=seeds)
  assert_same_as_reference(results, ref, lm)
  for p, res in enumerate(results):
    assert len(res.candidates) == 2
    for g, cand in enumerate(res.candidates):
      for k, s in enumerate(cand.step_scores[: len(log)]):
        rows = range((p * 2 + g) * 3, (p * 2 + g) * 3 + 3)
        assert s == pytest.approx(min(log[k]["score"][r] for r in rows if log[k]["live"][r]))
      assert len(cand.steps) <= len(log)
    taken = sum(len(c.steps) for c in res.candidates)  # N = 3 candidates sampled per kept step, plus lookahead
    assert res.sampled_steps > 3 * taken, "lookahead steps are not counted"
  assert any(c.finish_reason == "max_steps" for r in results for c in r.candidates)


def test_the_answer_table_finds_answer_lines_as_the_task_parser_does():
  from reprobe_jax.synthetic.tokenizer import build_tokenizer

  corpus = ["- Step 1: 12 + 5 = 17\n<Answer>: 17\n", "Think. <answer> 3\n  <ANSWER>:4", "x <Answer>: no\n"] * 20
  tok = build_tokenizer(corpus, vocab_size=300)
  table = search.answer_table(tok, len(tok))
  texts = [
    "- Step 1: 12 + 5 = 17\n<Answer>: 17\n",
    "x <Answer>: no\n",
    "  <answer> 3",
    "\n\t<ANSWER>:4",
    "<Answ",
    "- Step 2: <answer>\n",
    "a\n<answer>",
  ]
  rows, spans, want = [], [], []
  for text in texts:  # every span of every text, as one batch
    ids = tok(text, add_special_tokens=False)["input_ids"]
    for a in range(len(ids)):
      for b in range(a + 1, len(ids) + 1):
        rows.append(ids + [0] * (32 - len(ids)))
        spans.append([a, b])
        want.append(any(is_answer_line(line) for line in tok.decode(ids[a:b]).split("\n")))
  got = jax.jit(search.answer_lines)(table, jnp.asarray(rows), jnp.asarray(spans))
  assert np.asarray(got).tolist() == want
  assert 10 < sum(want) < len(want) - 10


def test_bad_input_gets_one_clear_error_before_any_work(lm, compile_counter):
  ok = SearchConfig(n=2, beams=2, max_steps=3, max_new_tokens=16)
  with pytest.raises(ConfigError, match="SearchConfig.n"):
    SearchConfig(n=0)
  with pytest.raises(ConfigError, match="SearchConfig.beams"):
    SearchConfig(beams=0)

  def probe(spec, dim):
    cfg = ProbeConfig(feature_dim=dim, d_model=8, n_layers=1, n_heads=2, ff_dim=8)
    _, params = nnx.split(Probe(cfg, rngs=nnx.Rngs(0)))
    return get_scorer("probe", bundle=ProbeBundle.create(cfg, params, spec))

  deep, narrow, word = probe(FeatureSpec(hidden_layers=(5,)), 32), probe(FeatureSpec(), 6), word_scorer(lm, "w1")
  # the step boundary's tables (a few tiny conversions), built once per model
  lm.sampler(stop=StepBoundary("line").compile(lm.tokenizer, lm.config.vocab_size))
  before = compile_counter.count
  with pytest.raises(CacheFullError, match="max_position_embeddings=256"):
    beam_search(lm, get_scorer("perplexity"), PROMPTS, SearchConfig(max_new_tokens=252))  # 5 + 252 > 256
  with pytest.raises(
    ConfigError, match=r"scorer 'probe' reads hidden features this target cannot capture.*index 5 is outside"
  ):
    beam_search(lm, deep, PROMPTS, ok)
  with pytest.raises(
    ConfigError, match=r"scorer 'probe' reads 6 features per token; this target's hidden features have 32"
  ):
    beam_search(lm, narrow, PROMPTS, ok)
  with pytest.raises(ConfigError, match="scorer 'word'.*reads ScoreInputs.features, which is None"):
    beam_search(lm, word, PROMPTS, ok)  # a scorer that reads features, given no feature spec
  with pytest.raises(ConfigError, match="StepScorer"):
    beam_search(lm, "perplexity", PROMPTS, ok)
  with pytest.raises(ConfigError, match="beam_search runs SearchConfig\\(strategy='beam'\\), got 'dvts'"):
    beam_search(lm, get_scorer("perplexity"), PROMPTS, SearchConfig(strategy="dvts"))
  with pytest.raises(ConfigError, match="dvts runs SearchConfig\\(strategy='dvts'\\), got 'beam'"):
    dvts(lm, get_scorer("perplexity"), PROMPTS, ok)
  with pytest.raises(ConfigError, match="mode must be one of"):
    beam_search(lm, get_scorer("perplexity"), PROMPTS, ok, mode="sentence")
  with pytest.raises(ConfigError, match=r"^prompt_seeds\[0\]: expected a seed, an int in \[0, 4294967295\], got -1$"):
    beam_search(lm, get_scorer("perplexity"), PROMPTS, ok, prompt_seeds=[-1, 0, 0])
  assert compile_counter.count == before, "a bad input was found only after work had started"


# ------------------------------------------------------------------------------------------------ 8-device parity

_SHARDED = textwrap.dedent("""
    import sys, tempfile
    import jax
    import numpy as np
    from flax import nnx
    sys.path.insert(0, sys.argv[1])
    from test_tts_search import MODEL, PROMPTS, make_tokenizer
    from reprobe_jax.features import FeatureSpec, forward_values
    from reprobe_jax.models import LanguageModel, load_pretrained, make_mesh
    from reprobe_jax.probe import Probe, ProbeBundle, ProbeConfig
    from reprobe_jax.scorers import ScoreInputs, get_scorer, score
    from reprobe_jax.tts import SearchConfig
    from reprobe_jax.tts.beam import beam_search

    assert jax.device_count() == 8, jax.devices()
    directory = tempfile.mkdtemp()
    LanguageModel.random(MODEL, seed=0, tokenizer=make_tokenizer()).save_pretrained(directory)
    plain = load_pretrained(directory)
    sharded = load_pretrained(directory, mesh=make_mesh(data=8, fsdp=1, tensor=1))
    spec = FeatureSpec(parts=("hidden", "attn", "logit"), hidden_layers=(-1,), attn_window=3, top_k=4)
    pc = ProbeConfig(feature_dim=spec.dim(plain.config), d_model=16, n_layers=1, n_heads=2, ff_dim=16)
    probe = get_scorer("probe", bundle=ProbeBundle.create(pc, nnx.split(Probe(pc, rngs=nnx.Rngs(0)))[1], spec))
    cfg = SearchConfig(n=2, beams=2, max_steps=4, max_new_tokens=24, seed=1)
    prompts = PROMPTS + [[1, 40, 41]]  # 4 prompts x 4 rows: 2 per device
    a = beam_search(plain, probe, prompts, cfg)
    b = beam_search(sharded, probe, prompts, cfg)
    for x, y in zip(a, b):
      assert [c.response_ids for c in x.candidates] == [c.response_ids for c in y.candidates]
      assert [c.steps for c in x.candidates] == [c.steps for c in y.candidates]
      assert (x.sampled_steps, x.generated_tokens) == (y.sampled_steps, y.generated_tokens)
      for c, d in zip(x.candidates, y.candidates):
        np.testing.assert_allclose(c.step_scores, d.step_scores, atol=1e-5)
    # the probe's scores inside the loop are those of a fresh forward of the kept response (a last step that ended
    # on EOS was scored with it)
    for prompt, res in zip(prompts, a):
      c = res.candidates[0]
      ids = list(c.response_ids) + ([2] if c.finish_reason == "eos" else [])
      spans = [list(s) for s in c.steps]
      if c.finish_reason == "eos":
        spans[-1][1] = len(ids)
      out = plain.forward(np.asarray(prompt + ids)[None], capture=spec.capture())
      feats = spec.assemble(forward_values(vars(out)), plain.config.num_layers)
      feats = np.asarray(feats)[:, len(prompt) - 1:len(prompt) - 1 + len(ids)]
      fresh = score(probe, ScoreInputs(token_mask=np.ones(feats.shape[:2], bool), features=feats),
                    np.asarray([spans], np.int32))
      np.testing.assert_allclose(np.asarray(fresh)[0], c.step_scores, atol=1e-5)
    print("SHARDED SEARCH OK")
""")


@pytest.mark.slow  # a subprocess on 8 host devices (about 35 s)
def test_sharded_search_on_8_devices_makes_the_same_selections(tmp_path):
  """Probe-guided beam search with the prompts over the data axis of 8 CPU devices selects what one device selects,
  and the probe's in-loop step scores equal the probe on a fresh forward of each kept response."""
  script = tmp_path / "sharded_search.py"
  script.write_text(_SHARDED)
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
  for k in ("JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS"):
    env.pop(k, None)
  proc = subprocess.run(
    [sys.executable, str(script), os.path.dirname(__file__)], env=env, capture_output=True, text=True, timeout=300
  )
  assert proc.returncode == 0 and "SHARDED SEARCH OK" in proc.stdout, (
    f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}"
  )
