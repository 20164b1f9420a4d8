"""The open task interface as the jobs use it (reprobe_jax.tasks.base.Task): the math task's prompts, response
reading, voting keys, worked examples and solution steps; a thinking chat template (its generation prompt ends with
'<think>') through the prompt, the response parser and the token-level aligner; the data splits and the RL prompt
order of tasks.data; and the consumers (rule annotator, LLM judge reference, answer votes, RL's default reward,
SPAE's trajectory metrics) on math problems, through their public functions."""

from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest

from reprobe_jax import steps as step_lib
from reprobe_jax.annotate import JudgeSettings, annotate, reference_solution
from reprobe_jax.errors import ConfigError
from reprobe_jax.models import SamplingParams
from reprobe_jax.rl.rollout import PromptSet, answer_reward, rollout_fn
from reprobe_jax.spae.metrics import outcome_from
from reprobe_jax.spae.potential import StepPotentials
from reprobe_jax.synthetic.tokenizer import build_tokenizer
from reprobe_jax.tasks import MathTask, Problem, get_task, make_problems
from reprobe_jax.tasks.data import NO_ANSWER, SPLITS, DataConfig, PromptOrder, load_data
from reprobe_jax.tasks.formats import check_response, classify_paragraph, thinking_progress, user_prompt
from reprobe_jax.tasks.math_task import EXAMPLES, solution_steps
from reprobe_jax.tasks.response import render_line, render_thinking
from reprobe_jax.trajectories import prompt_text
from reprobe_jax.trajectories.prompts import check_thinking_template, opens_thinking
from reprobe_jax.tts import select
from reprobe_jax.tts.best_of_n import trajectory_steps
from reprobe_jax.tts.result import Candidate, PromptResult
from test_steps import tokenizer_named

