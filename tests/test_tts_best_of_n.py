"""Best-of-N (docs/method.md §A7): its step scores equal the one-trajectory-at-a-time path on a fresh forward, a batch
gives each prompt its result alone, N rows read one prefill, a second call in the same buckets compiles nothing, a
call fetches once (its steps aligned and cut on device, as the host would align and cut them), and bad input fails
before any decoding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_boundary import tokenise_in_pieces
from test_steps import TOKENIZERS, get_tokenizer

from reprobe_jax import steps as step_lib
from reprobe_jax.errors import CacheFullError, ConfigError
from reprobe_jax.features import FeatureMismatchError, FeatureSpec, token_features, union_capture
from reprobe_jax.models import CaptureSpec, SamplingParams, load_pretrained
from reprobe_jax.models.decode_state import FINISH_EOS, FINISH_LENGTH
from reprobe_jax.models.sampler import Sampler
from reprobe_jax.models.sampling import bucket
from reprobe_jax.probe import Probe, ProbeBundle, ProbeConfig
from reprobe_jax.scorers import get_scorer, score_rows
from reprobe_jax.tasks import Problem, make_problems
from reprobe_jax.tts import SearchConfig
from reprobe_jax.synthetic.tokenizer import build_tokenizer
from reprobe_jax.tts.best_of_n import best_of_n, decode_trajectories, trajectory_steps
from reprobe_jax.tts.best_of_n_rows import FINISH_REASONS, RowRules, candidate_rows
from reprobe_jax.trajectories import Trajectory, prompt_text
from reprobe_jax.tts.select import select

PROMPTS = [[1, 10, 11, 12, 13], [1, 20, 21], [1, 30, 31, 32, 33, 34, 35]]
CFG = SearchConfig("best_of_n", n=4, max_steps=3, max_new_tokens=40, sampling=SamplingParams(1.5, top_k=0, top_p=0.95))


@pytest.fixture(scope="module")
def lm(tiny_llama_dir):
  return load_pretrained(tiny_llama_dir)


@pytest.fixture(scope="module")
def probe(lm):
  return _probe(lm)


def _probe(lm, spec=FeatureSpec(), dim=None, fingerprint=None):
  cfg = ProbeConfig(feature_dim=dim or spec.dim(lm.config), d_model=16, n_layers=2, n_heads=2, ff_dim=32)
  _, params = nnx.split(Probe(cfg, rngs=nnx.Rngs(0)))
  return get_scorer("probe", bundle=ProbeBundle.create(cfg, params, spec, fingerprint))


@pytest.mark.slow  # over 25 s on 2 cores (the default suite must stay under 15 minutes); .ci/run runs it
def test_step_scores_equal_each_trajectory_scored_alone_on_a_fresh_forward(lm, probe):
  """On-device scores of the captured values = score_rows (one trajectory per call) on a teacher-forced forward of
  the same ids; the spans are steps.align's, cut after max_steps."""
  ppl = get_scorer("perplexity")
  by_probe = best_of_n(lm, probe, PROMPTS, CFG, prompt_seeds=[5, 6, 7])
  # the probe's capture for both: the same compiled decode, the same draws
  by_ppl = best_of_n(lm, ppl, PROMPTS, CFG, prompt_seeds=[5, 6, 7], feature_spec=probe.bundle.features)
  cands = [
    (prompt, c, q) for prompt, rp, rq in zip(PROMPTS, by_probe, by_ppl) for c, q in zip(rp.candidates, rq.candidates)
  ]
  records = [
    Trajectory(f"t{i}", "", "", "line", (), prompt_ids=tuple(p), response_ids=tuple(c.response_ids))
    for i, (p, c, _) in enumerate(cands)
  ]
  # One teacher-forced forward of each prompt + response: [n, 64 + 3] = the probe's last hidden state, then 'logit'
  # with top_k 1: [top-1 prob, log p(token), entropy]
  both = token_features(lm, records, FeatureSpec(("hidden", "logit"), top_k=1), batch_size=16)
  feats, logps = [f[:, :64] for f in both], [f[:, 65] for f in both]
  spans = [np.asarray(c.steps, np.int32) for _, c, _ in cands]
  alone_probe = score_rows(probe, [{"features": f} for f in feats], spans, batch_size=1)  # one row per call
  alone_ppl = score_rows(ppl, [{"logprobs": x} for x in logps], spans, batch_size=1)
  seen = {"max_steps": 0, "length": 0}
  for (prompt, c, q), sp, a, b in zip(cands, spans, alone_probe, alone_ppl):
    assert c.response_ids == q.response_ids and c.steps == q.steps  # the same draws whatever the scorer
    full = [(s.start, s.end) for s in step_lib.align(lm.tokenizer, list(c.response_ids), "line")]
    assert list(c.steps) == full[: CFG.max_steps] and 1 <= len(c.steps) <= CFG.max_steps
    if c.finish_reason == "max_steps":
      assert c.response_ids and c.steps[-1][1] == len(c.response_ids)
    seen[c.finish_reason] = seen.get(c.finish_reason, 0) + 1
    np.testing.assert_allclose(c.step_scores, a, atol=1e-4)
    np.testing.assert_allclose(q.step_scores, b, atol=1e-4)
  for rp in by_probe:
    assert len(rp.candidates) == CFG.n and len({c.response_ids for c in rp.candidates}) == CFG.n
    assert rp.sampled_steps == sum(len(c.steps) for c in rp.candidates)
    assert rp.generated_tokens == sum(len(c.response_ids) + (c.finish_reason == "eos") for c in rp.candidates)
  assert seen["max_steps"] and seen["length"], f"the example should hit both the step cap and the budget: {seen}"


