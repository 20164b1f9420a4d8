"""The worker process behind `reprobe_jax.tasks.math_sandbox`: compares two math answers with math-verify.

Run as a script (`python -P <this file>`), never imported by the library: it imports nothing but the standard library
and math-verify, so it starts in about a second, and `-P` keeps its own folder (which holds `tasks/math.py`) off
`sys.path`, where it would shadow the standard `math` module. It reads one JSON request per line on stdin,
`{"predicted": str, "reference": str}`, and writes one JSON reply per line on stdout, `{"equivalent": bool | null,
"reason": str}`. math-verify's own timeouts (signal.alarm, main thread only) are off: the parent bounds each request
by killing this process when it runs past its deadline.
"""

import json
import logging
import os
import sys
import threading
import time


def _watch_parent(parent: int) -> None:
  """Exits when the parent is gone (re-parented), so a comparison stuck in sympy does not outlive it."""
  while os.getppid() == parent:
    time.sleep(1.0)
  os._exit(0)


def _parse(parse, text: str) -> list:
  """math-verify's readings of `text` as LaTeX (the `$...$`), none when it reads nothing or raises (no fallback)."""
  try:
    return parse(f"${text}$", fallback_mode="no_fallback", parsing_timeout=None)
  except Exception:
    return []


def _compare(parse, verify, predicted: str, reference: str) -> tuple[bool | None, str]:
  gold = _parse(parse, reference)
  if not gold:
    return None, "unparseable reference"
  pred = _parse(parse, predicted)
  if not pred:
    return None, "unparseable prediction"
  try:
    same = verify(gold, pred, timeout_seconds=None, raise_on_error=True)
  except Exception:
    return None, "comparison failed"
  return bool(same), "equal by math-verify" if same else "different by math-verify"


def main() -> None:
  threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
  logging.disable(logging.WARNING)  # math-verify warns that its timeout is off: the parent owns the deadline
  out = sys.stdout
  try:
    # Imported here, not at the top, so a missing install reaches the parent as a one-line reply, not a dead process.
    from math_verify import parse, verify
  except ImportError as e:
    out.write(json.dumps({"ready": False, "error": str(e)}) + "\n")
    out.flush()
    return
  out.write(json.dumps({"ready": True}) + "\n")
  out.flush()
  for line in sys.stdin:
    request = json.loads(line)
    equivalent, reason = _compare(parse, verify, request["predicted"], request["reference"])
    out.write(json.dumps({"equivalent": equivalent, "reason": reason}) + "\n")
    out.flush()


if __name__ == "__main__":
  main()
