"""The text of the two response formats (docs/method.md §A1, §B1), rendered and read back, for every task.

Line mode:      "- Step 1: 12 + 5 = 17\\n- Step 2: ...\\n<Answer>: 36"
Thinking mode:  "<think>\\nStep 1: 12 + 5 = 17.\\n\\nStep 2: ...\\n\\n</think>\\n\\n**Final Answer**\\n\\\\boxed{36}"

In thinking mode every paragraph ends with ".\\n\\n" (the SPAE step boundary). A chat template that ends its
generation prompt with '<think>' (DeepSeek-R1-Distill and others) gives responses without the opening tag: they are
read as thinking from their first character. What a task makes of the steps (exact checks, answer equivalence) is
the task's (`tasks.base.Task`); these functions only cut the text.
"""

from __future__ import annotations

import re
from typing import Sequence

from reprobe_jax.steps import THINK_CLOSE, THINK_OPEN, paragraph_regions
from reprobe_jax.tasks.math_normalize import last_boxed

_LINE_STEP = re.compile(r"^\s*[-*]?\s*step\s*(\d+)\s*[:.]\s*(.*?)\s*$", re.IGNORECASE)
_LINE_ANSWER = re.compile(r"^\s*<answer>\s*:?\s*(.*?)\s*$", re.IGNORECASE)
_HEADER = re.compile(r"^\s*(reasoning steps|solution|steps)\s*:?\s*$", re.IGNORECASE)


# --- line mode ---------------------------------------------------------------------------------------------------


def render_line(steps: Sequence[str], answer: str | None) -> str:
  """'- Step k: body' per step, then '<Answer>: answer' (docs/method.md §A1 line mode)."""
  lines = [f"- Step {k}: {body}" for k, body in enumerate(steps, start=1)]
  if answer is not None:
    lines.append(f"<Answer>: {answer}")
  return "\n".join(lines)


def parse_line(text: str) -> tuple[list[str], str | None]:
  """(step bodies, answer or None) from line-mode text; tolerant of model output.

  Steps are the non-empty lines before the answer line (docs/method.md §A1); header lines are skipped; a 'Step k:'
  prefix is removed where present, and other lines are kept whole so the checker can label them (NaN if unparseable).
  Text after the answer line is ignored.
  """
  steps: list[str] = []
  for line in (text or "").splitlines():
    if not line.strip() or _HEADER.match(line):
      continue
    m = _LINE_ANSWER.match(line)
    if m:
      return steps, m.group(1)
    m = _LINE_STEP.match(line)
    steps.append(m.group(2) if m else line.strip().lstrip("-* ").strip())
  return steps, None


def is_answer_line(text: str) -> bool:
  """Whether a line-mode step (an aligned line, docs/method.md §A1) is the '<Answer>: X' line rather than a reasoning
  step."""
  return _LINE_ANSWER.match((text or "").strip()) is not None


# --- thinking mode -----------------------------------------------------------------------------------------------


def _with_period(paragraph: str) -> str:
  paragraph = paragraph.strip()
  return paragraph if paragraph.endswith(".") else paragraph + "."


# What opens the final answer; SPAE's probe appends it inside the thinking to ask for the answer so far (docs/method.md
# §B1).
ANSWER_OPENER = "**Final Answer**\n\\boxed{"


def render_thinking(paragraphs: Sequence[str], answer: str | None) -> str:
  """'<think>\\n' + paragraphs each ending in '.\\n\\n' + '</think>\\n\\n**Final Answer**\\n\\\\boxed{answer}'."""
  body = "".join(_with_period(p) + "\n\n" for p in paragraphs)
  tail = "" if answer is None else f"{ANSWER_OPENER}{answer}}}"
  return f"<think>\n{body}</think>\n\n{tail}"


def parse_thinking(text: str) -> tuple[list[str], str | None]:
  """(paragraphs, answer or None) from thinking-mode text; tolerant of model output.

  The paragraphs are the step module's (`steps.paragraph_regions`: each ends right after '.\\n\\n', the SPAE boundary
  of docs/method.md §A1/B1, before '</think>'; a '<think>' drops the unfinished paragraph before it), so they are the
  paragraphs whose ends the sampler stops at and SPAE probes, also in degenerate output such as a second '<think>'
  inside the thinking. Each keeps its final period; the unfinished rest before '</think>' (or the end) is kept as
  the last paragraph. Without '<think>' the text starts at the beginning; without '</think>' everything is thinking.
  The answer is the last \\boxed{...} after '</think>' (anywhere when '</think>' is missing).
  """
  text = text or ""
  regions = paragraph_regions(text)
  paragraphs = [r.text for r in regions]
  end = text.find(THINK_CLOSE)
  hi = len(text) if end < 0 else end
  opened = text.rfind(THINK_OPEN, 0, hi)
  lo = max(regions[-1].end if regions else 0, 0 if opened < 0 else opened + len(THINK_OPEN))
  if text[lo:hi].strip():
    paragraphs.append(text[lo:hi].strip())
  after = text if end < 0 else text[end + len(THINK_CLOSE) :]
  return paragraphs, last_boxed(after)