def test_a_batch_gives_each_prompt_the_result_it_gets_alone(lm):
  # the random baseline keys its draws by the row's index in the scorer: per prompt, so batch-invariant too
  scorer, spec = get_scorer("random", seed=1), FeatureSpec()  # the probe's capture: the programs compiled above
  together = best_of_n(lm, scorer, PROMPTS, CFG, prompt_seeds=[11, 22, 33], feature_spec=spec)
  alone = best_of_n(lm, scorer, PROMPTS, CFG, prompt_seeds=[11, 22, 33], feature_spec=spec, batch_size=1)
  for a, res in zip(alone, together):
    assert [c.response_ids for c in a.candidates] == [c.response_ids for c in res.candidates]
    assert [c.finish_reason for c in a.candidates] == [c.finish_reason for c in res.candidates]
    assert (a.sampled_steps, a.generated_tokens) == (res.sampled_steps, res.generated_tokens)
    for x, y in zip(a.candidates, res.candidates):
      np.testing.assert_allclose(x.step_scores, y.step_scores, atol=1e-5)
  # default seeds come from the prompt itself: batch order does not matter either
  fwd = best_of_n(lm, scorer, PROMPTS, CFG, feature_spec=spec)
  back = best_of_n(lm, scorer, PROMPTS[::-1], CFG, feature_spec=spec)[::-1]
  assert [[c.response_ids for c in r.candidates] for r in fwd] == [[c.response_ids for c in r.candidates] for r in back]
  assert fwd[0].candidates != together[0].candidates  # and they are not the seeds given above


def test_n_rows_read_one_prefill_of_their_prompt(lm):
  sampler = lm.sampler(CFG.sampling, capture=union_capture([FeatureSpec()]))  # the capture best_of_n uses above
  state = decode_trajectories(sampler, PROMPTS, CFG, [1, 2, 3])
  prefix = state.cache.prefix
  assert prefix is not None and prefix.batch == bucket(len(PROMPTS), minimum=1)  # one prefilled row per prompt
  assert state.batch == prefix.batch * CFG.n
  assert state.cache.size == bucket(CFG.max_new_tokens)  # the rows' own slots hold only their responses


