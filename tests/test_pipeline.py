"""ReProbe end to end on a tiny configuration: every stage runs, writes its artifacts, and reruns from cache."""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import shutil

import numpy as np
import pytest

from reprobe_jax.jobs import reprobe as pipeline
from reprobe_jax.jobs.reprobe_config import ProbeShape, ReprobeConfig, config_from_dict, run_folder, split_problems
from reprobe_jax.eval import report
from reprobe_jax.features import FeatureMismatchError
from reprobe_jax.steps.labels import labels_to_json
from reprobe_jax.models import LanguageModel
from reprobe_jax.probe import linear
from reprobe_jax.probe.train import ProbeTrainConfig
from reprobe_jax.tasks import make_problems
from reprobe_jax.tasks.formats import user_prompt
from reprobe_jax.tasks.splits import SPLIT_SEEDS
from reprobe_jax.trajectories import TrajectoryConfig, read_trajectories
from test_graph import counted

TINY = ReprobeConfig(
  train_problems=12,
  val_problems=6,
  test_problems=6,
  difficulties=(1,),
  trajectories=TrajectoryConfig(samples=2, max_new_tokens=40, batch_size=16),
  probe=ProbeShape(d_model=16, n_heads=2, ff_dim=32),
  train=ProbeTrainConfig(batch_size=8, epochs=2),
)


@pytest.fixture(scope="module")
def lm(synthetic_lm):
  """A random tiny model with a tokenizer of the synthetic worlds (outputs are noise; mechanics only)."""
  return synthetic_lm


@pytest.mark.slow  # the whole ReProbe job on a tiny world (about 130 s on 2 cores); .ci/run runs it
def test_pipeline_end_to_end(lm, tmp_path):
  events = []
  metrics = pipeline.evaluate(lm, TINY, str(tmp_path), progress=lambda *e: events.append(e[0].split()[0]))
  assert {"sample", "probe"} <= set(events)
  for f in (
    "trajectories_train.jsonl",
    "trajectories_test.jsonl",
    "metrics.json",
    "table.md",
    "pr_curves.png",
    "features/hidden/manifest.json",
    "features/attn+logit/manifest.json",
    "probe/hidden/history.json",
  ):
    assert os.path.exists(tmp_path / f), f
  # Each domain also without its '<Answer>' lines: the same steps with those unlabelled.
  assert set(metrics["datasets"]) == {f"{d}{s}" for d in ("arithmetic", "planning", "qa") for s in ("", " (steps)")}
  test_recs = [json.loads(line) for line in open(tmp_path / "trajectories_test.jsonl")]
  for d in ("arithmetic", "planning", "qa"):
    known = [
      (lab, st["text"])
      for r in test_recs
      if r["domain"] == d
      for lab, st in zip(r["labels"], r["steps"])
      if lab is not None
    ]
    assert metrics["datasets"][d]["steps"] == len(known)
    assert metrics["datasets"][f"{d} (steps)"]["steps"] == sum(not t.strip().startswith("<Answer>") for _, t in known)
  assert "machine" in metrics and "cores" in metrics["machine"]
  # The features were recorded by the sampler: every trajectory is in both stores and none needed a forward.
  n_traj = sum(1 for split in ("train", "val", "test") for _ in open(tmp_path / f"trajectories_{split}.jsonl"))
  for name in ("hidden", "attn+logit"):
    with open(tmp_path / "features" / name / "manifest.json") as f:
      assert sum(len(s["ids"]) for s in json.load(f)["shards"]) == n_traj
  assert "features_hidden" not in metrics.get("timings_s", {})
  methods = set(metrics["methods"])
  assert {
    "probe[hidden]",
    "probe[attn+logit]",
    "logreg[hidden]",
    "maxprob",
    "perplexity",
    "max_entropy",
    "mean_entropy",
    "self_certainty",
    "random",
  } <= methods
  with open(tmp_path / "trajectories_test.jsonl") as f:
    rec = json.loads(f.readline())
  assert len(rec["labels"]) == len(rec["steps"]) and rec["annotator"] == "rule"
  assert len(rec["logprobs"]) == len(rec["response_ids"])
  table = (tmp_path / "table.md").read_text()
  assert "probe[hidden]" in table and "OOD mean" in table
  # A rerun reuses every stage: nothing is sampled, extracted or trained again.
  events.clear()
  again = pipeline.evaluate(lm, TINY, str(tmp_path), progress=lambda *e: events.append(e[0].split()[0]))
  assert not events
  assert json.dumps(again, sort_keys=True) == json.dumps(metrics, sort_keys=True)  # NaN-safe equality
  # Same seed, same numbers: a fresh run in another folder recomputes everything and gets the same metrics.
  fresh = pipeline.evaluate(lm, TINY, str(tmp_path / "fresh"))
  fresh.pop("timings_s", None)
  assert json.dumps(fresh, sort_keys=True) == json.dumps(
    {k: v for k, v in metrics.items() if k != "timings_s"}, sort_keys=True
  )
  # A probe checkpoint made with another probe shape (or other features) is refused, not silently mixed.
  other = dataclasses.replace(TINY, probe=ProbeShape(d_model=8, n_heads=2, ff_dim=16))
  with pytest.raises(FeatureMismatchError, match="probe checkpoint"):
    pipeline.train_probes(lm, other, str(tmp_path))


