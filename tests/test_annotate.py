"""Annotators of docs/method.md §A2: rule labels on aligned scripted traces equal the traces' own labels; the two-stage
judge with canned, HTTP and self-judge backends; imported labels in the three file formats and their errors."""

from __future__ import annotations

import contextlib
import copy
import http.server
import json
import math
import re
import socket
import threading

import pytest

from reprobe_jax import steps as step_lib
from reprobe_jax.annotate import (
  JudgeBackendError,
  JudgePrompts,
  OpenAICompatibleJudge,
  SelfJudge,
  annotate_judge,
  annotate_rule,
  import_labels,
  label_array,
  parse_verdict,
  parse_verdict_list,
  reference_solution,
)
from reprobe_jax.errors import ConfigError, DataFormatError
from reprobe_jax.steps import STEP_MODE
from reprobe_jax.tasks import Problem, TraceNoise, make_problems, solve_many

# Noisier than the default, so that many traces have wrong steps and wrong answers.
NOISE = TraceNoise(
  p_wrong_result=0.15,
  p_wrong_operand=0.05,
  p_wrong_operation=0.05,
  p_skip=0.05,
  p_illegal_move=0.1,
  p_detour=0.1,
  p_wrong_entity=0.15,
  p_wrong_relation=0.05,
)
ARITH = Problem(
  id="p0",
  domain="arithmetic",
  question="Start with 30. Multiply by 2. Add 14. What is the final result?",
  answer="74",
  data={"start": 30, "ops": [["*", 2], ["+", 14]], "difficulty": 1},
)
# Step 1 is wrong (61); step 2 builds correctly on it (61 + 14 = 75), but the final answer 75 is not the true 74.
WRONG_LINE = "- Step 1: 30 * 2 = 61\n- Step 2: 61 + 14 = 75\n<Answer>: 75"
SHORT = JudgePrompts(
  critique="STAGE1 {problem} | {reference} | {steps}",
  verdict="STAGE2 {critique} n={num_steps}",
  step="STEP {problem} | {previous} | {step_number}: {step}",
)


def nan_to_none(labels):
  return [None if isinstance(v, float) and math.isnan(v) else v for v in labels]


@pytest.fixture(scope="module")
def world():
  """Problems of every family and difficulty, noisy traces in both modes, and a byte-level BPE trained on some."""
  from reprobe_jax.synthetic.tokenizer import build_tokenizer

  problems = [p for fam in ("arithmetic", "planning", "qa") for d in (1, 2, 3) for p in make_problems(fam, 4, 7, d)]
  traces = [t for mode in ("line", "thinking") for seed in (0, 1) for t in solve_many(problems, mode, seed, NOISE)]
  tok = build_tokenizer([t.text for t in traces[::9]] + [ARITH.question, SHORT.critique, SHORT.step], 400)
  return {p.id: p for p in problems}, traces, tok


def to_record(tok, text: str, problem: Problem, mode: str, sample: int = 0) -> dict:
  """A trajectory record as `sample_trajectories` writes it (without token statistics)."""
  ids = tok(text)["input_ids"]
  steps = step_lib.align(tok, ids, STEP_MODE[mode])
  return {
    "id": f"{problem.id}#{sample}",
    "problem_id": problem.id,
    "domain": problem.domain,
    "mode": mode,
    "sample": sample,
    "response_ids": ids,
    "response": tok.decode(ids),
    "steps": [{"text": s.text, "start": s.start, "end": s.end} for s in steps],
  }


# ------------------------------------------------------------------------------------------------ rule


def test_rule_labels_equal_the_traces_own_labels(world):
  problems, traces, tok = world
  records = [to_record(tok, t.text, problems[t.problem_id], t.mode, i) for i, t in enumerate(traces)]
  before = copy.deepcopy(records)
  out = annotate_rule(records, problems)
  assert records == before  # inputs untouched
  wrong_steps = wrong_answers = 0
  for trace, rec in zip(traces, out):
    assert rec["response"] == trace.text
    expected = list(trace.labels)
    if trace.mode == "line":
      expected.append(0.0 if trace.correct else 1.0)  # the '<Answer>' line, checked against the true answer
    assert len(rec["steps"]) == len(expected)
    assert rec["labels"] == nan_to_none(expected), (trace.text, rec["labels"])
    assert rec["annotator"] == "rule" and rec["answer"] == trace.answer and rec["correct"] == trace.correct
    first = next((i for i, v in enumerate(expected) if v == 1.0), None)
    assert rec["first_error"] == first
    wrong_steps += sum(v == 1.0 for v in trace.labels)
    wrong_answers += not trace.correct
  assert wrong_steps > 30 and wrong_answers > 10  # the comparison covered real errors