def test_greedy_is_temperature_zero_with_one_trajectory(lm):
  problems = make_problems("arithmetic", 3, 0, 1)  # prompted as trajectories.prompt_text; answers checked below
  greedy = SearchConfig(
    "best_of_n", n=1, sampling=SamplingParams(0.0, top_k=50, top_p=0.95), max_steps=40, max_new_tokens=20
  )
  res = best_of_n(lm, get_scorer("maxprob"), problems, greedy)
  ref = lm.generate(
    [prompt_text(lm, p, "line") for p in problems],
    SamplingParams(0.0),
    max_new_tokens=20,
    capture=CaptureSpec(token_stats=True),
  )
  for row, (p, r) in enumerate(zip(problems, res)):
    ids = ref.token_ids(row)
    assert list(r.candidates[0].response_ids) == ids[: len(ids) - (ref.finish_reason[row] == "eos")]
    out = select(p, r, lm.tokenizer, mode="line", aggregation="min", probabilities=False)
    assert out.n == 1 and out.first == out.best and not out.pass_at_n.correct  # a random model writes no answer


def test_a_second_search_in_the_same_buckets_compiles_nothing(lm, probe, compile_counter):
  rng = np.random.default_rng(0)
  best_of_n(lm, probe, [rng.integers(3, 90, t).tolist() for t in (9, 5, 2)], CFG)
  before = compile_counter.count
  # new prompts of the same buckets, new seeds, temperature, top_p, budget and aggregation (top_k and whether
  # top-p is on are static)
  other = SearchConfig(
    "best_of_n",
    n=4,
    max_steps=3,
    max_new_tokens=36,
    sampling=SamplingParams(0.8, top_k=0, top_p=0.9),
    seed=3,
    aggregation="mean",
  )
  res = best_of_n(lm, probe, [rng.integers(3, 90, t).tolist() for t in (13, 3, 16)], other)
  assert compile_counter.count == before, f"{compile_counter.count - before} compilations on a same-bucket search"
  assert max(len(c.response_ids) for r in res for c in r.candidates) <= 36


def test_candidates_end_at_the_answer_line_and_after_max_steps():
  tok = build_tokenizer(["- Step 1: 3 + 4 = 7\n<Answer>: 7\n", "Step 2: 7 * 2 = 14.\n\n"] * 10, 300)
  ids = tok("- Step 1: 3 + 4 = 7\n<Answer>: 7\n- Step 2: 7 * 2 = 14\n")["input_ids"]
  got, spans, reason = trajectory_steps(tok, ids, "length", mode="line", max_steps=12)
  assert reason == "answer" and tok.decode(got) == "- Step 1: 3 + 4 = 7\n<Answer>: 7\n" and len(spans) == 2
  got, spans, reason = trajectory_steps(tok, ids, "length", mode="line", max_steps=1)
  assert reason == "max_steps" and tok.decode(got) == "- Step 1: 3 + 4 = 7\n" and spans == [(0, len(got))]
  end = tok("- Step 1: 3 + 4 = 7\n<Answer>: 7")["input_ids"]  # nothing after the answer: the row's own reason
  assert trajectory_steps(tok, end, "eos", mode="line", max_steps=12) == (
    end,
    [(0, spans[0][1]), (spans[0][1], len(end))],
    "eos",
  )
  think = tok("Step 2: 7 * 2 = 14.\n\n<Answer>: 7\nStep 2: 7 * 2 = 14.\n\n")["input_ids"]  # no answer lines here
  assert trajectory_steps(tok, think, "length", mode="thinking", max_steps=12)[2] == "length"