def count_stages(monkeypatch, module) -> collections.Counter:
  """Counts the calls of every stage function of `module.GRAPH`, the graph each run of that job is made from."""
  graph, calls = counted(module.GRAPH)
  monkeypatch.setattr(module, "GRAPH", graph)
  return calls


def count_reads(monkeypatch) -> collections.Counter:
  """Counts how often the ReProbe job reads each trajectory file."""
  reads = collections.Counter()
  read = pipeline.read_trajectories

  def counted(path, **kwargs):
    reads[os.path.basename(path)] += 1
    return read(path, **kwargs)

  monkeypatch.setattr(pipeline, "read_trajectories", counted)
  return reads


# every stage of the ReProbe graph; on the synthetic world the data-file stages (solutions, outcomes, first_errors)
# run once each and give None
STAGES = (
  "problems",
  "solutions",
  "samples",
  "trajectories",
  "features",
  "probes",
  "prm",
  "scores",
  "prm_comparison",
  "outcomes",
  "first_errors",
  "report",
)
SPLITS = ("train", "val", "test")


@pytest.mark.slow  # the whole job twice (with and without the PRM) on a tiny world; .ci/run runs it
@pytest.mark.parametrize("with_prm", [False, True])
def test_the_job_computes_each_stage_once_and_reads_each_file_once(lm, tmp_path, monkeypatch, with_prm):
  """From the job's entry to its PR-AUC table no stage is entered twice, and no trajectory file is read twice: the
  samples once (to label them), the labelled trajectories once, whatever stages read them."""
  from reprobe_jax.prm.train import PRMTrainConfig

  prm = PRMTrainConfig(separator="<|pad|>", batch_size=4, epochs=1) if with_prm else None
  cfg = dataclasses.replace(
    TINY,
    train_problems=4,
    val_problems=4,
    test_problems=2,
    feature_sets=("hidden",),
    train=ProbeTrainConfig(batch_size=4, epochs=1),
  )
  calls, reads = count_stages(monkeypatch, pipeline), count_reads(monkeypatch)
  metrics = pipeline.evaluate(lm, cfg, str(tmp_path), prm=prm)
  assert calls == {s: 1 for s in STAGES}
  assert reads == {f"{kind}_{split}.jsonl": 1 for kind in ("samples", "trajectories") for split in SPLITS}
  assert ("prm" in metrics["methods"]) == with_prm and "probe[hidden]" in metrics["methods"]
  # A rerun of the finished job: every stage once again (from its artifacts), the samples not read at all.
  calls.clear()
  reads.clear()
  again = pipeline.evaluate(lm, cfg, str(tmp_path), prm=prm)
  assert calls == {s: 1 for s in STAGES}
  assert reads == {f"trajectories_{split}.jsonl": 1 for split in SPLITS}
  assert again["methods"].keys() == metrics["methods"].keys()