def test_rule_worked_example_and_edge_cases(world):
  _, _, tok = world
  rec = to_record(tok, "Reasoning Steps:\n" + WRONG_LINE + "\nextra words", ARITH, "line")
  out = annotate_rule([rec], {ARITH.id: ARITH})[0]
  # The header is no step; the wrong step 1 is the error; step 2 is right on the written 61; the answer is wrong;
  # the line after the answer is unknown.
  assert [s["text"] for s in out["steps"]][0] == "- Step 1: 30 * 2 = 61"
  assert out["labels"] == [1.0, 0.0, 1.0, None]
  assert out["first_error"] == 0 and out["answer"] == "75" and out["correct"] is False
  assert label_array(out).tolist()[:3] == [1.0, 0.0, 1.0] and math.isnan(label_array(out)[3])

  empty = copy.deepcopy(rec)
  empty["steps"][0]["end"] = empty["steps"][0]["start"]  # a step with no tokens: unknown, whatever the checker says
  out = annotate_rule([empty], {ARITH.id: ARITH})[0]
  assert out["labels"][0] is None and out["first_error"] == 0

  with pytest.raises(DataFormatError, match=r"p0#0.*'nope'"):
    annotate_rule([dict(rec, problem_id="nope")], {ARITH.id: ARITH})
  with pytest.raises(DataFormatError, match="p0#0.*mode"):
    annotate_rule([dict(rec, mode="prose")], {ARITH.id: ARITH})
  with pytest.raises(DataFormatError, match="steps"):
    annotate_rule([{"id": "x", "problem_id": "p0", "mode": "line"}], {ARITH.id: ARITH})


def test_rule_thinking_steps_that_match_no_paragraph_are_unknown(world):
  problems, traces, tok = world
  trace = next(t for t in traces if t.mode == "thinking" and len(t.steps) >= 4)
  rec = to_record(tok, trace.text, problems[trace.problem_id], "thinking")
  rec["steps"][1] = dict(rec["steps"][1], text="Something the paragraphs do not say.")
  out = annotate_rule([rec], problems)[0]
  expected = nan_to_none(trace.labels)
  expected[1] = None
  assert out["labels"] == expected


# ------------------------------------------------------------------------------------------------ judge


class Canned:
  """A fake backend: replies from a function of the prompt; remembers the prompts."""

  name = "canned"

  def __init__(self, reply):
    self.reply, self.prompts = reply, []

  def complete(self, prompts):
    self.prompts.extend(prompts)
    return [self.reply(p) for p in prompts]


def _line_record(tok, text=WRONG_LINE, sample=0):
  return to_record(tok, text, ARITH, "line", sample)


@pytest.mark.parametrize(
  "verdict,labels",
  [
    ("Here is the list: [0, 1, 0]", [1.0, 0.0, 1.0]),
    ("Draft [1, 1, 1] ... final:\n```python\n[1, 1, 0]\n```", [0.0, 0.0, 1.0]),
    ("<think>maybe [0, 0, 0]</think>\n[1, 0, 1]", [0.0, 1.0, 0.0]),
    ("[1, 2, 0]", [None] * 3),  # not 0/1
    ("[True, False, True]", [None] * 3),
    ("[1, 0]", [None] * 3),  # wrong length
    ("I cannot tell.", [None] * 3),  # garbage
  ],
)
def test_two_stage_judge_with_canned_replies(world, verdict, labels):
  _, _, tok = world
  backend = Canned(lambda p: "Step 1 is wrong: 30 * 2 = 60." if p.startswith("STAGE1") else verdict)
  rec = _line_record(tok)
  out = annotate_judge([rec], {ARITH.id: ARITH}, backend, SHORT, keep_replies=True)[0]
  assert out["labels"] == labels and out["annotator"] == "judge:canned"
  assert out["first_error"] == next((i for i, v in enumerate(labels) if v == 1.0), None)
  stage1, stage2 = backend.prompts
  # Stage 1 sees the problem, the reference (the family's steps and the answer) and the numbered steps.
  assert ARITH.question in stage1 and "Step 1: 30 * 2 = 60\nStep 2: 60 + 14 = 74\nFinal answer: 74" in stage1
  assert "Step 1: 30 * 2 = 61\nStep 2: 61 + 14 = 75\nStep 3: <Answer>: 75" in stage1
  assert stage2 == "STAGE2 Step 1 is wrong: 30 * 2 = 60. n=3"
  assert out["judge_replies"] == {"critique": "Step 1 is wrong: 30 * 2 = 60.", "verdict": verdict}
  assert "labels" not in rec


