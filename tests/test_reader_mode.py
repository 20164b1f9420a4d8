"""Reader mode (docs/own-data.md): the target teacher-forced over the given steps of ProcessBench and PRM800K files,
ProcessBench's first-error F1, and the ReProbe job on a data file (its config errors included)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from configs import reprobe_math
from reprobe_jax.errors import ConfigError
from reprobe_jax.eval import processbench
from reprobe_jax.features import FeatureSpec, token_features
from reprobe_jax.jobs import reprobe as pipeline
from reprobe_jax.jobs.reprobe_config import ProbeShape, ReprobeConfig, config_from_dict, split_problems, split_solutions
from reprobe_jax.jobs.reprobe_reader import outcome_accuracy
from reprobe_jax.probe.train import ProbeTrainConfig
from reprobe_jax.steps import STEP_MODE, align
from reprobe_jax.tasks.data import DataConfig, load_data
from reprobe_jax.trajectories import Trajectory, TrajectoryConfig, render_steps, teacher_force

SPECS = (FeatureSpec.from_name("hidden"), FeatureSpec.from_name("attn+logit"))


def processbench_records(n: int) -> list[dict]:
  """n ProcessBench records, one problem each: every third solution correct (label -1), the others wrong at a step."""
  out = []
  for i in range(n):
    a, b = 3 + i, 4 + 2 * i
    wrong = i % 3 != 0
    steps = [f"We need {a} + {b}.", f"{a} + {b} = {a + b + (1 if wrong else 0)}.", "Multi-line\nstep: done."]
    steps.append(f"So the answer is \\boxed{{{a + b + (1 if wrong else 0)}}}.")
    out.append(
      {
        "id": f"pb-{i}",
        "generator": "test",
        "problem": f"What is {a} plus {b}?",
        "steps": steps,
        "final_answer_correct": not wrong,
        "label": 1 if wrong else -1,
      }
    )
  return out


def prm800k_line(question: str, answer: str, steps: list[tuple[str, int | None]], finish="solution") -> dict:
  return {
    "labeler": "x",
    "timestamp": "t",
    "question": {"problem": question, "ground_truth_answer": answer},
    "label": {
      "steps": [{"completions": [{"text": t, "rating": r}], "chosen_completion": 0} for t, r in steps],
      "finish_reason": finish,
    },
  }


def write_jsonl(path, records) -> str:
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return str(path)


@pytest.fixture(scope="module")
def lm(synthetic_lm):
  return synthetic_lm


@pytest.fixture(scope="module")
def pb_file(tmp_path_factory):
  return write_jsonl(tmp_path_factory.mktemp("pb") / "processbench.jsonl", processbench_records(16))


@pytest.fixture(scope="module")
def prm_file(tmp_path_factory):
  lines = [
    prm800k_line("What is 2 + 2?", "4", [("2 + 2 = 4.", 1), ("# Answer\n\n4", 1)]),
    prm800k_line("What is 3 * 3?", "9", [("3 * 3 = 6.", -1), ("So 6.", None)], finish="found_error"),
    prm800k_line("What is 10 - 4?", "6", [("10 - 4 = 6.", 0), ("Check: 6 + 4 = 10.", 1), ("# Answer\n\n6", 1)]),
  ]
  return write_jsonl(tmp_path_factory.mktemp("prm") / "prm800k.jsonl", lines)


def _all(path, format):
  data = load_data(DataConfig(path=path, format=format, val=0.0, test=0.0))
  problems = {p.id: p for ps in data.problems.values() for p in ps}
  return problems, [s for ss in data.solutions.values() for s in ss]


@pytest.mark.parametrize("format", ["processbench", "prm800k"])
@pytest.mark.parametrize("mode", ["line", "thinking"])
def test_a_batch_equals_each_record_alone(lm, pb_file, prm_file, format, mode):
  problems, sols = _all(pb_file if format == "processbench" else prm_file, format)
  sols = sols[:5]
  feats: dict = {}

  def keep(batch, f):
    for name, per in f.items():
      feats.setdefault(name, {}).update(per)

  batch = teacher_force(lm, problems, sols, mode, feature_specs=SPECS, on_features=keep, batch_size=4)
  for sol, t in zip(sols, batch):
    alone_feats: dict = {}
    (one,) = teacher_force(
      lm, problems, [sol], mode, feature_specs=SPECS, on_features=lambda b, f: alone_feats.update(f), batch_size=1
    )
    assert t.id == one.id == sol.id and t.response_ids == one.response_ids and t.spans == one.spans
    np.testing.assert_allclose(t.logprobs, one.logprobs, atol=1e-5)
    np.testing.assert_allclose(t.entropy, one.entropy, atol=1e-5)
    np.testing.assert_allclose(t.self_certainty, one.self_certainty, atol=1e-5)
    for spec in SPECS:
      np.testing.assert_allclose(feats[spec.name][t.id], alone_feats[spec.name][t.id], atol=1e-5)
    # The spans are the boundary automaton's (every step one line or one paragraph), one per given step, labelled
    # from the file, and the outcome is the file's.
    assert t.spans == [(s.start, s.end) for s in align(lm.tokenizer, t.response_ids, STEP_MODE[mode])]
    assert len(t.steps) == len(sol.steps) and all(s.has_tokens for s in t.steps)
    np.testing.assert_array_equal(t.label_array(), np.asarray(sol.labels(), np.float32))
    assert t.first_error == sol.first_error and t.extra["correct"] == sol.final_answer_correct
    assert t.annotator == f"import:{format}"
  # The features are those of the teacher-forced extraction the job runs for records without captured ones.
  for spec in SPECS:
    for t, ref in zip(batch, token_features(lm, batch, spec)):
      np.testing.assert_allclose(feats[spec.name][t.id], ref, atol=1e-5)
  # The log-probabilities are the model's: the 'logit' features' own log-prob column is the same number.
  t = batch[0]
  np.testing.assert_allclose(feats["attn+logit"][t.id][:, -2], t.logprobs, atol=1e-5)


def test_render_steps_one_line_or_paragraph_per_step():
  text, ranges = render_steps(["a = 1.", "two\nlines", "b"], "line")
  assert text == "- Step 1: a = 1.\n- Step 2: two lines\n- Step 3: b"
  assert [text[a:b] for a, b in ranges] == ["- Step 1: a = 1.\n", "- Step 2: two lines\n", "- Step 3: b"]
  text, ranges = render_steps(["a = 1.", "two\n\nparts"], "thinking")
  assert text == "<think>\na = 1.\n\ntwo parts.\n\n</think>\n\n"
  assert [text[a:b] for a, b in ranges] == ["a = 1.\n\n", "two parts.\n\n"]


def test_processbench_metric_worked_example():
  nan = math.nan
  labels = [[0, 0, 1, nan], [0, 0, 0], [0, 1], [0, 0]]
  scores = [[0.1, 0.2, 0.9, 0.3], [0.1, 0.6, 0.2], [0.7, 0.8], [0.2, 0.3]]
  # tau 0.5: A's first error (step 2) found, C flagged at step 0 (wrong), B flagged at step 1, D not flagged.
  s = processbench.score(labels, scores, 0.5)
  assert (s.error_acc, s.correct_acc, s.f1, s.n_error, s.n_correct) == (0.5, 0.5, 0.5, 2, 2)
  # tau 0.6: C still at step 0 (0.7 > 0.6), B no longer flagged (0.6 is not above 0.6): F1 = 2 * 0.5 * 1 / 1.5.
  assert processbench.score(labels, scores, 0.6).f1 == pytest.approx(2 / 3)
  # tau 0.7 is the lowest threshold with every prediction right (0.8 misses C's step 1).
  best = processbench.choose_tau(labels, scores)
  assert best.tau == 0.7 and best.f1 == 1.0
  assert processbench.score(labels, scores, 0.8).error_acc == 0.5
  out = processbench.evaluate(labels, scores, [[0, 1]], [[0.75, 0.71]])
  assert out["tau"] == 0.7 and out["val_f1"] == 1.0 and out["error_acc"] == 0.0 and math.isnan(out["correct_acc"])
  assert math.isnan(out["f1"]) and out["n_correct"] == 0


def _brute(labels, scores, tau):
  """ProcessBench's F1 written out loop by loop."""
  hit_err = n_err = hit_ok = n_ok = 0
  for y, s in zip(labels, scores):
    truth = next((k for k, v in enumerate(y) if v == 1), None)
    pred = next((k for k, v in enumerate(s) if v > tau), None)
    if truth is None:
      n_ok, hit_ok = n_ok + 1, hit_ok + (pred is None)
    else:
      n_err, hit_err = n_err + 1, hit_err + (pred == truth)
  a, b = hit_err / n_err, hit_ok / n_ok
  return 0.0 if a + b == 0 else 2 * a * b / (a + b)