def test_bad_input_fails_before_any_decoding(lm, monkeypatch):
  monkeypatch.setattr(Sampler, "prefill", lambda *a, **k: pytest.fail("decoding started on bad input"))
  ppl = get_scorer("perplexity")
  with pytest.raises(ConfigError, match=r"SearchConfig.n: expected an int in \[1, 4096\], got 0"):
    SearchConfig("best_of_n", n=0)
  with pytest.raises(ConfigError, match="strategy 'best_of_n', got 'beam'"):
    best_of_n(lm, ppl, PROMPTS, SearchConfig("beam", n=2))
  with pytest.raises(CacheFullError, match="max_new_tokens=600.*context of 512"):
    best_of_n(lm, ppl, PROMPTS, SearchConfig("best_of_n", max_new_tokens=600))
  with pytest.raises(ConfigError, match="hidden features this target cannot capture.*index 7"):
    best_of_n(lm, _probe(lm, FeatureSpec(hidden_layers=(7,)), dim=64), PROMPTS, CFG)
  with pytest.raises(ConfigError, match="reads 32 features per token; this target's hidden features have 64"):
    best_of_n(lm, _probe(lm, dim=32), PROMPTS, CFG)
  with pytest.raises(FeatureMismatchError, match="trained on target model 'other'"):
    best_of_n(lm, _probe(lm, fingerprint="other"), PROMPTS, CFG)
  with pytest.raises(ConfigError, match="aggregation='product'.*'perplexity' is unbounded"):
    best_of_n(lm, ppl, PROMPTS, SearchConfig("best_of_n", aggregation="product"))
  with pytest.raises(ConfigError, match=r"problems\[1\]: problem 'c1': no answer checker for domain 'chess'"):
    best_of_n(lm, ppl, [make_problems("qa", 1, 0, 1)[0], Problem("c1", "chess", "Mate in 2?", "Qh7")], CFG)
  with pytest.raises(ConfigError, match=r"prompt_seeds: need one seed per prompt \(3\), got 2"):
    best_of_n(lm, ppl, PROMPTS, CFG, prompt_seeds=[1, 2])
  with pytest.raises(ConfigError, match="scorer must be a StepScorer"):
    best_of_n(lm, "probe", PROMPTS, CFG)


def test_a_call_fetches_once_however_many_chunks(lm, probe, monkeypatch):
  """Three chunks of one prompt each: one explicit fetch in the whole call (every chunk's tokens, lengths, finish
  reasons, spans and scores: the steps are aligned and cut on device) and no implicit one; the same results as one
  chunk. Also with a scorer that is not packed (perplexity) in thinking mode."""
  together = best_of_n(lm, probe, PROMPTS, CFG, prompt_seeds=[4, 5, 6])
  ppl = get_scorer("perplexity")
  thinking = best_of_n(lm, ppl, PROMPTS, CFG, mode="thinking", prompt_seeds=[4, 5, 6], feature_spec=FeatureSpec())
  fetches = []
  real = jax.device_get
  monkeypatch.setattr(jax, "device_get", lambda tree: fetches.append(1) or real(tree))
  with jax.transfer_guard_device_to_host("disallow"):  # an implicit fetch (np.asarray of a device array) raises
    chunked = best_of_n(lm, probe, PROMPTS, CFG, prompt_seeds=[4, 5, 6], batch_size=1)
    assert len(fetches) == 1
    again = best_of_n(lm, ppl, PROMPTS, CFG, mode="thinking", prompt_seeds=[4, 5, 6], feature_spec=FeatureSpec())
    assert len(fetches) == 2
  for a, b in zip(together + thinking, chunked + again, strict=True):
    assert [c.response_ids for c in a.candidates] == [c.response_ids for c in b.candidates]
    assert [(c.steps, c.finish_reason) for c in a.candidates] == [(c.steps, c.finish_reason) for c in b.candidates]
    for x, y in zip(a.candidates, b.candidates):
      np.testing.assert_allclose(x.step_scores, y.step_scores, atol=1e-5)