def test_judge_batches_all_trajectories_and_handles_edge_cases(world):
  _, _, tok = world
  calls = []

  class Counting(Canned):
    def complete(self, prompts):
      calls.append(len(prompts))
      return super().complete(prompts)

  recs = [_line_record(tok, sample=k) for k in range(3)]
  recs[1]["steps"][2]["end"] = recs[1]["steps"][2]["start"]  # no tokens: unknown even when judged
  recs.append(dict(_line_record(tok, sample=3), steps=[]))
  out = annotate_judge(recs, {ARITH.id: ARITH.question}, Counting(lambda p: "[1, 1, 0]"), SHORT)
  assert calls == [3, 3]  # one call per stage over all trajectories; the empty one asks nothing
  assert [o["labels"] for o in out] == [[0.0, 0.0, 1.0], [0.0, 0.0, None], [0.0, 0.0, 1.0], []]
  assert out[1]["first_error"] == 2  # the judge's finding, though the step has no tokens
  assert "(no reference solution given)" in reference_solution("a question only")
  # A reasoning judge's thinking stays out of the stage-2 prompt (and its drafts out of the parsed list).
  thinker = Canned(
    lambda p: (
      "<think>[0, 0, 0] long</think>\nStep 1 is wrong."
      if p.startswith("STAGE1")
      else "<think>[0, 0, 0]</think>[1, 0, 1]"
    )
  )
  out = annotate_judge(recs[:1], {ARITH.id: ARITH}, thinker, SHORT)
  assert thinker.prompts[1] == "STAGE2 Step 1 is wrong. n=3" and out[0]["labels"] == [0.0, 1.0, 0.0]

  with pytest.raises(JudgeBackendError, match="2 replies for 3"):
    annotate_judge(recs[:3], {ARITH.id: ARITH}, type("Short", (), {"complete": lambda s, p: ["[1]"] * 2})(), SHORT)
  with pytest.raises(DataFormatError, match="p0#0.*'p0'"):
    annotate_judge(recs[:1], {}, Canned(str), SHORT)


def test_thinking_judge_calls_once_per_step(world):
  _, _, tok = world
  text = (
    "<think>\nFirst, 30 * 2 = 60.\n\nNext, 60 + 14 = 74.\n\nWait, let me check: 60 + 14 = 74.\n\n</think>\n\n"
    "**Final Answer**\n\\boxed{74}"
  )
  rec = to_record(tok, text, ARITH, "thinking")
  replies = {"1": "Looks right.\n1", "2": "The sum is wrong, so 0.", "3": "hmm"}
  backend = Canned(lambda p: replies[re.findall(r"\| (\d+): ", p)[-1]])
  out = annotate_judge([rec], {ARITH.id: ARITH}, backend, SHORT, keep_replies=True)[0]
  assert out["labels"] == [0.0, 1.0, None]
  assert len(backend.prompts) == 3
  assert backend.prompts[0].endswith("| (none) | 1: First, 30 * 2 = 60.")
  assert "Step 1: First, 30 * 2 = 60.\nStep 2: Next, 60 + 14 = 74. | 3: Wait" in backend.prompts[2]
  assert out["judge_replies"]["steps"][2] == "hmm"
  # per_step=False forces the two-stage judge on a thinking record.
  two = annotate_judge([rec], {ARITH.id: ARITH}, Canned(lambda p: "[1, 1, 1]"), SHORT, per_step=False)[0]
  assert two["labels"] == [0.0, 0.0, 0.0]


