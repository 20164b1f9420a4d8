"""A time limit on math-verify that holds in any thread and inside worker processes.

math-verify bounds its own parsing and comparison with `signal.alarm`, which works only in the main thread of the
main interpreter; sympy can also spin for minutes on an adversarial answer (`9^{9^{9}}` against `1`). So the
comparison runs in a separate Python process (`math_sandbox_child.py`, started with `subprocess`, which works from
any thread, from a `concurrent.futures` or `multiprocessing` worker and under any start method), with math-verify's
alarms off. The caller waits on the reply's pipe with `select` up to its deadline; past it, the process is killed
and the verdict is "timed out". Processes that answered in time are kept (up to `KEEP_IDLE`) and reused, so only the
first comparison in a process pays the start (about a second: sympy's import); concurrent callers each take their
own process. A forked child forgets its parent's processes (they are the parent's to use and to end).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time

from reprobe_jax.errors import ConfigError

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "math_sandbox_child.py")
START_LIMIT_S = 60.0  # for the process to import math-verify; not counted in a comparison's own time limit
KEEP_IDLE = 2  # processes kept for reuse; more callers at once start more, closed when they are done


class _TimedOut(Exception):
  pass


class _Dead(Exception):
  pass


class _Worker:
  """One child process and its pipes; owned by the process that started it."""

  def __init__(self) -> None:
    # -P: the child's folder (this package, which holds tasks/math.py) stays off sys.path, so `math` is the stdlib's.
    self.proc = subprocess.Popen(
      [sys.executable, "-P", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    self.owner = os.getpid()
    self.buffer = b""
    try:
      hello = self.read(time.monotonic() + START_LIMIT_S)
    except (_TimedOut, _Dead):
      self.kill()
      raise
    if not hello.get("ready"):
      self.kill()
      raise ConfigError(
        f"math answers are compared with math-verify, which cannot be imported ({hello.get('error')}); "
        "install reprobe-jax's dependencies (pip install -e .)"
      )

  def read(self, deadline: float) -> dict:
    """The next JSON line from the child; _TimedOut past `deadline`, _Dead when the child has gone."""
    fd = self.proc.stdout.fileno()
    while b"\n" not in self.buffer:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        raise _TimedOut()
      ready, _, _ = select.select([fd], [], [], remaining)
      if ready:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
          raise _Dead()
        self.buffer += chunk
    line, _, self.buffer = self.buffer.partition(b"\n")
    return json.loads(line)

  def ask(self, predicted: str, reference: str, deadline: float) -> dict:
    try:
      self.proc.stdin.write(json.dumps({"predicted": predicted, "reference": reference}).encode() + b"\n")
      self.proc.stdin.flush()
    except (BrokenPipeError, OSError):
      raise _Dead() from None
    return self.read(deadline)

  def kill(self) -> None:
    if os.getpid() != self.owner:
      return  # a forked copy: the process is the parent's
    self.proc.kill()
    self.proc.wait()
    self.proc.stdin.close()
    self.proc.stdout.close()

  def close(self) -> None:
    """Ends an idle child: EOF on its stdin, then a kill if it does not go at once."""
    if os.getpid() != self.owner:
      return
    try:
      self.proc.stdin.close()
      self.proc.wait(timeout=1.0)
      self.proc.stdout.close()
    except (OSError, subprocess.TimeoutExpired):
      self.kill()


_lock = threading.Lock()
_idle: list[_Worker] = []


def _forget_after_fork() -> None:
  global _lock, _idle
  _lock, _idle = threading.Lock(), []


def _close_all() -> None:
  with _lock:
    workers = list(_idle)
    _idle.clear()
  for worker in workers:
    worker.close()


os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(_close_all)


def compare(predicted: str, reference: str, timeout: float) -> tuple[bool | None, str]:
  """(equivalent, reason) from math-verify for two cleaned answers, within `timeout` seconds of comparison.

  equivalent is None with reason "unparseable prediction" / "unparseable reference" (math-verify read nothing),
  "timed out" (past the limit; the process is killed) or "comparison failed" (math-verify raised, or its process
  died). Starting a process (the first call, or after a kill) waits up to START_LIMIT_S more.
  """
  with _lock:
    worker = _idle.pop() if _idle else None
  if worker is not None and worker.proc.poll() is not None:
    worker = None
  try:
    worker = worker or _Worker()
  except (_TimedOut, _Dead):
    return None, "comparison failed"
  try:
    reply = worker.ask(predicted, reference, time.monotonic() + timeout)
  except _TimedOut:
    worker.kill()
    return None, "timed out"
  except _Dead:
    worker.kill()
    return None, "comparison failed"
  except BaseException:
    worker.kill()  # interrupted mid-request: its reply would answer the next caller's question
    raise
  with _lock:
    keep = len(_idle) < KEEP_IDLE
    if keep:
      _idle.append(worker)
  if not keep:
    worker.close()
  return reply["equivalent"], reply["reason"]
