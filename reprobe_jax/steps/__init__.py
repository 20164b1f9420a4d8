"""What a step is (docs/method.md §A1), in one package.

- `modes`: the boundary modes (line, sentence, paragraph, regex), the response formats and the boundary mode each
  is aligned with (`STEP_MODE`), the think tags.
- `segment`: the readable character-level definition of each mode (`segment`: the reference the automaton is
  tested against).
- `tokens`: the byte model of a tokenizer's vocabulary (`token_bytes`), exact token end offsets, checked token ids.
- `machines` and `automaton`: each mode as a byte automaton, and the one compiler that runs a byte automaton over a
  vocabulary into a token-level table.
- `boundary`: `StepBoundary` (compiled into the sampler's `StopTable`, whose `advance` the model's decode loop
  runs as data) and `align`, exact token spans of the same automaton.
- `answer`: the answer-line table a step-level search finishes rows with, made by the same compiler.
- `spans`: `align`'s exact spans of many rows on device, from the same automaton (`step_spans`).
- `labels`: the step label encoding.
"""

from reprobe_jax.steps.answer import ANSWER_PREFIX, answer_lines, answer_table
from reprobe_jax.steps.automaton import ENDS_AFTER, ENDS_BEFORE
from reprobe_jax.steps.boundary import Step, StepBoundary, StopTable, advance, align, initial_state
from reprobe_jax.steps.labels import labels_from_json, labels_to_json
from reprobe_jax.steps.modes import (
  ABBREVIATIONS,
  HEADER_WORDS,
  MODES,
  RESPONSE_FORMATS,
  SENTENCE_ENDS,
  STEP_MODE,
  THINK_CLOSE,
  THINK_OPEN,
  WHITESPACE,
  regex_literals,
)
from reprobe_jax.steps.spans import AlignTable, StepSpans, align_table, step_spans
from reprobe_jax.steps.segment import Region, line_regions, paragraph_regions, regex_regions, segment, sentence_regions
from reprobe_jax.steps.tokens import (
  TokenBytes,
  byte_ends,
  char_offsets,
  check_text,
  token_bytes,
  token_end_offsets,
  token_ids,
)
