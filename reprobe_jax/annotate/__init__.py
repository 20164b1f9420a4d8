"""Step labels for trajectory records (docs/method.md §A2): rule-based, LLM judge (self-annotation or an API), imported.

Every annotator takes trajectory records (`reprobe_jax.trajectories.Trajectory`, or dicts in its JSONL schema) and
returns new records of the same kind (the inputs are not changed; nested values such as `steps` are shared, not
copied) with these fields set:
  labels: one per step, 1.0 = incorrect, 0.0 = correct, unknown = NaN in a Trajectory, None in a dict (JSON has no
    NaN). A step with no tokens (end <= start) is always unknown: no feature can be read for it.
  first_error: index of the first step the annotator found incorrect (ProcessBench style), or None. It is taken
    before steps with no tokens are set unknown, so it describes the text, not what can be trained on.
  annotator: who labelled ('rule', 'judge:<backend>', 'import:<format>').
`annotate` picks the annotator a job's config names (`select`).
"""

from __future__ import annotations

from reprobe_jax.annotate.importer import import_labels
from reprobe_jax.annotate.judge import (
  JudgeBackendError,
  JudgePrompts,
  OpenAICompatibleJudge,
  SelfJudge,
  annotate_judge,
  parse_verdict,
  parse_verdict_list,
  reference_solution,
)
from reprobe_jax.annotate.records import as_trajectory, has_tokens, label_array, labelled, record_id, record_steps
from reprobe_jax.annotate.rule import annotate_rule
from reprobe_jax.annotate.select import (
  ANNOTATORS,
  JudgeAPI,
  JudgeSettings,
  SelfJudgeSampling,
  annotate,
  annotator_key,
  check_annotator,
)

__all__ = [
  "ANNOTATORS",
  "JudgeAPI",
  "JudgeBackendError",
  "JudgePrompts",
  "JudgeSettings",
  "OpenAICompatibleJudge",
  "SelfJudge",
  "SelfJudgeSampling",
  "annotate",
  "annotate_judge",
  "annotate_rule",
  "annotator_key",
  "as_trajectory",
  "check_annotator",
  "has_tokens",
  "import_labels",
  "label_array",
  "labelled",
  "parse_verdict",
  "parse_verdict_list",
  "record_id",
  "record_steps",
  "reference_solution",
]