def test_processbench_metric_against_brute_force():
  rng = np.random.default_rng(0)
  for _ in range(20):
    labels, scores = [], []
    for k in range(12):
      n = int(rng.integers(1, 6))
      y = np.zeros(n)
      if k % 2:
        e = int(rng.integers(0, n))
        y[e], y[e + 1 :] = 1, np.nan
      labels.append(y)
      scores.append(np.round(rng.random(n), 1))  # ties on purpose
    grid = np.r_[-1.0, np.arange(0, 1.05, 0.05)]
    for tau in grid:
      assert processbench.score(labels, scores, tau).f1 == pytest.approx(_brute(labels, scores, tau))
    best = processbench.choose_tau(labels, scores)
    assert best.f1 == pytest.approx(max(_brute(labels, scores, t) for t in grid))
    assert best.f1 == pytest.approx(_brute(labels, scores, best.tau))


TINY = ReprobeConfig(
  trajectories=TrajectoryConfig(samples=1, max_new_tokens=40, batch_size=8),
  feature_sets=("hidden", "attn+logit"),
  probe=ProbeShape(d_model=16, n_heads=2, ff_dim=32),
  train=ProbeTrainConfig(batch_size=8, epochs=2),
)


@pytest.mark.slow  # the whole job in reader mode on a tiny target (about 95 s on 2 cores)
def test_job_on_a_processbench_file_reports_pr_auc_and_first_error_f1(lm, pb_file, tmp_path):
  cfg = dataclasses.replace(TINY, data=DataConfig(path=pb_file, format="processbench", val=0.25, test=0.25))
  assert cfg.reader_mode and cfg.domains == ["math"]
  events = []
  metrics = pipeline.evaluate(lm, cfg, str(tmp_path), progress=lambda *e: events.append(e[0].split()[0]))
  assert "teacher-force" in events and "sample" not in events and "annotate" not in str(events)
  recs = [json.loads(x) for x in open(tmp_path / "trajectories_test.jsonl")]
  sols = {s.id: s for s in split_solutions(cfg).test}
  assert {r["id"] for r in recs} == set(sols) and all(r["annotator"] == "import:processbench" for r in recs)
  assert set(metrics["datasets"]) == {"math"}  # no '(steps)' copy: there is no answer line
  known = sum(sum(v is not None for v in r["labels"]) for r in recs)
  assert metrics["datasets"]["math"]["steps"] == known
  methods = {"probe[hidden]", "probe[attn+logit]", "logreg[hidden]", "maxprob", "perplexity", "random"}
  assert methods <= set(metrics["methods"])
  assert all(0.0 <= metrics["methods"][m]["math"]["pr_auc"] <= 1.0 for m in methods)
  assert methods <= set(metrics["first_error"])
  for m in methods:
    fe = metrics["first_error"][m]
    assert fe["n_error"] + fe["n_correct"] == len(recs)
    assert 0.0 <= fe["val_f1"] <= 1.0
  # outcome accuracy: the file's final_answer_correct over the test solutions
  want = np.mean([sols[r["id"]].final_answer_correct for r in recs])
  assert metrics["outcome"] == {"accuracy": pytest.approx(want), "trajectories": len(recs)}
  table = (tmp_path / "table.md").read_text()
  assert "first-error F1" in table and "Outcome accuracy" in table
  # Every feature was captured in the teacher-forced pass: the feature stage ran no forward of its own.
  assert "features_hidden" not in metrics.get("timings_s", {})
  # A rerun reuses every stage.
  events.clear()
  again = pipeline.evaluate(lm, cfg, str(tmp_path))
  assert json.dumps(again["first_error"], sort_keys=True) == json.dumps(metrics["first_error"], sort_keys=True)