def test_verdict_parsers():
  assert parse_verdict_list("[1, 0]\nso: [0, 1]", 2) == [0, 1]
  assert parse_verdict_list("[1, 0] then [see above]", 2) == [1, 0]  # a bracket that is no list is skipped
  assert parse_verdict_list("[1, 0, 'x']", 3) is None and parse_verdict_list("", 1) is None
  assert parse_verdict("The step is correct.\n1") == 1 and parse_verdict("Verdict: [0]") == 0
  assert parse_verdict("It gives 10 and 0.5, so 0.") == 0
  assert parse_verdict("no digit here, 10 or 21") is None
  assert parse_verdict("<think>1</think> 0") == 0


def test_judge_prompts_from_config_and_validation():
  from configs.judge_prompts import get_config

  c = get_config()
  prompts = JudgePrompts.from_dict(c.prompts.to_dict())
  assert "{critique}" in prompts.verdict and c.self_judge.sampling.top_k == 20
  with pytest.raises(ConfigError, match="unknown field"):
    JudgePrompts(critique="{problem} {steps} {answer}", verdict="{critique}", step="{step}")
  with pytest.raises(ConfigError, match="must contain"):
    JudgePrompts(critique="{problem}", verdict="{critique}", step="{step}")
  with pytest.raises(ConfigError, match="braces"):
    JudgePrompts(critique="\\boxed{ {steps}", verdict="{critique}", step="{step}")
  with pytest.raises(ConfigError, match="unknown key"):
    JudgePrompts.from_dict(dict(c.prompts.to_dict(), temperature=0.7))


# ------------------------------------------------------------------------------------------------ HTTP judge


@contextlib.contextmanager
def chat_server(reply, *, fail_first: int = 0, status: int = 200):
  """A chat-completions server on 127.0.0.1 in a thread; it stops on exit, and by itself after 60 s at most."""
  seen = {"requests": [], "auth": [], "paths": []}
  lock = threading.Lock()

  class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
      body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
      with lock:
        seen["requests"].append(body)
        seen["auth"].append(self.headers.get("Authorization"))
        seen["paths"].append(self.path)
        n = len(seen["requests"])
      if n <= fail_first or status != 200:
        code = 503 if n <= fail_first else status
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"busy" if code == 503 else b"no such model")
        return
      content = reply(body["messages"][-1]["content"])
      data = (
        content
        if isinstance(content, bytes)
        else json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
      )
      self.send_response(200)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)

    def log_message(self, *args):
      pass

  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  server.daemon_threads = True
  thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
  thread.start()
  guard = threading.Timer(60.0, server.shutdown)
  guard.daemon = True
  guard.start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
  finally:
    guard.cancel()
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_openai_compatible_judge_over_http(world):
  _, _, tok = world
  recs = [_line_record(tok, sample=k) for k in range(3)]
  with chat_server(lambda p: "critique" if p.startswith("STAGE1") else "[1, 0, 0]", fail_first=1) as (url, seen):
    judge = OpenAICompatibleJudge(
      url + "/",
      "judge-model",
      api_key="k",
      temperature=0.5,
      top_p=0.9,
      max_tokens=64,
      timeout=5,
      retries=3,
      backoff=0.01,
      max_workers=2,
    )
    out = annotate_judge(recs, {ARITH.id: ARITH}, judge, SHORT)
  assert [o["labels"] for o in out] == [[0.0, 1.0, 1.0]] * 3 and out[0]["annotator"] == "judge:openai:judge-model"
  assert len(seen["requests"]) == 7  # 6 prompts + 1 retried after a 503
  assert set(seen["paths"]) == {"/v1/chat/completions"} and set(seen["auth"]) == {"Bearer k"}
  body = seen["requests"][-1]
  assert body["model"] == "judge-model" and body["temperature"] == 0.5 and body["top_p"] == 0.9
  assert body["max_tokens"] == 64 and body["messages"][0]["role"] == "user"