# Texts whose steps end on every kind of token, with answer lines (at a line start after blanks, in any case, and
# not at a line start), headers, blank lines and think tags; tokenised in random pieces, so that tokens straddle.
PIECES = [
  "- Step 1: 30 * 2 = 60\n",
  "<Answer>: 72\n",
  "<Answer>: 72",
  "  <answer> 5\n",
  "x <Answer>: no\n",
  "\n",
  "\n\n",
  "Reasoning Steps:\n",
  "<think>\nFirst, 30 * 2 = 60.\n\n",
  "Next, 60 + 14 = 74.\n\n",
  "So the answer is 74.\n\nThen",
  "</think>\n\n**Final Answer**\n\\boxed{74}",
]


@pytest.mark.parametrize("name", TOKENIZERS)
def test_candidates_cut_on_device_are_the_host_ones(name):
  """`best_of_n_rows.candidate_rows` (the steps aligned, the answer line and the max_steps-th step cut, on device, for
  every row at once) gives what `trajectory_steps` gives from `steps.align` on the host, row by row: the same
  response ids, spans and finish reasons, in line and thinking mode, for rows that end at EOS or at their budget;
  on byte-level BPE, SentencePiece-style ('\\n<Answer>:', '▁72\\n-': tokens that straddle lines) and SmolLM2's."""
  tok = get_tokenizer(name)
  vocab, eos, width = len(tok), 0, 96
  eos_mask = np.zeros(vocab, bool)
  eos_mask[eos] = True
  rng = np.random.default_rng(len(name))
  rows, finish = [], []
  for r in range(48):
    text = "".join(rng.choice(PIECES, int(rng.integers(1, 9))))
    ids = tokenise_in_pieces(tok, text, list(rng.integers(0, 150, 3)))[: width - 1]
    ids = [i for i in ids if i != eos]
    ends = r % 2 == 0
    rows.append(ids + [eos] * ends)
    finish.append(FINISH_EOS if ends else FINISH_LENGTH)
  tokens = np.zeros((len(rows) + 2, width), np.int32)  # two rows of batch padding
  for i, ids in enumerate(rows):
    tokens[i, : len(ids)] = ids
  lengths = np.asarray([len(ids) for ids in rows] + [5, 0], np.int32)
  seen = set()
  for mode in ("line", "thinking"):
    prefix = step_lib.ANSWER_PREFIX[mode]
    for max_steps in (1, 3, 12):
      rules = RowRules(
        align=step_lib.align_table(step_lib.StepBoundary(step_lib.STEP_MODE[mode]), tok, vocab),
        answer=None if prefix is None else step_lib.answer_table(tok, vocab, prefix),
        eos_mask=jnp.asarray(eos_mask),
        max_steps=jnp.int32(max_steps),
        rows=jnp.int32(len(rows)),
      )
      out = candidate_rows(
        rules, jnp.asarray(tokens), jnp.asarray(lengths), jnp.asarray(finish + [0, 0]), steps=bucket(max_steps, 4)
      )
      got = jax.device_get(out)
      assert got.steps[len(rows) :].tolist() == [0, 0] and not got.spans[len(rows) :].any()  # padding: no steps
      for r, ids in enumerate(rows):
        reason = "eos" if finish[r] == FINISH_EOS else "length"
        want = trajectory_steps(tok, ids[: len(ids) - (reason == "eos")], reason, mode=mode, max_steps=max_steps)
        k = int(got.steps[r])
        have = (
          got.tokens[r, : got.lengths[r]].tolist(),
          [tuple(x) for x in got.spans[r, :k].tolist()],
          FINISH_REASONS[int(got.finish[r])],
        )
        assert have == want, (mode, max_steps, tok.convert_ids_to_tokens(ids))
        seen.add((mode, want[2]))
  assert {("line", "answer"), ("line", "max_steps"), ("thinking", "max_steps")} <= seen, seen
  assert {("line", "eos"), ("thinking", "eos"), ("thinking", "length")} <= seen, seen