def test_rule_annotator_on_a_problems_file_is_refused_naming_the_field(tmp_path):
  path = write_jsonl(tmp_path / "gsm8k.jsonl", [{"question": "1 + 1?", "answer": "1 + 1 = 2\n#### 2"}])
  with pytest.raises(ConfigError, match=r"\.annotator='rule'.*'self', 'judge' or 'import'"):
    ReprobeConfig(data=DataConfig(path=path, format="gsm8k"))
  ReprobeConfig(data=DataConfig(path=path, format="gsm8k"), annotator="import", labels_path=path)  # accepted


def test_a_split_without_labelled_solutions_is_refused_naming_the_field(lm, tmp_path):
  # 6 problems, only the first has a labelled solution (the others ended before their first step).
  lines = [prm800k_line("What is 1 + 1?", "2", [("1 + 1 = 2.", 1)])]
  lines += [prm800k_line(f"What is {k} + 1?", str(k + 1), [], finish="give_up") for k in range(2, 7)]
  path = write_jsonl(tmp_path / "prm800k.jsonl", lines)
  cfg = dataclasses.replace(TINY, data=DataConfig(path=path, format="prm800k", val=0.2, test=0.2))
  assert len([p for ps in split_problems(cfg) for p in ps]) == 6
  with pytest.raises(ConfigError, match=r"config\.data\.(val|test)\b.*holds no labelled solution"):
    split_solutions(cfg)
  with pytest.raises(ConfigError, match="holds no labelled solution"):
    pipeline.evaluate(lm, cfg, str(tmp_path / "run"))
  assert not (tmp_path / "run" / "samples_train.jsonl").exists()