def test_openai_compatible_judge_errors_name_the_url():
  with chat_server(lambda p: "x", status=404) as (url, seen):
    judge = OpenAICompatibleJudge(url, "m", retries=3, backoff=0.01, timeout=5)
    with pytest.raises(JudgeBackendError, match=r"/v1/chat/completions failed: HTTP 404.*no such model"):
      judge.complete(["hello"])
    assert len(seen["requests"]) == 1  # a client error is not retried
  with chat_server(lambda p: b"not json") as (url, _):
    with pytest.raises(JudgeBackendError, match="not a chat completion"):
      OpenAICompatibleJudge(url, "m", timeout=5).complete(["hello"])
  with socket.socket() as s:  # a port nobody listens on
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  url = f"http://127.0.0.1:{port}/v1"
  with pytest.raises(JudgeBackendError, match=rf"{url}/chat/completions failed after 2 tries"):
    OpenAICompatibleJudge(url, "m", retries=2, backoff=0.01, timeout=2).complete(["hello"])
  with pytest.raises(ConfigError):
    OpenAICompatibleJudge("localhost:8000", "m")


# ------------------------------------------------------------------------------------------------ self judge


def test_self_judge_plumbing_with_a_tiny_random_model(world):
  """A random model's replies are noise; the labels must still be valid: unknown, or 0/1 for every step."""
  from reprobe_jax.models import LanguageModel, ModelConfig

  _, _, tok = world
  cfg = ModelConfig(
    family="llama",
    vocab_size=len(tok),
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    max_position_embeddings=1024,
    eos_token_ids=(tok.eos_token_id,),
    pad_token_id=tok.pad_token_id,
  )
  lm = LanguageModel.random(cfg, seed=0, tokenizer=tok)
  judge = SelfJudge(lm, max_new_tokens=6, seed=1, batch_size=4)
  assert judge.chat("hi").startswith("<|im_start|>user\nhi")
  recs = [_line_record(tok, sample=k) for k in range(2)]
  out = annotate_judge(recs, {ARITH.id: ARITH}, judge, SHORT, keep_replies=True)
  for o in out:
    assert o["annotator"] == "judge:self" and len(o["labels"]) == 3
    assert o["labels"] == [None] * 3 or all(v in (0.0, 1.0) for v in o["labels"])
    assert isinstance(o["judge_replies"]["critique"], str)


# ------------------------------------------------------------------------------------------------ import


def _write(tmp_path, lines):
  path = tmp_path / "labels.jsonl"
  path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
  return str(path)


def _records(n_steps=(4, 4, 4, 4)):
  return [
    {
      "id": f"t{i}",
      "problem_id": "p",
      "mode": "line",
      "steps": [{"text": f"s{k}", "start": k, "end": k + 1} for k in range(n)],
    }
    for i, n in enumerate(n_steps)
  ]


def test_import_each_format(tmp_path):
  recs = _records()
  before = copy.deepcopy(recs)
  path = _write(
    tmp_path,
    [
      {"id": "t0", "labels": [0, 1, None, 0]},
      {"id": "t1", "first_error": 1},  # worked example: [0, 1, NaN, NaN]
      {"id": "t2", "first_error": -1},  # no error: all correct
      {"id": "t3", "ratings": [1, 0, -1, 1]},
    ],
  )
  out = import_labels(recs, path)
  assert recs == before
  assert out[0]["labels"] == [0.0, 1.0, None, 0.0] and out[0]["first_error"] == 1
  assert out[1]["labels"] == [0.0, 1.0, None, None] and out[1]["first_error"] == 1
  assert out[2]["labels"] == [0.0] * 4 and out[2]["first_error"] is None
  assert out[3]["labels"] == [0.0, 0.0, 1.0, 0.0] and out[3]["first_error"] == 2
  assert [o["annotator"] for o in out] == [
    "import:labels",
    "import:first_error",
    "import:first_error",
    "import:ratings",
  ]
  # null first_error = no error; first_error 0 = only the first step is known.
  out = import_labels(recs[:2], _write(tmp_path, [{"id": "t0", "first_error": None}, {"id": "t1", "first_error": 0}]))
  assert out[0]["labels"] == [0.0] * 4 and out[1]["labels"] == [1.0, None, None, None]