def test_config_from_dict_names_unknown_fields():
  from configs.reprobe_synthetic import get_config
  from reprobe_jax.errors import ConfigError

  c = get_config()
  cfg = config_from_dict(c)
  assert cfg.probe.d_model == c.probe.d_model and cfg.trajectories.sampling.top_k == 50
  c.probe.d_modle = 3
  with pytest.raises(ConfigError, match="d_modle"):
    config_from_dict(c)


def test_logistic_regression_baseline_separates_and_matches_sklearn():
  from sklearn.linear_model import LogisticRegression

  rng = np.random.default_rng(0)
  x = rng.normal(size=(400, 3)) * [1.0, 5.0, 0.2] + [0.0, 3.0, -1.0]
  y = (x[:, 0] + 0.3 * rng.normal(size=400) > 0).astype(float)
  p = linear.fit_logistic(x, y, l2=2.0)(x)
  assert np.mean((p > 0.5) == y) > 0.9
  # The same objective in sklearn: sum of log-losses + (1 / 2C) |w|^2 on standardised inputs, intercept free.
  z = (x - x.mean(0)) / (x.std(0) + 1e-6)
  ref = LogisticRegression(C=1 / 2.0, tol=1e-10, max_iter=1000).fit(z, y).predict_proba(z)[:, 1]
  np.testing.assert_allclose(p, ref, atol=1e-6)
  y[::7] = np.nan  # unknown labels are left out of the fit, and of the standardisation
  known = ~np.isnan(y)
  z = (x - x[known].mean(0)) / (x[known].std(0) + 1e-6)
  ref = LogisticRegression(C=1.0, tol=1e-10, max_iter=1000).fit(z[known], y[known]).predict_proba(z)[:, 1]
  np.testing.assert_allclose(linear.fit_logistic(x, y)(x), ref, atol=1e-6)


def test_few_shot_prompts_hold_worked_examples_of_the_same_family(lm):
  from reprobe_jax.tasks import get_family
  from reprobe_jax.tasks.examples import SHOT_SEED
  from reprobe_jax.trajectories import few_shot_turns, prompt_text

  problem = make_problems("qa", 1, 7, 2)[0]
  turns = few_shot_turns(problem, "line", 2)
  assert [t["role"] for t in turns] == ["user", "assistant"] * 2
  shots = make_problems("qa", 2, SHOT_SEED, 1)
  family = get_family("qa")
  for shot, (user, assistant) in zip(shots, zip(turns[::2], turns[1::2])):
    assert user["content"] == user_prompt(shot, "line", example=False)  # the examples show the format
    # the worked answer is the clean reference solution, in the format the model is asked for
    bodies = [line.split(": ", 1)[1] for line in assistant["content"].splitlines() if line.startswith("- Step")]
    assert bodies == family.reference_steps(shot) and family.check_steps(shot, bodies) == [0.0] * len(bodies)
    assert assistant["content"].endswith(f"<Answer>: {shot.answer}")
  text = prompt_text(lm, problem, "line", 2)  # the synthetic tokenizer's chat template
  assert text.count("<|im_start|>assistant") == 3 and text.rstrip().endswith("<|im_start|>assistant")
  assert text.index(shots[1].question) < text.index(problem.question)
  assert user_prompt(problem, "line", example=False) in text and family.step_hint not in text
  assert prompt_text(lm, problem, "line") == prompt_text(lm, problem, "line", 0)
  assert shots[0].question not in prompt_text(lm, problem, "line", 0)
  assert user_prompt(problem, "line") in prompt_text(lm, problem, "line", 0)  # no examples: the hint shows a step