def test_math_config_without_a_data_file_stops_at_once():
  with pytest.raises(
    ConfigError,
    match=r"^config\.train_domains: 'math' is the task of a data file, and config\.data\.path names none: name a "
    r"file with --config\.data\.path=",
  ):
    config_from_dict(reprobe_math.get_config())


def test_outcome_accuracy_reads_the_file_for_given_solutions_and_checks_sampled_answers(tmp_path):
  path = write_jsonl(
    tmp_path / "gsm8k.jsonl",
    [{"question": f"{k} + {k}?", "answer": f"{k} + {k} = {2 * k}\n#### {2 * k:,}"} for k in (3, 600)],
  )
  cfg = ReprobeConfig(
    data=DataConfig(path=path, format="gsm8k", val=0.0, test=0.0), annotator="import", labels_path=path
  )
  problems = split_problems(cfg)
  p3, p600 = sorted(problems.train, key=lambda p: len(p.answer))

  def sampled(p, response, k=0):
    return Trajectory(f"{p.id}#{k}", p.id, "math", "line", (), response=response)

  test = [
    sampled(p3, "- Step 1: 3 + 3 = 6\n<Answer>: 6"),
    sampled(p600, "- Step 1: 600 + 600 = 1200\n<Answer>: 1200.0"),  # '1,200' and '1200.0' are one answer
    sampled(p600, "- Step 1: 600 + 600 = 1100\n<Answer>: 1100", 1),
    dataclasses.replace(sampled(p3, "x", 1), annotator="import:processbench", extra={"correct": None}),  # unknown
  ]
  assert outcome_accuracy(problems, test) == {"accuracy": pytest.approx(2 / 3), "trajectories": 3}