def test_import_errors_name_file_and_line(tmp_path):
  recs = _records((4, 3))
  path = _write(tmp_path, [{"id": "t0", "labels": [0, 0, 0, 0]}, {"id": "t1", "labels": [0, 1]}])
  with pytest.raises(DataFormatError, match=r"labels\.jsonl:2: trajectory 't1' has 3 steps but 'labels' has 2"):
    import_labels(recs, path)
  path = _write(tmp_path, [{"id": "t0", "labels": [0, 0, 0, 0]}, "{not json"])
  with pytest.raises(DataFormatError, match=r"labels\.jsonl:2: invalid JSON"):
    import_labels(recs, path)
  for bad, match in [
    ({"id": "t1", "first_error": 3}, "has 3 steps; first_error"),
    ({"id": "t1", "labels": [0, 2, 1]}, r"labels\[1\] must be"),
    ({"id": "t1", "ratings": [1, 0.5, 1]}, r"ratings\[1\] must be"),
    ({"id": "t1", "labels": [0, 0, 0], "ratings": [1, 1, 1]}, "exactly one of"),
    ({"labels": [0, 0, 0]}, "'id'"),
  ]:
    with pytest.raises(DataFormatError, match=r"labels\.jsonl:2: .*" + match):
      import_labels(recs, _write(tmp_path, [{"id": "t0", "labels": [0, 0, 0, 0]}, bad]))
  with pytest.raises(DataFormatError, match=r"labels\.jsonl:2: .*already has labels at line 1"):
    import_labels(recs, _write(tmp_path, [{"id": "t0", "labels": [0] * 4}, {"id": "t0", "labels": [0] * 4}]))


def test_import_unknown_and_missing_ids(tmp_path):
  recs = _records((4, 3))
  path = _write(tmp_path, [{"id": "t0", "labels": [0, 0, 1, 0]}, {"id": "zz", "labels": [1]}])
  with pytest.raises(DataFormatError, match=r"labels\.jsonl:2: trajectory 'zz' is not among the 2 records"):
    import_labels(recs, path)
  path = _write(tmp_path, [{"id": "t0", "labels": [0, 0, 1, 0]}])
  with pytest.raises(DataFormatError, match=r"1 of 2 trajectories have no labels.*'t1'"):
    import_labels(recs, path)
  path = _write(tmp_path, [{"id": "t0", "labels": [0, 0, 1, 0]}, {"id": "zz", "labels": [1]}])
  out = import_labels(recs, path, strict=False)
  assert out[0]["labels"] == [0.0, 0.0, 1.0, 0.0]
  assert out[1]["labels"] == [None] * 3 and out[1]["annotator"] == "import:missing"


# ------------------------------------------------------------------------------------------------ Trajectory records


def test_annotators_take_and_return_trajectories(world, tmp_path):
  """A Trajectory in gives a Trajectory out (NaN for unknown, the annotator's keys in `extra`), labelled exactly
  as its dict would be."""
  from reprobe_jax.steps.labels import labels_to_json
  from reprobe_jax.trajectories import Trajectory

  problems, traces, tok = world
  dicts = [to_record(tok, t.text, problems[t.problem_id], t.mode, i) for i, t in enumerate(traces[::25])]
  dicts[0]["steps"][0]["end"] = dicts[0]["steps"][0]["start"]  # a step without tokens: unknown either way
  trajs = [Trajectory.from_json(d, required=("steps",)) for d in dicts]
  path = _write(tmp_path, [{"id": d["id"], "first_error": 0} for d in dicts])
  canned = Canned(
    lambda p: str([k % 2 for k in range(int(p.rsplit("n=", 1)[1]))]) if p.startswith("STAGE2") else "critique 1"
  )  # two-stage: step k correct when k is odd; per step: correct
  for annotate in (
    lambda rs: annotate_rule(rs, problems),
    lambda rs: import_labels(rs, path),
    lambda rs: annotate_judge(rs, problems, canned, SHORT),
  ):
    from_dicts, from_trajs = annotate(dicts), annotate(trajs)
    found = {v for d in from_dicts for v in d["labels"]}
    assert {None, 1.0} <= found
    for d, t, before in zip(from_dicts, from_trajs, trajs):
      assert isinstance(t, Trajectory) and t.steps == before.steps and before.labels is None
      assert labels_to_json(t.labels) == d["labels"] and t.first_error == d["first_error"]
      assert t.annotator == d["annotator"]
      assert t.extra == {k: v for k, v in d.items() if k not in set(t.to_json()) - set(t.extra)}
      assert label_array(t).tolist() == pytest.approx(label_array(d).tolist(), nan_ok=True)
  with pytest.raises(DataFormatError, match=r"<record 0>: expected a trajectory record"):
    annotate_rule(["not a record"], problems)
