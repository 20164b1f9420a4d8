"""The LLM judge of docs/method.md §A2(b): prompt templates and sampling settings.

    prompts = JudgePrompts.from_dict(get_config().prompts.to_dict())   # reprobe_jax.annotate.judge

The reprobe configs carry this as `config.judge` (`reprobe_jax.annotate.JudgeSettings`), read when
`config.annotator` is 'self' or 'judge'.

Templates are str.format strings with named fields (a literal brace is written '{{' or '}}'):
  critique (stage 1): {problem} {reference} {steps} {num_steps}
  verdict (stage 2):  the same plus {critique}
  step (thinking mode, one call per step): {problem} {reference} {previous} {step} {step_number}
In the judge's replies 1 = correct and 0 = incorrect; the annotator maps them to labels 0 and 1.
"""

import ml_collections

CRITIQUE = """You are a careful teacher checking a student's solution one step at a time.

Problem:
{problem}

Reference solution:
{reference}

Student solution ({num_steps} steps):
{steps}

For each student step, in order, write "Step k:" and a short critique saying whether the step is correct. Judge \
each step on its own: it is correct when it follows validly from the problem and the student's previous steps as \
written (the right operation, in the right order, applied to the previous written result, computed correctly). A \
step that correctly builds on an earlier wrong result is still correct. A step with a calculation error, a wrong, \
skipped or invented operation or fact is incorrect. A final answer that differs from the reference answer is \
incorrect. Do not rewrite the solution."""

VERDICT = """Problem:
{problem}

Student solution ({num_steps} steps):
{steps}

Your critique of each step:
{critique}

Turn your critique into a Python list of {num_steps} integers, one per student step in order: 1 if the step is \
correct, 0 if it is incorrect. Reply with the list only."""

STEP = """You are a careful teacher checking a student's reasoning one step at a time.

Problem:
{problem}

Reference solution:
{reference}

The student's previous steps:
{previous}

New step {step_number}:
{step}

Is the new step correct, given the problem and the previous steps as written? A step that correctly builds on an \
earlier wrong result is correct. A step that repeats or re-checks earlier work and gets it right is redundant, and \
redundant steps count as correct. Think briefly, then end your reply with a single digit on its own line: 1 if the \
new step is correct, 0 if it is incorrect."""


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.prompts = ml_collections.ConfigDict(dict(critique=CRITIQUE, verdict=VERDICT, step=STEP, no_previous="(none)"))
  # Self-annotation through our sampler (paper: T=0.7, top-k 20, top-p 0.95).
  c.self_judge = ml_collections.ConfigDict(
    dict(sampling=dict(temperature=0.7, top_k=20, top_p=0.95), max_new_tokens=1024, batch_size=8, seed=0)
  )
  # An OpenAI-compatible server (vLLM, SGLang, llama.cpp, a hosted API). The key is read from the environment
  # variable named here (none is sent when it is unset), so it is in no config file or shell history.
  c.api = ml_collections.ConfigDict(
    dict(
      base_url="http://127.0.0.1:8000/v1",
      model="",
      temperature=0.7,
      top_p=0.95,
      max_tokens=4096,
      timeout=120.0,
      retries=3,
      max_workers=4,
      api_key_env="OPENAI_API_KEY",
    )
  )
  # None: per record mode (thinking -> one call per step); True / False force a variant.
  c.per_step = ml_collections.FieldReference(None, field_type=bool)
  return c