def test_first_step_prompts_spell_out_the_examples_and_the_question(lm):
  from reprobe_jax.errors import ConfigError
  from reprobe_jax.tasks import get_family
  from reprobe_jax.tasks.examples import SHOT_SEED
  from reprobe_jax.trajectories import TrajectoryConfig, few_shot_turns, prompt_text

  family = get_family("qa")
  problem = make_problems("qa", 1, 7, 1)[0]
  text = prompt_text(lm, problem, "line", 2, first_step=True)
  assert family.first_step_question(problem) in text and problem.question not in text
  for shot, turn in zip(make_problems("qa", 2, SHOT_SEED, 1), few_shot_turns(problem, "line", 2, True)[::2]):
    assert turn["content"] == user_prompt(shot, "line", example=False, first_step=True)
  assert prompt_text(lm, problem, "line", 2, first_step=False) == prompt_text(lm, problem, "line", 2)
  with pytest.raises(ConfigError, match="first_step"):
    TrajectoryConfig(first_step=1)


def test_goal_mark_marks_the_move_into_the_goal_in_planning_examples_only(lm):
  from reprobe_jax.errors import ConfigError
  from reprobe_jax.tasks import get_family
  from reprobe_jax.tasks.examples import SHOT_SEED, with_done_mark
  from reprobe_jax.trajectories import TrajectoryConfig, few_shot_turns, prompt_text

  family = get_family("planning")
  problem = make_problems("planning", 1, 7, 1)[0]
  shots = make_problems("planning", 4, SHOT_SEED, 1)
  marked = few_shot_turns(problem, "line", 4, True, True)
  plain = few_shot_turns(problem, "line", 4, True)
  assert [t["content"] for t in marked[::2]] == [t["content"] for t in plain[::2]]  # the questions are the same
  for shot, with_mark, without in zip(shots, marked[1::2], plain[1::2]):
    bodies = [line.split(": ", 1)[1] for line in with_mark["content"].splitlines() if line.startswith("- Step")]
    reference = family.reference_steps(shot)
    # only the last move, the one into the goal, says so; the marked example is still all correct
    assert bodies == reference[:-1] + [reference[-1] + " (the goal)"] and reference[-1].endswith(shot.data["goal"])
    assert family.check_steps(shot, bodies) == [0.0] * len(bodies)
    assert with_mark["content"] == without["content"].replace(reference[-1], bodies[-1])
  # a walk that never reaches the goal gets no mark; families without a mark are left as they are
  assert with_done_mark(shots[0], ["move from 1 to 1"]) == ["move from 1 to 1"]
  for domain in ("arithmetic", "qa"):
    other = make_problems(domain, 1, 7, 1)[0]
    assert prompt_text(lm, other, "line", 2, True, True) == prompt_text(lm, other, "line", 2, True)
  assert prompt_text(lm, problem, "line", 2, True, False) == prompt_text(lm, problem, "line", 2, True)
  with pytest.raises(ConfigError, match="goal_mark.*thinking"):
    prompt_text(lm, problem, "thinking", 2, False, True)
  with pytest.raises(ConfigError, match="goal_mark"):
    TrajectoryConfig(goal_mark="yes")


def test_run_dir_is_keyed_by_config_and_target_model(lm):
  from configs import reprobe_synthetic
  from reprobe_jax.jobs.cli import run_dir

  config = reprobe_synthetic.get_config()
  here = run_dir(config, lm)
  assert here.startswith(config.workdir + os.sep) and run_dir(config, lm) == here
  other_model = LanguageModel.random(lm.config, seed=1, tokenizer=lm.tokenizer)
  assert run_dir(config, other_model) != here
  config.probe.d_model = 64
  assert run_dir(config, lm) != here
  config.probe.d_model = reprobe_synthetic.get_config().probe.d_model
  config.trajectories.first_step = False  # the default: the folder it had before the option
  assert run_dir(config, lm) == here
  config.trajectories.first_step = True
  assert run_dir(config, lm) != here
  config.trajectories.first_step = False
  config.trajectories.goal_mark = False  # likewise
  assert run_dir(config, lm) == here
  config.trajectories.goal_mark = True
  assert run_dir(config, lm) != here