MATH = get_task("math")
RATIONALE = "4 * 12 = <<4*12=48>>48 rolls.\n48 - 30 = <<48-30=18>>18 rolls are left.\n#### 18"
PROBLEM = Problem(
  "gsm8k-1",
  "math",
  "A baker makes 4 trays of 12 rolls and sells 30. How many rolls are left?",
  "18",
  {"solution": RATIONALE[: RATIONALE.index("\n####")], "source": "gsm8k"},
)
# A thinking model's response under a template that opened the thinking: no '<think>' of its own.
THOUGHT = "Step 1: 4 * 12 = 48.\n\nSo 48 - 30 = 18.\n\n</think>\n\n**Final Answer**\n\\boxed{18}"
THOUGHT_PARAGRAPHS = ["Step 1: 4 * 12 = 48.", "So 48 - 30 = 18."]
LINE = "- Step 1: 4 * 12 = 48\n- Step 2: 48 - 30 = 18\n<Answer>: {}"
# A chat template like DeepSeek-R1-Distill's: the generation prompt opens the thinking.
THINK_TEMPLATE = (
  "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
  "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
  """A byte-level BPE of the synthetic worlds' kind (think tags as tokens) with the thinking template."""
  corpus = [THOUGHT, LINE.format("18"), PROBLEM.question] + [q for q, _, _ in EXAMPLES]
  t = build_tokenizer(corpus * 3, 400)
  t.chat_template = THINK_TEMPLATE
  return t


# ------------------------------------------------------------------------------------------------ the math task


def test_math_prompts_in_both_modes():
  line, thinking = MATH.user_prompt(PROBLEM, "line"), MATH.user_prompt(PROBLEM, "thinking")
  assert line.startswith(PROBLEM.question + "\n\n") and "'- Step k:'" in line and "'<Answer>: '" in line
  assert thinking.startswith(PROBLEM.question + "\n\n") and "<think>" in thinking and "\\boxed{}" in thinking
  assert user_prompt(PROBLEM, "line") == line and user_prompt(PROBLEM, "thinking") == thinking
  with pytest.raises(ConfigError, match="answer mode must be one of"):
    user_prompt(PROBLEM, "prose")


@pytest.mark.parametrize(
  "text, mode, steps, answer",
  [
    (LINE.format("18"), "line", ["4 * 12 = 48", "48 - 30 = 18"], "18"),
    (LINE.format("\\frac{1}{2}"), "line", ["4 * 12 = 48", "48 - 30 = 18"], "\\frac{1}{2}"),
    # no '<Answer>:' line: the sentence is a step, and the answer is found in the text
    ("- Step 1: 4 * 12 = 48\n- Step 2: 48 - 30 = 18\nThe answer is 18.", "line", None, "18"),
    ("<think>\n" + THOUGHT, "thinking", THOUGHT_PARAGRAPHS, "18"),
    (THOUGHT, "thinking", THOUGHT_PARAGRAPHS, "18"),  # the template opened the thinking
    ("Step 1: 4 * 12 = 48.\n\nSo 48 - 30 = 18.\n\n</think>\n\nThe answer is 18.", "thinking", THOUGHT_PARAGRAPHS, "18"),
    ("Step 1: 4 * 12 = 48.\n\n</think>\nSo we get $\\boxed{18}$ rolls.", "thinking", THOUGHT_PARAGRAPHS[:1], "18"),
    # never closed: the thinking's numbers are no answer
    ("<think>\nStep 1: 4 * 12 = 48.\n\nSo 48 - 30 = 18", "thinking", ["Step 1: 4 * 12 = 48.", "So 48 - 30 = 18"], None),
  ],
)
def test_math_parse_response(text, mode, steps, answer):
  got_steps, got = MATH.parse_response(text, mode)
  if steps is None:
    steps = ["4 * 12 = 48", "48 - 30 = 18", "The answer is 18."]
  assert (got_steps, got) == (steps, answer)
  checked = check_response(PROBLEM, text, mode)
  assert checked.correct is (answer == "18") and all(math.isnan(x) for x in checked.labels)
  assert checked.first_error is None


SAME_KEY = [
  ("1,000", "1000"),
  ("50%", "50"),
  ("\\frac{1}{2}", "0.5"),
  ("\\dfrac{1}{2}", "1/2"),
  ("18.00", "18"),
  ("$18", "18"),
  ("x = 3", "3"),
  ("(1, 2)", "(1,2.0)"),
  ("\\text{Monday}", "monday"),
]
OTHER_KEY = [("18", "17"), ("(1, 2)", "(2, 1)"), ("0.5", "5"), ("1000", "100"), ("\\sqrt{4}", "2")]


@pytest.mark.parametrize("a, b", SAME_KEY)
def test_equal_answers_share_a_voting_key(a, b):
  assert MATH.normalize_answer(a) is not None and MATH.normalize_answer(a) == MATH.normalize_answer(b)


@pytest.mark.parametrize("a, b", OTHER_KEY)
def test_other_answers_have_other_keys(a, b):
  # '\\sqrt{4}' and '2' are equivalent answers (is_equivalent) but two keys: the key is coarser by design
  assert MATH.normalize_answer(a) != MATH.normalize_answer(b)


def test_no_answer_has_no_key():
  assert MATH.normalize_answer("") is None and MATH.normalize_answer("  ") is None


@pytest.mark.parametrize("mode", ["line", "thinking"])
def test_math_worked_examples_read_back(mode):
  shots = MATH.worked_examples(mode, len(EXAMPLES))
  assert len(shots) == len(EXAMPLES)
  for (user, response), (question, steps, answer) in zip(shots, EXAMPLES):
    assert user == MATH.user_prompt(Problem("x", "math", question, answer), mode)
    want = list(steps) if mode == "line" else [s if s.endswith(".") else s + "." for s in steps]
    assert MATH.parse_response(response, mode) == (want, answer)
    assert response == (render_line(steps, answer) if mode == "line" else render_thinking(steps, answer))
  assert MATH.worked_examples(mode, 0) == []
  with pytest.raises(ConfigError, match=f"math task has {len(EXAMPLES)} worked examples; asked for 9"):
    MATH.worked_examples(mode, 9)


def test_solution_steps_of_a_gsm8k_rationale_and_a_math_solution():
  want = ["4 * 12 = 48 rolls.", "48 - 30 = 18 rolls are left."]  # calculator marks and '#### 18' dropped
  assert solution_steps(RATIONALE) == want == solution_steps(RATIONALE, "line")
  assert MATH.reference_steps(PROBLEM) == want
  assert MATH.reference_steps(Problem("p", "math", "q", "18", {})) == []
  prose = "We have $x^2 = 4$, so $x = 2$ or $x = -2$. Their sum is $0$. A decimal like 3.14 stays whole."
  assert solution_steps(prose) == solution_steps(prose, "sentence")
  assert solution_steps(prose) == [
    "We have $x^2 = 4$, so $x = 2$ or $x = -2$.",
    "Their sum is $0$.",
    "A decimal like 3.14 stays whole.",
  ]
  two = "First, $x^2 = 4$.\nSo $x = \\pm 2$.\n\nTheir sum is $\\boxed{0}$."
  assert solution_steps(two, "paragraph") == ["First, $x^2 = 4$. So $x = \\pm 2$.", "Their sum is $\\boxed{0}$."]
  assert solution_steps(two, "sentence") == ["First, $x^2 = 4$.", "So $x = \\pm 2$.", "Their sum is $\\boxed{0}$."]
  with pytest.raises(ConfigError, match="auto, line, paragraph or sentence, found 'word'"):
    solution_steps(two, "word")


# ------------------------------------------------------------------------------------------------ thinking template


def test_a_thinking_template_opens_the_prompt(tok):
  lm = types.SimpleNamespace(tokenizer=tok)
  prompt = prompt_text(lm, PROBLEM, "thinking", few_shot=1)
  assert prompt.endswith("<|im_start|>assistant\n<think>\n") and opens_thinking(prompt)
  assert prompt.count(EXAMPLES[0][0]) == 1 and PROBLEM.question in prompt  # the worked example, an earlier turn
  check_thinking_template(prompt, "thinking", opens=True)  # accepted


def test_check_thinking_template_refuses_a_closed_or_missing_think():
  closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
  with pytest.raises(ConfigError, match="closes the thinking in the generation prompt"):
    check_thinking_template(closed, "thinking", where="config.target")
  plain = "<|im_start|>assistant\n"
  with pytest.raises(ConfigError, match="^config.target: .*does not end with '<think>'"):
    check_thinking_template(plain, "thinking", opens=True, where="config.target")
  check_thinking_template(plain, "thinking")  # a template that leaves the opening tag to the model
  check_thinking_template(closed, "line", opens=True)  # line mode reads no thinking


@pytest.mark.parametrize("name", ["bpe", "sentencepiece"])
def test_a_response_without_think_splits_into_its_paragraphs(tok, name):
  """The parser's paragraphs and the aligner's spans agree, and each span ends at the token that completes its
  '.\\n\\n' boundary (a token that straddles the boundary belongs to the step where it ends: docs/method.md §A1)."""
  tokenizer = tok if name == "bpe" else tokenizer_named(name)
  steps, answer = MATH.parse_response(THOUGHT, "thinking")
  assert (steps, answer) == (THOUGHT_PARAGRAPHS, "18")
  ids = tokenizer(THOUGHT, add_special_tokens=False)["input_ids"]
  spans = step_lib.align(tokenizer, ids, "paragraph")
  text, ends = step_lib.token_end_offsets(tokenizer, ids)
  assert text == THOUGHT
  assert [s.text for s in spans] == steps
  assert [THOUGHT[s.char_start : s.char_end].strip() for s in spans] == steps
  assert spans[0].start == 0 and all(a.end == b.start for a, b in zip(spans, spans[1:]))
  for s in spans:
    assert THOUGHT[: s.char_end].endswith(".\n\n")
    assert ends[s.end - 1] >= s.char_end and (s.end == 1 or ends[s.end - 2] < s.char_end)


# ------------------------------------------------------------------------------------------------ tasks.data


def _write(path, records) -> str:
  path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
  return str(path)


def _gsm8k(tmp_path, n=10) -> str:
  return _write(
    tmp_path / "gsm8k.jsonl",
    [
      {"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = <<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i}"}
      for i in range(n)
    ],
  )


def _check_splits(splits, n: int) -> None:
  ids = splits.ids()
  flat = [i for s in SPLITS for i in ids[s]]
  assert len(flat) == len(set(flat)) == n  # disjoint by problem, none lost
  for s in SPLITS:
    assert {x.problem_id for x in splits.solutions[s]} <= set(ids[s])  # solutions follow their problem


def test_load_data_splits_a_gsm8k_file(tmp_path):
  cfg = DataConfig(path=_gsm8k(tmp_path), format="gsm8k", seed=3, val=0.2, test=0.3)
  splits = load_data(cfg)
  _check_splits(splits, 10)
  assert [len(splits.problems[s]) for s in ("train", "val", "test")] == [5, 2, 3]
  assert load_data(cfg).ids() == splits.ids()  # deterministic across calls
  assert load_data(DataConfig(path=cfg.path, format="gsm8k", seed=4, val=0.2, test=0.3)).ids() != splits.ids()
  p = splits.problems["train"][0]
  n = int(p.question.split()[2])
  assert (p.domain, p.answer, p.data["solution"]) == ("math", str(2 * n), f"{n} + {n} = <<{n}+{n}={2 * n}>>{2 * n}")
  assert MATH.reference_steps(p) == [f"{n} + {n} = {2 * n}"]
  limited = load_data(DataConfig(path=cfg.path, format="gsm8k", seed=3, limit=5, val=0.2, test=0.2))
  _check_splits(limited, 5)
  assert [len(limited.problems[s]) for s in ("train", "val", "test")] == [3, 1, 1]


def test_load_data_reads_jsonl_with_its_ids(tmp_path):
  path = _write(tmp_path / "mine.jsonl", [{"id": f"q{i}", "question": f"Q{i}?", "answer": i} for i in range(6)])
  splits = load_data(DataConfig(path=path, format="jsonl", val=0.0, test=0.5))
  _check_splits(splits, 6)
  assert splits.problems["val"] == () and sorted(p.id for s in SPLITS for p in splits.problems[s]) == [
    f"q{i}" for i in range(6)
  ]
  assert all(p.answer == p.id[1:] for s in SPLITS for p in splits.problems[s])


def test_step_labelled_solutions_follow_their_problem(tmp_path):
  pb = [
    {
      "id": f"pb-{i}",
      "problem": f"Problem {i // 3}",
      "steps": ["a.", "b."],
      "label": i % 2 - 1,
      "final_answer_correct": True,
    }
    for i in range(12)
  ]
  splits = load_data(DataConfig(path=_write(tmp_path / "pb.jsonl", pb), format="processbench", val=0.25, test=0.25))
  _check_splits(splits, 4)
  assert sum(len(splits.solutions[s]) for s in SPLITS) == 12
  assert all(p.answer == NO_ANSWER for s in SPLITS for p in splits.problems[s])
  assert all(len(splits.solutions[s]) == 3 * len(splits.problems[s]) for s in SPLITS)

  def prm(i):
    steps = [{"completions": [{"text": "1 + 1 = 2.", "rating": 1, "flagged": None}], "chosen_completion": 0}]
    q = {"problem": f"What is {i // 2} + 1?", "ground_truth_answer": str(i // 2 + 1)}
    return {"question": q, "label": {"steps": steps, "finish_reason": "solution"}}

  splits = load_data(DataConfig(path=_write(tmp_path / "prm.jsonl", [prm(i) for i in range(8)]), format="prm800k"))
  _check_splits(splits, 4)
  assert all(len(splits.solutions[s]) == 2 * len(splits.problems[s]) for s in SPLITS)


def test_load_data_errors_name_the_field(tmp_path):
  two = _gsm8k(tmp_path, 2)
  with pytest.raises(ConfigError, match=r"2 problems leave the train split empty \(DataConfig.limit=0"):
    load_data(DataConfig(path=two, format="gsm8k"))
  with pytest.raises(ConfigError, match="test split empty"):
    load_data(DataConfig(path=_gsm8k(tmp_path, 10), format="gsm8k", limit=1))
  with pytest.raises(ConfigError, match=r"DataConfig.val \+ DataConfig.test = 1.1"):
    DataConfig(path=two, format="gsm8k", val=0.6, test=0.5)
  with pytest.raises(ConfigError, match=r"DataConfig.val: expected a finite number in \[0.0, 1.0\], got -0.1"):
    DataConfig(path=two, format="gsm8k", val=-0.1)
  with pytest.raises(ConfigError, match="DataConfig.path: no data file named"):
    load_data(DataConfig())


def test_prompt_order_is_an_endless_shuffle_resumable_by_position():
  order = PromptOrder(7, seed=1)
  epochs = [order.take(7 * e, 7) for e in range(4)]
  assert all(sorted(e) == list(range(7)) for e in epochs)  # each epoch a permutation
  assert len({tuple(e) for e in epochs}) > 1  # reshuffled per epoch
  assert order.take(0, 5) + order.take(5, 5) == order.take(0, 10) == epochs[0] + epochs[1][:3]
  assert PromptOrder(7, seed=1).take(3, 9) == order.take(3, 9) != PromptOrder(7, seed=2).take(3, 9)
  with pytest.raises(ConfigError, match="position must be a non-negative int"):
    order.take(-1, 2)


# ------------------------------------------------------------------------------------------------ consumers


def _record(tok, text: str, mode: str, sample: int) -> dict:
  ids = tok(text, add_special_tokens=False)["input_ids"]
  spans = step_lib.align(tok, ids, step_lib.STEP_MODE[mode])
  return {
    "id": f"{PROBLEM.id}#{sample}",
    "problem_id": PROBLEM.id,
    "domain": "math",
    "mode": mode,
    "sample": sample,
    "response_ids": ids,
    "response": tok.decode(ids),
    "steps": [{"text": s.text, "start": s.start, "end": s.end} for s in spans],
  }


def test_rule_annotator_on_math_gives_nan_steps_and_the_outcome(tok):
  texts = [
    (LINE.format("18.00"), "line"),
    (LINE.format("17"), "line"),
    ("- Step 1: 4 * 12 = 48\n- Step 2: 48 - 30 = 18\nThe answer is 18.", "line"),
    (THOUGHT, "thinking"),
    (THOUGHT.replace("{18}", "{19}"), "thinking"),
  ]
  records = [_record(tok, t, mode, i) for i, (t, mode) in enumerate(texts)]
  out = annotate(records, {PROBLEM.id: PROBLEM}, "rule", JudgeSettings(), "")
  got = [(r["labels"], r["answer"], r["correct"], r["first_error"]) for r in out]
  assert got == [
    ([None, None, 0.0], "18.00", True, None),  # the answer line labelled by the outcome, the steps unknown
    ([None, None, 1.0], "17", False, 2),
    ([None, None, None], "18", True, None),  # no answer line: the answer found in the text, only the outcome
    ([None, None], "18", True, None),
    ([None, None], "19", False, None),
  ]


def test_the_judge_sees_the_worked_solution_or_the_answer():
  assert reference_solution(PROBLEM) == (
    "Step 1: 4 * 12 = 48 rolls.\nStep 2: 48 - 30 = 18 rolls are left.\nFinal answer: 18"
  )
  assert reference_solution(Problem("p", "math", "q", "18", {})) == "Final answer: 18"


def test_votes_on_math_answers_key_equivalent_answers_together(tok):
  answers = ["17", "18", "18.00", "1,8"]
  cands = []
  for a in answers:
    ids = tok(LINE.format(a), add_special_tokens=False)["input_ids"]
    ids, spans, finish = trajectory_steps(tok, ids, "eos", mode="line", max_steps=8)
    cands.append(Candidate(tuple(ids), tuple(spans), (0.1,) * len(spans), finish))
  scores = [0.1, 0.3, 0.4, 0.9]  # the wrong '17' is the best-scored candidate
  cands = [Candidate(c.response_ids, c.steps, (s,) * len(c.steps), c.finish_reason) for c, s in zip(cands, scores)]
  result = PromptResult(tuple(cands), sampled_steps=12, generated_tokens=40)
  assert select.candidate_answers(PROBLEM, result, tok, "line") == [
    ("17", False),
    ("18", True),
    ("18", True),
    ("1,8", False),
  ]
  out = select.select(PROBLEM, result, tok, mode="line", aggregation="min", probabilities=True)
  assert out.best == select.Choice("17", False, 0)
  assert out.majority == select.Choice("18", True, 1)  # '18' and '18.00' vote together; the better-scored of them
  assert out.weighted.answer == "18" and out.pass_at_n == select.Choice("18", True, 1)
  assert isinstance(select.answer_checker(PROBLEM), MathTask)


def test_rl_default_reward_checks_any_tasks_answer(tok):
  assert answer_reward(PROBLEM, THOUGHT) == 1.0
  assert answer_reward(PROBLEM, THOUGHT.replace("{18}", "{18.0}")) == 1.0
  assert answer_reward(PROBLEM, THOUGHT.replace("{18}", "{17}")) == 0.0
  assert answer_reward(PROBLEM, "Step 1: 4 * 12 = 48.\n\nSo it is 18") == 0.0  # never closed: no answer
  arith = make_problems("arithmetic", 1, 0, 1)[0]
  assert answer_reward(arith, render_thinking(["x."], arith.answer)) == 1.0


def test_rollout_rewards_a_math_problem_by_its_answer(synthetic_lm):
  problems = (PROBLEM, Problem("p2", "math", "What is 2 + 2?", "4", {}))
  ids = synthetic_lm.encode([prompt_text(synthetic_lm, p, "thinking") for p in problems])
  prompts = PromptSet(problems, tuple(tuple(i) for i in ids))
  sampling = SamplingParams(temperature=1.0)
  roll = rollout_fn(synthetic_lm, prompts, group_size=2, max_new_tokens=12, sampling=sampling, seed=0, step=0)
  groups = roll(np.array([0, 1]), 0)
  eos = synthetic_lm.tokenizer.eos_token_id
  for g in groups:
    for t in g.trajectories:
      body = list(t.response_ids[:-1] if t.ended else t.response_ids)
      assert t.reward == answer_reward(problems[g.prompt], synthetic_lm.tokenizer.decode(body))
      assert not t.ended or t.response_ids[-1] == eos


def test_spae_metrics_on_math_read_what_is_meaningful(tok):
  text = "So 4 * 12 = 48.\n\nWait, let me check: 4 * 12 = 48.\n\n</think>\n\n**Final Answer**\n\\boxed{48}"
  ids = tok(text, add_special_tokens=False)["input_ids"]
  cuts = np.asarray([s.end - 1 for s in step_lib.align(tok, ids, "paragraph")], np.int64)
  ones = np.ones(len(cuts))
  problem = Problem("p48", "math", "What is 4 * 12?", "48", {})
  o = outcome_from(problem, ids, tok, StepPotentials(cuts, ones, ones, ones))
  assert (o.correct, o.kinds, o.oracle) == (True, ("other", "reflect"), None)  # no replay: no oracle
  for replay in (lambda: classify_paragraph(problem, "So 4 * 12 = 48."), lambda: thinking_progress(problem, ["a."])):
    with pytest.raises(ConfigError, match="problem 'p48': task 'math' is not a synthetic family"):
      replay()


def test_sampled_steps_take_the_boundary_the_config_names(synthetic_lm, monkeypatch):
  """`TrajectoryConfig.steps` cuts sampled responses at another boundary (docs/method.md §A1): the aligner is asked
  for that mode and the spans are its spans on the same ids; '' keeps the response format's own (line mode: lines).
  (The random tiny model's text seldom ends a sentence, so the modes are told apart by what the aligner is asked.)"""
  from reprobe_jax.trajectories import TrajectoryConfig, sample, sample_trajectories

  asked = []
  align = sample.step_lib.align

  def spy(tokenizer, ids, mode, **kw):
    asked.append(mode)
    return align(tokenizer, ids, mode, **kw)

  monkeypatch.setattr(sample.step_lib, "align", spy)
  problems = [Problem("m1", "math", "Tom has 3 apples and buys 4 more. How many now?", "7")]
  base = dict(samples=2, max_new_tokens=40, sampling=SamplingParams(1.0, 0, 1.0), seed=3)
  own = sample_trajectories(synthetic_lm, problems, "line", TrajectoryConfig(**base))
  assert asked == ["line", "line"]
  cut = sample_trajectories(synthetic_lm, problems, "line", TrajectoryConfig(**base, steps="sentence"))
  assert asked[2:] == ["sentence", "sentence"]
  for a, b in zip(own, cut):
    assert a.response_ids == b.response_ids  # the same samples: only the cutting differs
    assert [(s.start, s.end) for s in b.steps] == [
      (s.start, s.end) for s in align(synthetic_lm.tokenizer, list(b.response_ids), "sentence")
    ]
  with pytest.raises(ConfigError, match=r"TrajectoryConfig\.steps: expected one of"):
    TrajectoryConfig(steps="words")


def test_the_rule_annotator_refuses_steps_other_than_the_formats_own():
  from reprobe_jax.jobs.reprobe_config import ReprobeConfig
  from reprobe_jax.trajectories import TrajectoryConfig

  with pytest.raises(ConfigError, match=r"trajectories\.steps='sentence': the rule annotator labels the line"):
    ReprobeConfig(trajectories=TrajectoryConfig(steps="sentence"))
  assert ReprobeConfig(trajectories=TrajectoryConfig(steps="line")).trajectories.steps == "line"  # its own: fine
