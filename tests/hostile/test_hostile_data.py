"""Hostile data: trajectory records, problems, imported labels, rule labelling, the feature store, feature
specs, probe bundles and step alignment. Each case: the input, the exact error class, a message naming the file /
record and the field; fuzzers check that nothing but a ReprobeError escapes and that what is accepted is right."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from test_boundary import lossy_text
from test_steps import get_tokenizer  # noqa: F401 (tokenizers of the step tests)

from reprobe_jax import steps as S
from reprobe_jax.annotate import annotate_rule, import_labels
from reprobe_jax.errors import CacheFullError, CheckpointError, ConfigError, DataFormatError, ReprobeError
from reprobe_jax.features import FeatureMismatchError, FeatureSpec, FeatureStore, extract
from reprobe_jax.features import extraction as X
from reprobe_jax.models import LanguageModel, ModelConfig
from reprobe_jax.probe.data import Example, collate
from reprobe_jax.tasks import get_family, make_problems
from reprobe_jax.tasks.io import read_problems
from reprobe_jax.trajectories import Trajectory, read_trajectories

BIG = "9" * 5000  # past Python's 4300-digit int-string limit
RECORD = {
  "id": "a#0",
  "problem_id": "p",
  "domain": "arithmetic",
  "mode": "line",
  "sample": 0,
  "prompt_ids": [1, 5, 9],
  "response_ids": [4, 8, 15, 16],
  "response": "x",
  "finish_reason": "eos",
  "logprobs": [-0.5, -1.0, 0.0, -2.0],
  "entropy": [0.5, 1.0, 0.0, 0.1],
  "self_certainty": [1.0, 2.0, 3.0, 4.0],
  "steps": [{"text": "a", "start": 0, "end": 3}, {"text": "b", "start": 3, "end": 4}],
  "labels": [0.0, None],
  "first_error": None,
  "annotator": "rule",
}


def _write_lines(path, lines):
  path.write_bytes(b"".join((ln if isinstance(ln, bytes) else ln.encode()) + b"\n" for ln in lines))
  return path


# ------------------------------------------------------------------------------------------------ trajectories


@pytest.mark.parametrize(
  "change,match",
  [
    ({"response_ids": None}, "missing field 'response_ids'"),
    ({"prompt_ids": []}, "field 'prompt_ids' must be a non-empty list"),
    ({"response_ids": [4, -8, 15, 16]}, "field 'response_ids' must be a list of integers >= 0"),
    ({"prompt_ids": [1, True]}, "field 'prompt_ids' must be a non-empty list of integers"),
    ({"logprobs": [0.0, 0.0, 0.0]}, "field 'logprobs' has 3 values for 4 response tokens"),
    ({"mode": "prose"}, "field 'mode' must be one of line, thinking"),
    ({"sample": -1}, "field 'sample' must be an integer >= 0"),
    ({"steps": [{"text": "a", "start": 0, "end": 9}]}, r"steps\[0\] spans tokens \[0, 9\), past the response's 4"),
    (
      {"steps": [{"text": "a", "start": 2, "end": 4}, {"text": "b", "start": 1, "end": 3}]},
      r"steps\[1\] spans tokens \[1, 3\); spans must be ordered",
    ),
    ({"steps": [{"text": "a", "start": 3, "end": 1}], "labels": [0]}, r"steps\[0\] spans tokens \[3, 1\)"),
    ({"labels": [0.5, None]}, "field 'labels' must be a list of numbers or nulls, each 0"),
    ({"labels": [2, 0]}, "field 'labels' must be a list of numbers or nulls, each 0"),
    ({"first_error": 2}, r"field 'first_error' must be an integer or null, a step index in 0\.\.1"),
  ],
)
def test_bad_trajectory_field_is_named(tmp_path, change, match):
  bad = dict(RECORD, id="t1")
  for k, v in change.items():
    if v is None:
      del bad[k]
    else:
      bad[k] = v
  path = _write_lines(tmp_path / "t.jsonl", [json.dumps(RECORD), json.dumps(bad)])
  with pytest.raises(DataFormatError, match=rf"t\.jsonl:2: trajectory 't1': {match}"):
    read_trajectories(path)


def test_trajectory_file_non_utf8_nan_and_big_int(tmp_path):
  line = json.dumps(RECORD).encode()
  with pytest.raises(DataFormatError, match=r"t\.jsonl:2: JSONL file is not UTF-8 text"):
    read_trajectories(_write_lines(tmp_path / "t.jsonl", [line, line.replace(b'"x"', b'"\xff"')]))
  nan = json.dumps(dict(RECORD, id="n")).replace("[0.5, 1.0, 0.0, 0.1]", "[NaN, 1.0, 0.0, 0.1]")
  with pytest.raises(
    DataFormatError,
    match=r"t\.jsonl:1: trajectory 'n': field 'entropy' must be a list of numbers, "
    "each finite",
  ):
    read_trajectories(_write_lines(tmp_path / "t.jsonl", [nan]))
  big = json.dumps(RECORD).replace("[4, 8, 15, 16]", f"[4, 8, 15, {BIG}]")
  with pytest.raises(DataFormatError, match=r"t\.jsonl:1: unreadable JSON"):
    read_trajectories(_write_lines(tmp_path / "t.jsonl", [big]))


def _json_values():
  leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 20), st.floats(allow_nan=False, width=16), st.text(max_size=4)
  )
  return st.recursive(
    leaf,
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=5), c, max_size=3)),
    max_leaves=8,
  )


FIELDS = list(RECORD) + ["extra"]


def _mutate(record: dict, draw) -> dict:
  out = copy.deepcopy(record)
  for _ in range(draw(st.integers(1, 3))):
    key = draw(st.sampled_from(FIELDS))
    how = draw(st.sampled_from(["delete", "replace", "inner"]))
    if how == "delete":
      out.pop(key, None)
    elif how == "inner" and isinstance(out.get(key), list) and out[key]:
      i = draw(st.integers(0, len(out[key]) - 1))
      if isinstance(out[key][i], dict):
        out[key][i][draw(st.sampled_from(["text", "start", "end"]))] = draw(_json_values())
      else:
        out[key][i] = draw(_json_values())
    else:
      out[key] = draw(_json_values())
  return out


def _check_trajectory(t: Trajectory) -> None:
  """What every accepted trajectory satisfies."""
  assert t.id and all(type(i) is int and i >= 0 for i in t.prompt_ids + t.response_ids)
  prev = 0
  for s in t.steps:
    assert prev <= s.start <= s.end <= len(t.response_ids)
    prev = s.end
  for stats in (t.logprobs, t.entropy, t.self_certainty):
    assert len(stats) == len(t.response_ids) and all(math.isfinite(v) for v in stats)
  if t.labels is not None:
    assert len(t.labels) == len(t.steps) and all(math.isnan(v) or v in (0.0, 1.0) for v in t.labels)
  assert t.first_error is None or 0 <= t.first_error < len(t.steps)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_read_trajectories(tmp_path, data):
  rec = _mutate(RECORD, data.draw)
  path = tmp_path / "f.jsonl"
  path.write_text(json.dumps(rec) + "\n")
  try:
    (t,) = read_trajectories(path)
  except DataFormatError as e:
    assert "f.jsonl:1: " in str(e)
    return
  _check_trajectory(t)
  again = Trajectory.from_json(json.loads(json.dumps(t.to_json())))
  assert again.to_json() == t.to_json()


# ------------------------------------------------------------------------------------------------ problems, rules


def _problem(domain):
  return make_problems(domain, 1, 0, 1)[0]


def test_problem_numbers_past_the_int_limit_are_named(tmp_path):
  arith = _problem("arithmetic").to_json()
  cases = [
    (dict(arith, answer=BIG), r"p\.jsonl:1: arithmetic data: answer '9{57}\.\.\.' does not match"),
    (dict(_problem("planning").to_json(), answer=BIG), r"p\.jsonl:1: planning data: answer"),
    (
      dict(arith, data={**arith["data"], "start": 10**4000, "ops": [["*", 10**4000]]}),
      r"p\.jsonl:1: arithmetic data: the chain's value after ops\[0\] has more than 4300 digits",
    ),
    (dict(arith, data={**arith["data"], "ops": [["+", -3]]}), r"p\.jsonl:1: arithmetic data: ops\[0\] must be"),
    (
      dict(_problem("qa").to_json(), data={**_problem("qa").data, "relations": ["Boss"]}),
      r"p\.jsonl:1: qa data: 'relations' must be a non-empty list of lower-case words",
    ),
  ]
  for record, match in cases:
    with pytest.raises(DataFormatError, match=match):
      read_problems(_write_lines(tmp_path / "p.jsonl", [json.dumps(record)]))
  big = json.dumps(arith).replace('"start": ', f'"start": {BIG}, "x": ')
  with pytest.raises(DataFormatError, match=r"p\.jsonl:1: unreadable JSON"):
    read_problems(_write_lines(tmp_path / "p.jsonl", [big]))
  with pytest.raises(DataFormatError, match=r"p\.jsonl:1: JSONL file is not UTF-8"):
    read_problems(_write_lines(tmp_path / "p.jsonl", [json.dumps(arith).encode().replace(b"Start", b"\xc3(tart")]))


def test_rule_labels_a_step_with_a_number_past_the_int_limit():
  p = _problem("arithmetic")
  ref = get_family("arithmetic").reference_steps(p)
  texts = [f"- Step 1: 3 + 4 = {BIG}"] + [f"- Step {k}: {b}" for k, b in enumerate(ref, 2)] + [f"<Answer>: {BIG}"]
  rec = {
    "id": "r",
    "problem_id": p.id,
    "mode": "line",
    "steps": [{"text": t, "start": k, "end": k + 1} for k, t in enumerate(texts)],
  }
  (out,) = annotate_rule([rec], {p.id: p})
  # The long step is unreadable (unknown); the reference steps after it are right; the long answer is wrong.
  assert out["labels"] == [None] + [0.0] * len(ref) + [1.0] and out["correct"] is False
  para = "".join(f"Step {k}: {b}.\n\n" for k, b in enumerate([f"{BIG} + 1 = {BIG}"] + ref, 1))
  think = {
    "id": "t",
    "problem_id": p.id,
    "mode": "thinking",
    "response": f"<think>\n{para}</think>\n\\boxed{{{BIG}}}",
    "steps": [
      {"text": f"Step {k}: {b}.", "start": k, "end": k + 1} for k, b in enumerate([f"{BIG} + 1 = {BIG}"] + ref)
    ],
  }
  (out,) = annotate_rule([think], {p.id: p})
  assert out["correct"] is False and all(v in (None, 0.0, 1.0) for v in out["labels"])
  plan = _problem("planning")
  rec = {
    "id": "q",
    "problem_id": plan.id,
    "mode": "line",
    "steps": [{"text": f"<Answer>: {BIG}", "start": 0, "end": 1}],
  }
  assert annotate_rule([rec], {plan.id: plan})[0]["labels"] == [1.0]


def _problem_values(draw, problem):
  rec = problem.to_json()
  for _ in range(draw(st.integers(1, 2))):
    where = draw(st.sampled_from(["top", "data"]))
    target = rec["data"] if where == "data" and isinstance(rec.get("data"), dict) else rec
    key = draw(st.sampled_from(sorted(target) + ["x"]))
    if draw(st.booleans()):
      target.pop(key, None)
    elif isinstance(target.get(key), list) and target[key] and draw(st.booleans()):
      target[key][draw(st.integers(0, len(target[key]) - 1))] = draw(
        st.one_of(_json_values(), st.sampled_from(["+", "-", "*"]))
      )
    else:
      target[key] = draw(st.one_of(_json_values(), st.integers(-(10**6), 10**6), st.just(BIG)))
  return rec


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_read_problems(tmp_path, data):
  domain = data.draw(st.sampled_from(["arithmetic", "planning", "qa"]))
  rec = _problem_values(data.draw, make_problems(domain, 1, data.draw(st.integers(0, 50)), 1)[0])
  path = tmp_path / "p.jsonl"
  path.write_text(json.dumps(rec) + "\n")
  try:
    (p,) = read_problems(path)
  except DataFormatError as e:
    assert "p.jsonl:1: " in str(e)
    return
  family = get_family(p.domain)  # an accepted problem is one the checker can check: its reference is right
  ref = family.reference_steps(p)
  assert family.check_steps(p, ref) == [0.0] * len(ref)
  assert family.check_answer(p, p.answer)


# ------------------------------------------------------------------------------------------------ imported labels


def _traj_records():
  return [{"id": f"t{i}", "steps": [{"text": "s", "start": k, "end": k + 1} for k in range(3)]} for i in range(2)]


def test_imported_labels_bad_bytes_values_and_big_ints(tmp_path):
  recs = _traj_records()
  cases = [
    (
      [b'{"id": "t0", "labels": [0, 1, 0]}', b'{"id": "t1", "labels": [0, 1, "\xff"]}'],
      r"l\.jsonl:2: JSONL file is not UTF-8",
    ),
    (['{"id": "t0", "labels": [0, 2, 0]}'], r"l\.jsonl:1: labels\[1\] must be one of \[0, 1\] or null"),
    (['{"id": "t0", "first_error": ' + BIG + "}"], r"l\.jsonl:1: unreadable JSON"),
    (['{"id": "t0", "ratings": [1, 0]}'], r"l\.jsonl:1: trajectory 't0' has 3 steps but 'ratings' has 2"),
  ]
  for lines, match in cases:
    with pytest.raises(DataFormatError, match=match):
      import_labels(recs, _write_lines(tmp_path / "l.jsonl", lines))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_import_labels(tmp_path, data):
  recs = _traj_records()
  lines = []
  for rid in ("t0", "t1"):
    entry = {"id": rid, "labels": [0, 1, None]}
    for _ in range(data.draw(st.integers(0, 2))):
      key = data.draw(st.sampled_from(["id", "labels", "first_error", "ratings"]))
      if data.draw(st.booleans()):
        entry.pop(key, None)
      else:
        entry[key] = data.draw(st.one_of(_json_values(), st.lists(st.sampled_from([-1, 0, 1, None, 2]), max_size=4)))
    lines.append(json.dumps(entry))
  path = _write_lines(tmp_path / "l.jsonl", lines)
  try:
    out = import_labels(recs, path, strict=data.draw(st.booleans()))
  except DataFormatError as e:
    assert "l.jsonl" in str(e)
    return
  for rec in out:
    assert len(rec["labels"]) == 3 and all(v in (None, 0.0, 1.0) for v in rec["labels"])
    assert rec["annotator"] in ("import:labels", "import:first_error", "import:ratings", "import:missing")


# ------------------------------------------------------------------------------------------------ feature store


@pytest.fixture(scope="module")
def lm(word_tokenizer):
  cfg = ModelConfig(
    family="llama",
    vocab_size=len(word_tokenizer),
    hidden_size=16,
    intermediate_size=32,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    max_position_embeddings=64,
    eos_token_ids=(2,),
    pad_token_id=0,
  )
  return LanguageModel.random(cfg, seed=0, tokenizer=word_tokenizer)


def _recs(n=5, seed=0):
  rng = np.random.RandomState(seed)
  return [
    Trajectory(
      f"r{i}",
      "",
      "",
      "line",
      (),
      prompt_ids=tuple(rng.randint(3, 90, rng.randint(2, 5)).tolist()),
      response_ids=tuple(rng.randint(3, 90, rng.randint(1, 6)).tolist()),
    )
    for i in range(n)
  ]


def _change(i, **fields):
  """Replaces record i of a list with a copy whose `fields` are changed."""
  return lambda recs: recs.__setitem__(i, dataclasses.replace(recs[i], **fields))


SPEC = FeatureSpec.from_name("hidden+logit", top_k=3)


@pytest.fixture(scope="module")
def store_dir(lm, tmp_path_factory):
  d = str(tmp_path_factory.mktemp("store") / "f")
  extract(lm, _recs(), SPEC, d, shard_size=2)
  return d


def _copy(store_dir, tmp_path, name="c"):
  d = str(tmp_path / name)
  shutil.copytree(store_dir, d)
  return d


def _all(store):
  return {tid: store[tid] for tid in store.ids}


@pytest.mark.parametrize(
  "change,error,match",
  [
    (
      _change(1, prompt_ids=()),
      DataFormatError,
      r"<record 1>: trajectory 'r1': field 'prompt_ids' must be a non-empty "
      "list",
    ),
    (
      _change(2, response_ids=(5, 101)),
      DataFormatError,
      r"trajectory 'r2': response_ids\[1\]: token id 101 is outside the vocabulary \[0, 101\)",
    ),
    (_change(0, response_ids=(5,) * 70), CacheFullError, r"trajectory 'r0': sequence of \d+ tokens exceeds"),
    (_change(3, id="r0"), DataFormatError, r"<record 3>: trajectory 'r0' is also record 0"),
    (_change(0, id=""), DataFormatError, r"<record 0>: trajectory: field 'id' must be a non-empty string"),
    (
      _change(1, response_ids=(5, -1)),
      DataFormatError,
      r"<record 1>: trajectory 'r1': field 'response_ids' must be "
      "a list of integers >= 0",
    ),
    (
      lambda r: r.__setitem__(2, r[2].to_json()),
      DataFormatError,
      r"<record 2>: expected a Trajectory record, found "
      "dict",
    ),
  ],
)
def test_bad_records_are_refused_before_anything_is_written(lm, tmp_path, change, error, match):
  recs = _recs()
  change(recs)
  with pytest.raises(error, match=match):
    extract(lm, recs, SPEC, str(tmp_path / "f"))
  assert not os.path.exists(tmp_path / "f")


def test_bad_job_settings_are_config_errors(lm, tmp_path):
  for kw, match in [
    ({"dtype": "int8"}, "dtype must be one of float32, float16"),
    ({"shard_size": 0}, "shard_size must be an integer >= 1"),
    ({"batch_size": 2.5}, "batch_size must be an integer >= 1"),
  ]:
    with pytest.raises(ConfigError, match=match):
      extract(lm, _recs(), SPEC, str(tmp_path / "f"), **kw)
  with pytest.raises(ConfigError, match="feature part 'logit': top_k=500 is more than the model's vocabulary of 101"):
    extract(lm, _recs(), FeatureSpec.from_name("logit", top_k=500), str(tmp_path / "f"))
  with pytest.raises(ConfigError, match="hidden_layers: index 9"):
    extract(lm, _recs(), FeatureSpec.from_name("hidden", hidden_layers=(9,)), str(tmp_path / "f"))
  recs = _recs(2)
  big = {r.id: np.full((len(r.response_ids), SPEC.dim(lm.config)), 1e6, np.float32) for r in recs}
  with pytest.raises(ConfigError, match="trajectory 'r0': its features reach 1e\\+06, past what float16 holds"):
    extract(lm, recs, SPEC, str(tmp_path / "g"), dtype="float16", captured=big)
  big["r0"][0, 0] = np.nan
  with pytest.raises(DataFormatError, match="trajectory 'r0': the model's features for it are not finite"):
    extract(lm, recs, SPEC, str(tmp_path / "g"), captured=big)
  assert not os.path.exists(tmp_path / "f")
  (tmp_path / "file").write_text("x")
  with pytest.raises(ConfigError, match="file: is a file, not a feature directory"):
    extract(lm, _recs(), SPEC, str(tmp_path / "file"))


@pytest.mark.parametrize(
  "kw,match",
  [
    ({"attn_window": 0}, "feature part 'attn': attn_window must be an integer >= 1, found 0"),
    ({"attn_window": -2}, "feature part 'attn': attn_window"),
    ({"attn_window": 2.5}, "feature part 'attn': attn_window"),
    ({"top_k": 0}, "feature part 'logit': top_k must be an integer >= 1, found 0"),
    ({"top_k": True}, "feature part 'logit': top_k"),
    ({"hidden_layers": ("1",)}, "feature part 'hidden': hidden_layers must be a sequence of layer indices"),
    ({"hidden_layers": ()}, "feature part 'hidden': hidden_layers is empty"),
    ({"parts": ("hidden", "hidden")}, "must be a non-empty subset of hidden, attn, logit"),
    ({"parts": "hidden"}, "must be a non-empty subset"),
  ],
)
def test_feature_spec_parts_are_checked_at_construction(kw, match):
  with pytest.raises(ConfigError, match=match):
    FeatureSpec(**{"parts": ("hidden", "attn", "logit"), **kw})


def _entry(d, k=0):
  m = json.loads(open(os.path.join(d, "manifest.json")).read())
  return m, m["shards"][k]


def _write_manifest(d, m):
  with open(os.path.join(d, "manifest.json"), "w") as f:
    json.dump(m, f)


@pytest.mark.parametrize("damage", ["zero", "truncate", "flip"])
def test_damaged_shard_is_refused_on_read_and_recomputed_on_resume(lm, store_dir, tmp_path, damage):
  want = _all(FeatureStore(store_dir))
  d = _copy(store_dir, tmp_path)
  path = os.path.join(d, "shard_00001.npz")
  data = open(path, "rb").read()
  data = {"zero": b"", "truncate": data[: len(data) // 2], "flip": data[:300] + bytes([data[300] ^ 1]) + data[301:]}
  open(path, "wb").write(data[damage])
  store = FeatureStore(d)
  with pytest.raises(DataFormatError, match=r"shard_00001\.npz: \d+ bytes whose sha256 .* is not the manifest's"):
    store["r2"]
  np.testing.assert_array_equal(store["r0"], want["r0"])  # the other shards are still served
  resumed = _all(extract(lm, _recs(), SPEC, d, shard_size=2))
  assert resumed.keys() == want.keys()
  for tid in want:
    np.testing.assert_array_equal(resumed[tid], want[tid])


def test_shard_from_another_store(lm, store_dir, tmp_path):
  other = LanguageModel.random(lm.config, seed=5, tokenizer=lm.tokenizer)
  foreign = str(tmp_path / "foreign")
  extract(other, _recs(), SPEC, foreign, shard_size=2)
  d = _copy(store_dir, tmp_path)
  shutil.copy(os.path.join(foreign, "shard_00000.npz"), os.path.join(d, "shard_00000.npz"))
  with pytest.raises(DataFormatError, match=r"shard_00000\.npz: .* is not the manifest's"):
    FeatureStore(d)["r0"]
  m, e = _entry(d)  # the manifest edited to the copied file's hash: the shard's own header names its model
  e["sha256"] = hashlib.sha256(open(os.path.join(d, "shard_00000.npz"), "rb").read()).hexdigest()
  _write_manifest(d, m)
  with pytest.raises(FeatureMismatchError, match=r"shard_00000\.npz: the shard was made with model_fingerprint="):
    FeatureStore(d)["r0"]
  with pytest.raises(FeatureMismatchError, match=r"shard_00000\.npz: the shard was made with model_fingerprint="):
    extract(lm, _recs(), SPEC, d, shard_size=2)


def test_ids_swapped_in_the_manifest_are_refused(store_dir, tmp_path):
  d = _copy(store_dir, tmp_path)
  m, _ = _entry(d)
  m["shards"][0]["ids"], m["shards"][1]["ids"] = m["shards"][1]["ids"], m["shards"][0]["ids"]
  m["shards"][0]["hashes"], m["shards"][1]["hashes"] = m["shards"][1]["hashes"], m["shards"][0]["hashes"]
  _write_manifest(d, m)
  with pytest.raises(FeatureMismatchError, match=r"shard_0000[01]\.npz: the shard's ids are not the 2"):
    FeatureStore(d)["r0"]


@pytest.mark.parametrize(
  "edit,match",
  [
    (lambda m: m["shards"][0].update(file="../shard_00000.npz"), r"shards\[0\]: field 'file' must be a file name"),
    (lambda m: m["shards"][0].update(file="/etc/passwd"), r"shards\[0\]: field 'file' must be a file name"),
    (lambda m: m["shards"][0].update(tokens="3"), r"shards\[0\]: field 'tokens' must be an integer >= 0"),
    (lambda m: m["shards"][1].pop("sha256"), r"shards\[1\]: missing field 'sha256'"),
    (
      lambda m: m["shards"][1].update(ids=m["shards"][0]["ids"]),
      r"shards\[1\]: trajectory 'r0' is also in shards\[0\]",
    ),
    (lambda m: m["shards"][1].update(file=m["shards"][0]["file"]), r"shards\[1\]: file 'shard_00000.npz' is listed"),
    (
      lambda m: m["shards"][0].update(hashes=[]),
      r"shards\[0\]: field 'hashes' must be a list of record hashes|"
      r"0 hashes for 2 ids",
    ),
    (lambda m: m.update(shards={}), r"field 'shards' must be a list"),
    (lambda m: m.update(feature_dim=True), r"field 'feature_dim' must be an integer >= 1"),
    (lambda m: m.update(spec={"parts": ["colour"]}), r"field 'spec' is not a feature spec"),
    (lambda m: m.pop("format"), r"format None version 2; this reader knows 'reprobe-features' version 2"),
    (lambda m: m.pop("tokenizer_hash"), r"missing field 'tokenizer_hash'"),
  ],
)
def test_hand_edited_manifest_is_named(lm, store_dir, tmp_path, edit, match):
  d = _copy(store_dir, tmp_path)
  m, _ = _entry(d)
  edit(m)
  _write_manifest(d, m)
  with pytest.raises(DataFormatError, match=r"manifest\.json: " + match):
    FeatureStore(d)
  with pytest.raises(DataFormatError, match=r"manifest\.json: " + match):
    extract(lm, _recs(), SPEC, d, shard_size=2)


def test_unreadable_manifest_is_named(store_dir, tmp_path):
  d = _copy(store_dir, tmp_path)
  for data, match in [
    (b"", r"manifest\.json:1: feature manifest is not valid JSON"),
    (b'{"format": "\xff"}', r"manifest\.json:1: feature manifest is not UTF-8"),
    (b"[]", r"manifest\.json: feature manifest must hold a JSON object"),
  ]:
    open(os.path.join(d, "manifest.json"), "wb").write(data)
    with pytest.raises(DataFormatError, match=match):
      FeatureStore(d)


def test_kill_between_shard_and_manifest_resumes_exactly(lm, store_dir, tmp_path, monkeypatch):
  want = _all(FeatureStore(store_dir))
  real = X._atomic_bytes
  writes = {"n": 0}

  def dies_on_second_manifest(path, data):
    if path.endswith("manifest.json"):
      writes["n"] += 1
      if writes["n"] == 2:
        raise KeyboardInterrupt
    real(path, data)

  monkeypatch.setattr(X, "_atomic_bytes", dies_on_second_manifest)
  d = str(tmp_path / "k")
  with pytest.raises(KeyboardInterrupt):
    extract(lm, _recs(), SPEC, d, shard_size=2)
  assert sorted(os.listdir(d)) == ["manifest.json", "shard_00000.npz", "shard_00001.npz"]  # shard 1 unlisted
  monkeypatch.setattr(X, "_atomic_bytes", real)
  resumed = _all(extract(lm, _recs(), SPEC, d, shard_size=2))
  assert resumed.keys() == want.keys()
  for tid in want:
    np.testing.assert_array_equal(resumed[tid], want[tid])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_shard_bytes(store_dir, tmp_path_factory, data):
  """Byte mutations and truncations of a shard, with the manifest's hash left (what a damaged disk does) or updated
  (a consistent hand edit, which reaches the archive parser): only typed errors; what is served has the right shape."""
  want = _all(FeatureStore(store_dir))
  d = _copy(store_dir, tmp_path_factory.mktemp("fz"))
  k = data.draw(st.integers(0, 2))
  m, e = _entry(d, k)
  path = os.path.join(d, e["file"])
  blob = bytearray(open(path, "rb").read())
  for _ in range(data.draw(st.integers(1, 4))):
    at = data.draw(st.integers(0, len(blob)))
    how = data.draw(st.sampled_from(["flip", "cut", "insert"]))
    if how == "flip" and at < len(blob):
      blob[at] ^= data.draw(st.integers(1, 255))
    elif how == "cut":
      del blob[at : at + data.draw(st.integers(1, 64))]
    else:
      blob[at:at] = data.draw(st.binary(min_size=1, max_size=8))
  open(path, "wb").write(bytes(blob))
  rehash = data.draw(st.booleans())
  if rehash:
    e["sha256"] = hashlib.sha256(bytes(blob)).hexdigest()
    _write_manifest(d, m)
  store = FeatureStore(d)
  for tid in e["ids"]:
    try:
      got = store[tid]
    except (DataFormatError, FeatureMismatchError) as err:
      assert e["file"] in str(err)
      continue
    assert got.shape == want[tid].shape and got.dtype == np.float32
    if not rehash:
      np.testing.assert_array_equal(got, want[tid])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_manifest(store_dir, tmp_path_factory, data):
  """Field edits and byte damage of the manifest: only typed errors; an accepted store serves the right features or
  a typed error for a shard."""
  want = _all(FeatureStore(store_dir))
  d = _copy(store_dir, tmp_path_factory.mktemp("fm"))
  m, _ = _entry(d)
  if data.draw(st.booleans()):
    target = m if data.draw(st.booleans()) else m["shards"][data.draw(st.integers(0, 2))]
    key = data.draw(st.sampled_from(sorted(target) + ["x"]))
    target[key] = data.draw(st.one_of(_json_values(), st.just("../shard_00000.npz"), st.just(-1)))
    _write_manifest(d, m)
  else:
    blob = bytearray(open(os.path.join(d, "manifest.json"), "rb").read())
    at = data.draw(st.integers(0, len(blob) - 1))
    blob[at] = data.draw(st.integers(0, 255))
    open(os.path.join(d, "manifest.json"), "wb").write(bytes(blob[: data.draw(st.integers(0, len(blob)))]))
  try:
    store = FeatureStore(d)
  except (DataFormatError, FeatureMismatchError) as err:
    assert "manifest.json" in str(err)
    return
  for tid in store.ids:
    try:
      got = store[tid]
    except (DataFormatError, FeatureMismatchError):
      continue
    np.testing.assert_array_equal(got, want[tid])


# ------------------------------------------------------------------------------------------------ probe bundle, data


def test_probe_bundle_config_json_is_read_with_names(tmp_path):
  from reprobe_jax.io import write_seal
  from reprobe_jax.probe import ProbeBundle, ProbeConfig, load_probe, save_probe
  from reprobe_jax.probe.train import new_probe

  cfg = ProbeConfig(feature_dim=8, d_model=8, n_heads=2, ff_dim=8)
  _, params, _ = new_probe(cfg, 0)
  save_probe(ProbeBundle.create(cfg, params, FeatureSpec()), str(tmp_path / "p"))
  path = tmp_path / "p" / "config.json"
  meta = json.loads(path.read_text())
  path.write_bytes(json.dumps(meta).encode().replace(b"reprobe-probe", b"reprobe-\xffprobe"))
  write_seal(path)  # sealed again: the checks behind the seal
  with pytest.raises(CheckpointError, match=r"config\.json:1: probe config is not UTF-8"):
    load_probe(str(tmp_path / "p"))
  for change, match in [
    ({"model_fingerprint": 7}, "'model_fingerprint' must be a string or null"),
    (
      {"features": {**meta["features"], "attn_window": 0}},
      "'features': feature part 'attn': attn_window must be an integer >= 1",
    ),
  ]:
    path.write_text(json.dumps({**meta, **change}))
    write_seal(path)
    with pytest.raises(CheckpointError, match=match):
      load_probe(str(tmp_path / "p"))


def test_collate_refuses_features_of_another_width():
  e = Example("x", "arithmetic", np.zeros((3, 5), np.float32), np.zeros((1, 2), np.int32), np.zeros(1, np.float32))
  with pytest.raises(DataFormatError, match=r"trajectory 'x': features of shape \[3, 5\], the probe reads"):
    collate([e], 2, 4)


# ------------------------------------------------------------------------------------------------ step alignment


@pytest.mark.parametrize(
  "ids,match",
  [
    ("abc", "token ids must be a sequence of integers, found str"),
    (5, "found int 5"),
    ([5, -1], r"ids\[1\] must be an integer in \[0, 4294967295\], found int -1"),
    ([2**40], r"ids\[0\]"),
    ([1.5], "found float 1.5"),
    ([True], "found bool True"),
    ([None], "found NoneType"),
    ([10**5000], r"ids\[0\] must be an integer .* found int \(too long to show\)"),
  ],
)
def test_align_refuses_what_is_no_token_id(word_tokenizer, ids, match):
  with pytest.raises(DataFormatError, match=match):
    S.align(word_tokenizer, ids, "line")


def test_align_offset_is_checked(word_tokenizer):
  with pytest.raises(ConfigError, match="offset must be an integer >= 0"):
    S.align(word_tokenizer, [5, 6], "line", offset=-1)


_PIECES = [
  "- Step 1: ",
  "3 + 4 = 7",
  ".",
  "\n",
  "\n\n",
  ".\n\n",
  " ",
  "<think>",
  "</think>",
  "Wait, ",
  "é",
  "€",
  "e.g. ",
  "3.14",
  "!",
  "? ",
  "<Answer>: 7",
  "Solution:",
  ";",
  "\t",
  "\r\n",
]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_fuzz_align(data):
  """Random texts (tokenised in random pieces, as a sampler produces them) and random ids: only typed errors, and the
  steps' spans are ordered, inside the sequence, and hold exactly the texts the readable definition segments."""
  tok = get_tokenizer(data.draw(st.sampled_from(["bpe", "sentencepiece"])))
  if data.draw(st.booleans()):
    pieces = data.draw(st.lists(st.sampled_from(_PIECES), max_size=14))
    ids = [i for p in pieces for i in tok(p, add_special_tokens=False)["input_ids"]]
  else:
    ids = data.draw(st.lists(st.integers(0, len(tok) + 3), max_size=16))
  mode = data.draw(st.sampled_from(["line", "sentence", "paragraph", "regex"]))
  pattern = data.draw(st.sampled_from([r"\n\n", r";|\.", r"Step"])) if mode == "regex" else None
  offset = data.draw(st.integers(0, 5))
  try:
    steps = S.align(tok, ids, mode, pattern=pattern, offset=offset)
  except ReprobeError:
    return
  text = tok.decode(ids)
  prev = offset
  for s in steps:
    assert prev <= s.start <= s.end <= offset + len(ids)
    assert text[s.char_start : s.char_end].strip(S.WHITESPACE) == s.text
    prev = s.end
  if text == lossy_text(tok, ids):  # else a SentencePiece byte run that is not UTF-8 (docs/method.md, A1)
    assert [s.text for s in steps] == [r[2] for r in S.segment(text, mode, pattern=pattern)]