def test_run_dir_changes_with_the_task_generator(lm, monkeypatch):
  """Trajectories cached for one question layout are not reused after the generator changes."""
  from configs import reprobe_synthetic
  from reprobe_jax.jobs.cli import run_dir
  from reprobe_jax.tasks import FAMILIES

  config = reprobe_synthetic.get_config()
  here = run_dir(config, lm)
  qa = FAMILIES["qa"]
  original = qa.generate
  monkeypatch.setattr(
    qa,
    "generate",
    lambda seed, d: dataclasses.replace(
      original(seed, d), question=original(seed, d).question.replace("Who is that?", "Which person is that?")
    ),
  )
  assert run_dir(config, lm) != here
  monkeypatch.undo()
  assert run_dir(config, lm) == here


def test_summary_of_a_domain_without_labelled_steps():
  """A test domain whose steps all went unlabelled reports 0 steps and no incorrect share, and the table says so."""
  cfg = ReprobeConfig(train_domains=("arithmetic",), ood_domains=("qa",))
  labels = {"arithmetic": np.array([0.0, 1.0, np.nan, 1.0]), "qa": np.array([np.nan, np.nan])}
  scores = {"maxprob": {"arithmetic": np.array([0.1, 0.9, 0.5, 0.8]), "qa": np.array([0.2, 0.3])}}
  metrics = report.scorer_metrics(scores, labels, cfg.train_domains, cfg.ood_domains)
  assert metrics["datasets"] == {
    "arithmetic": {"steps": 3, "incorrect_share": pytest.approx(2 / 3)},
    "qa": {"steps": 0, "incorrect_share": None},
  }
  assert metrics["methods"]["maxprob"]["arithmetic"]["pr_auc"] == 1.0
  assert "arithmetic: 3 steps, 67% incorrect, qa: 0 steps, none labelled" in report.table_markdown(metrics)


def test_linear_step_scores_worked_example():
  """Each step with tokens gets the predictor's score of its mean-pooled features; a step without tokens, 0.5."""
  from reprobe_jax.probe.data import Example

  feats = np.arange(12, dtype=np.float32).reshape(6, 2)
  a = Example("a", "arithmetic", feats, np.array([[0, 2], [2, 2], [2, 6]], np.int32), np.array([1.0, np.nan, 0.0]))
  b = Example("b", "qa", feats[:1], np.array([[0, 1]], np.int32), np.array([np.nan], np.float32))
  x, y = linear.mean_pooled([a, b])
  np.testing.assert_array_equal(x, [[1, 2], [7, 8], [0, 1]])
  np.testing.assert_array_equal(y, [1.0, 0.0, np.nan])
  scores = linear.step_scores(lambda xq: xq[:, 0] / 10, [a, b])
  np.testing.assert_allclose(scores, [0.1, 0.5, 0.7, 0.0])


# ------------------------------------------------------------------------------------------------ annotators

ANNOT = dataclasses.replace(
  TINY,
  train_problems=2,
  val_problems=1,
  test_problems=1,
  feature_sets=("hidden",),
  trajectories=TrajectoryConfig(samples=2, max_new_tokens=24, batch_size=16),
)


def _short_prompts():
  from reprobe_jax.annotate import JudgePrompts

  return JudgePrompts(
    critique="C {problem} | {reference} | {steps}",
    verdict="V {critique} n={num_steps}",
    step="S {problem} | {previous} | {step_number}: {step}",
  )


@pytest.fixture(scope="module")
def sampled(lm, tmp_path_factory):
  """A tiny rule-labelled run; the other annotators' runs reuse its samples (their sample stage is skipped)."""
  folder = tmp_path_factory.mktemp("rule")
  trajs = pipeline.labelled_trajectories(lm, ANNOT, str(folder))
  assert sum(len(t.steps) for ts in trajs for t in ts) > 0  # something for the annotators to label
  return folder, trajs


def _reuse_samples(src, dst):
  os.makedirs(dst, exist_ok=True)
  for split in ("train", "val", "test"):  # each with its seal: a stage's file counts only with it
    for name in (f"samples_{split}.jsonl", f"samples_{split}.jsonl.sha256"):
      shutil.copy(src / name, dst / name)


def _expect(trajs, label_of_step):
  """{id: labels} where step k of a trajectory is label_of_step(k), and unknown where it has no tokens."""
  return {t.id: [label_of_step(k) if s.has_tokens else None for k, s in enumerate(t.steps)] for ts in trajs for t in ts}


def _labels(trajs):
  return {t.id: labels_to_json(t.labels) for ts in trajs for t in ts}


def test_rule_annotator_writes_samples_then_labelled_trajectories(sampled):
  folder, trajs = sampled
  samples = read_trajectories(folder / "samples_test.jsonl")
  assert [t.id for t in samples] == [t.id for t in trajs.test] and all(t.labels is None for t in samples)
  assert all(t.annotator == "rule" and set(t.extra) == {"answer", "correct"} for t in trajs.test)
  assert {"sample_train", "sample_val", "sample_test", "annotate"} <= set(
    json.loads((folder / "timings.json").read_text())
  )


def test_judge_annotator_over_http(lm, sampled, tmp_path, monkeypatch):
  """annotator='judge' posts both stages to the configured server with the key from the named variable."""
  from reprobe_jax.annotate import JudgeAPI, JudgeSettings
  from test_annotate import chat_server

  src, rule = sampled
  _reuse_samples(src, tmp_path)

  def reply(prompt):  # stage 1: a critique; stage 2: step k judged correct (1) when k is odd
    if prompt.startswith("C "):
      return "a critique"
    return str([k % 2 for k in range(int(re.search(r"n=(\d+)$", prompt).group(1)))])

  monkeypatch.setenv("STUB_JUDGE_KEY", "secret")
  events = []
  with chat_server(reply) as (url, seen):
    cfg = dataclasses.replace(
      ANNOT,
      annotator="judge",
      judge=JudgeSettings(
        prompts=_short_prompts(),
        api=JudgeAPI(base_url=url, model="stub", api_key_env="STUB_JUDGE_KEY", timeout=5, retries=1),
      ),
    )
    out = pipeline.labelled_trajectories(lm, cfg, str(tmp_path), progress=lambda *e: events.append(e[0].split()[0]))
  assert set(events) == {"annotate"}  # the samples were reused, not drawn again
  judged = [t for ts in rule for t in ts if t.steps]
  assert len(seen["requests"]) == 2 * len(judged) and set(seen["auth"]) == {"Bearer secret"}
  assert _labels(out) == _expect(out, lambda k: 1.0 if k % 2 == 0 else 0.0)
  assert {t.annotator for ts in out for t in ts} == {"judge:openai:stub"}


def test_self_annotator_wiring_with_a_random_target(lm, sampled, tmp_path):
  """annotator='self': the target judges its own steps; a random model's replies hold no verdict list, so every
  step is unknown (NaN), none made up."""
  from reprobe_jax.annotate import JudgeSettings, SelfJudgeSampling

  src, _ = sampled
  _reuse_samples(src, tmp_path)
  cfg = dataclasses.replace(
    ANNOT,
    annotator="self",
    judge=JudgeSettings(prompts=_short_prompts(), self_judge=SelfJudgeSampling(max_new_tokens=4, batch_size=32)),
  )
  out = pipeline.labelled_trajectories(lm, cfg, str(tmp_path))
  every = [t for ts in out for t in ts]
  assert {t.annotator for t in every} == {"judge:self"}
  assert all(len(t.labels) == len(t.steps) and np.isnan(t.label_array()).all() for t in every)
  assert any(t.steps for t in every)
  # A judge reply as long as the target's context cannot fit a prompt: refused before anything is sampled.
  from reprobe_jax.errors import ConfigError

  long = dataclasses.replace(
    cfg,
    judge=dataclasses.replace(
      cfg.judge, self_judge=SelfJudgeSampling(max_new_tokens=lm.config.max_position_embeddings)
    ),
  )
  with pytest.raises(ConfigError, match="config.judge.self_judge.max_new_tokens"):
    pipeline.labelled_trajectories(lm, long, str(tmp_path / "long"), progress=lambda *e: pytest.fail(f"{e} started"))


def test_import_annotator_reads_the_labels_file_strictly(lm, sampled, tmp_path):
  from reprobe_jax.errors import DataFormatError

  src, rule = sampled
  every = [t for ts in rule for t in ts]
  path = tmp_path / "labels.jsonl"
  lines = [json.dumps({"id": t.id, "ratings": [-1 if k == 0 else 1 for k in range(len(t.steps))]}) for t in every]
  path.write_text("\n".join(lines) + "\n")
  _reuse_samples(src, tmp_path / "run")
  cfg = dataclasses.replace(ANNOT, annotator="import", labels_path=str(path))
  out = pipeline.labelled_trajectories(lm, cfg, str(tmp_path / "run"))
  assert _labels(out) == _expect(out, lambda k: 1.0 if k == 0 else 0.0)
  assert {t.annotator for ts in out for t in ts} == {"import:ratings"}
  # A file that misses a trajectory is refused (strict), naming the file.
  path.write_text("\n".join(lines[1:]) + "\n")
  _reuse_samples(src, tmp_path / "short")
  with pytest.raises(DataFormatError, match=r"labels\.jsonl: 1 of \d+ trajectories have no labels"):
    pipeline.labelled_trajectories(lm, cfg, str(tmp_path / "short"))


def test_annotator_settings_key_the_run_folder_only_where_they_decide_labels(lm, tmp_path):
  from reprobe_jax.annotate import JudgeAPI, JudgeSettings

  folder = lambda cfg: run_folder(str(tmp_path), lm, cfg)  # noqa: E731
  rule = folder(ANNOT)
  assert folder(dataclasses.replace(ANNOT, judge=JudgeSettings(prompts=_short_prompts()))) == rule
  own = dataclasses.replace(ANNOT, annotator="self", judge=JudgeSettings(prompts=_short_prompts()))
  assert folder(own) != rule
  assert folder(dataclasses.replace(own, judge=dataclasses.replace(own.judge, api=JudgeAPI(model="x")))) == folder(own)
  other_prompt = dataclasses.replace(own.judge.prompts, step="T {step}")
  assert folder(dataclasses.replace(own, judge=dataclasses.replace(own.judge, prompts=other_prompt))) != folder(own)
  api = dataclasses.replace(own, annotator="judge", judge=dataclasses.replace(own.judge, api=JudgeAPI(model="a")))
  assert folder(api) not in (rule, folder(own))
  assert folder(dataclasses.replace(api, judge=dataclasses.replace(api.judge, api=JudgeAPI(model="b")))) != folder(api)
  assert folder(
    dataclasses.replace(api, judge=dataclasses.replace(api.judge, api=JudgeAPI(model="a", api_key_env="OTHER")))
  ) == folder(api)  # the key is no part of the result
  a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
  a.write_text('{"id": "x", "labels": [0]}\n')
  b.write_text('{"id": "x", "labels": [1]}\n')
  imported = dataclasses.replace(ANNOT, annotator="import", labels_path=str(a))
  assert folder(imported) != folder(dataclasses.replace(imported, labels_path=str(b)))  # keyed by content
  (tmp_path / "c.jsonl").write_text(a.read_text())
  assert folder(imported) == folder(dataclasses.replace(imported, labels_path=str(tmp_path / "c.jsonl")))


def test_annotator_config_is_checked_before_any_work(monkeypatch, tmp_path):
  from configs import judge_prompts, reprobe_synthetic
  from reprobe_jax.jobs import cli
  from reprobe_jax.errors import ConfigError

  c = reprobe_synthetic.get_config()
  c.annotator = "self"
  cfg = config_from_dict(c)
  assert cfg.judge.prompts.critique == judge_prompts.CRITIQUE and cfg.judge.self_judge.sampling.top_k == 20
  assert cfg.judge.per_step is None and cfg.judge.api.api_key_env == "OPENAI_API_KEY"
  cases = [
    ({"annotator": "judgee"}, "config.annotator must be one of rule, self, judge, import"),
    ({"annotator": "judge"}, "config.judge.api.model is empty"),
    (
      {"annotator": "judge", "judge.api.model": "m", "judge.api.base_url": "localhost:8000"},
      "config.judge.api.base_url must start with http",
    ),
    ({"annotator": "self", "judge.self_judge.max_new_tokens": 0}, "config.judge.self_judge.max_new_tokens"),
    ({"annotator": "import"}, "config.labels_path is empty"),
    ({"annotator": "import", "labels_path": str(tmp_path / "none.jsonl")}, "config.labels_path: no file"),
    ({"judge.prompts.critique": "{nope}"}, "JudgePrompts.critique uses unknown field"),
  ]
  for changes, match in cases:
    c = reprobe_synthetic.get_config()
    for key, value in changes.items():
      *parents, name = key.split(".")
      node = c
      for p in parents:
        node = node[p]
      node[name] = value
    with pytest.raises(ConfigError, match=match):
      config_from_dict(c)
  with pytest.raises(ConfigError, match="config.judge.prompts"):
    ReprobeConfig(annotator="self")
  # The CLI checks the config before it builds (or loads) the target.
  monkeypatch.setattr(cli, "build_target", lambda config: pytest.fail("the target was built"))
  c = reprobe_synthetic.get_config()
  c.annotator = "nope"
  with pytest.raises(ConfigError, match="config.annotator"):
    cli.reprobe_setup(c)


def test_ood_difficulties_pick_the_held_out_domains_test_problems_only(lm, tmp_path):
  from reprobe_jax.errors import ConfigError

  mixed = dataclasses.replace(TINY, difficulties=(1, 2, 3), test_problems=6)
  easy = dataclasses.replace(mixed, ood_difficulties=(1,))
  diff = lambda ps: sorted(int(p.id.split("-")[1][1:]) for p in ps)  # noqa: E731  ids: {family}-d{k}-s{seed}-{i}
  a, b = split_problems(mixed), split_problems(easy)
  assert a.train == b.train and a.val == b.val  # the probes' data does not change
  for domain in mixed.train_domains:  # in domain: every difficulty, the same problems
    assert [p for p in a.test if p.domain == domain] == [p for p in b.test if p.domain == domain]
  for domain in mixed.ood_domains:
    assert diff(p for p in a.test if p.domain == domain) == [1, 1, 2, 2, 3, 3]
    held = [p for p in b.test if p.domain == domain]
    assert diff(held) == [1] * 6 and held == make_problems(domain, 6, SPLIT_SEEDS["test"], 1)
  folder = lambda cfg: run_folder(str(tmp_path), lm, cfg)  # noqa: E731
  assert folder(easy) != folder(mixed)
  # Unset, or equal to `difficulties`, it is the same problems and the folder they had before the option existed.
  assert folder(dataclasses.replace(mixed, ood_difficulties=(1, 2, 3))) == folder(mixed)
  with pytest.raises(ConfigError, match="ood_difficulties"):
    dataclasses.replace(mixed, ood_difficulties=(0,))
