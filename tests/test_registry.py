"""The one registry type, and the registries built on it (scorers, estimators, strategies, annotators, tasks and
the synthetic families among them): registration as a decorator and as a call, look-up errors that name the known entries, no duplicates."""

from __future__ import annotations

import pytest

from reprobe_jax.annotate import ANNOTATORS
from reprobe_jax.errors import ConfigError
from reprobe_jax.registry import Registry
from reprobe_jax.rl.advantages import ESTIMATORS
from reprobe_jax.scorers import SCORERS
from reprobe_jax.tasks import FAMILIES, TASKS, MathTask, Task, TaskFamily, get_family, get_task, register_task
from reprobe_jax.tts import STRATEGIES, beam_search, best_of_n, dvts


def test_register_as_a_decorator_and_as_a_call():
  reg = Registry("widget")

  @reg.register("b")
  def b():
    return "b"

  assert b() == "b" and reg.get("b") is b  # the decorator hands the definition back unchanged
  assert reg.register("a", len) is len
  assert reg.names() == ("b", "a") and list(reg) == ["b", "a"] and len(reg) == 2  # registration order
  assert reg.items() == (("b", b), ("a", len)) and reg.values() == (b, len)
  assert "a" in reg and "c" not in reg and ["a"] not in reg
  assert reg["a"] is len


def test_lookup_names_the_known_entries():
  reg = Registry("widget")
  reg.register("zeta", 1)
  reg.register("alpha", 2)
  with pytest.raises(ConfigError, match=r"^unknown widget 'beta'; known: alpha, zeta$"):
    reg.get("beta")
  with pytest.raises(ConfigError, match=r"^unknown widget \['x'\]; known: alpha, zeta$"):
    reg.get(["x"])  # an unhashable name from a config file
  with pytest.raises(ConfigError, match=r"^unknown widget 'beta'"):
    reg["beta"]


def test_a_name_is_registered_once_and_must_be_a_string():
  reg = Registry("widget")
  reg.register("a", 1)
  with pytest.raises(ConfigError, match=r"^widget 'a' is already registered$"):
    reg.register("a", 2)
  with pytest.raises(ConfigError, match=r"^widget 'a' is already registered$"):
    reg.register("a")(len)
  assert reg.get("a") == 1
  for bad in ("", 3, None):
    with pytest.raises(ConfigError, match=r"^a widget needs a non-empty string name"):
      reg.register(bad, 1)


def test_falsy_entries_are_entries():
  reg = Registry("count")
  assert reg.register("zero", 0) == 0 and reg.register("none", None) is None
  assert reg.get("zero") == 0 and reg.get("none") is None


def test_the_registries():
  assert {r.category for r in (SCORERS, ESTIMATORS, STRATEGIES, ANNOTATORS, TASKS, FAMILIES)} == {
    "step scorer",
    "advantage estimator",
    "search strategy",
    "annotator",
    "task",
    "synthetic task family",
  }
  assert all(isinstance(r, Registry) for r in (SCORERS, ESTIMATORS, STRATEGIES, ANNOTATORS, TASKS, FAMILIES))
  # the TTS job's default grid runs the strategies in this order
  assert STRATEGIES.names() == ("best_of_n", "beam", "dvts")
  assert [STRATEGIES.get(n) for n in STRATEGIES] == [best_of_n, beam_search, dvts]
  assert ANNOTATORS.names() == ("rule", "self", "judge", "import")
  assert FAMILIES.names() == ("arithmetic", "planning", "qa")
  assert all(isinstance(f, TaskFamily) and f.name == n for n, f in FAMILIES.items())
  assert get_family("qa") is FAMILIES["qa"]
  # every family is a task; the math task is a task but no family (it generates nothing)
  assert set(TASKS.names()) == {"arithmetic", "planning", "qa", "math"}
  assert all(get_task(n) is FAMILIES[n] for n in FAMILIES)
  assert isinstance(get_task("math"), MathTask) and "math" not in FAMILIES
  with pytest.raises(ConfigError, match=r"^unknown search strategy 'mcts'; known: beam, best_of_n, dvts$"):
    STRATEGIES.get("mcts")


def test_a_user_task_registers_by_name_and_its_problems_load():
  from reprobe_jax.tasks import Problem, formats

  class Capitals(Task):
    name = "capitals-test"

    def validate(self, problem, where):
      pass

    def user_prompt(self, problem, mode, *, example=True, first_step=False):
      return f"{problem.question} Answer with '<Answer>: city'."

    def normalize_answer(self, answer):
      return answer.strip().casefold() or None

  if "capitals-test" not in TASKS:
    register_task(Capitals())
  problem = Problem.from_json(
    {"id": "c1", "domain": "capitals-test", "question": "Capital of France?", "answer": "Paris", "data": {}}
  )
  checked = formats.check_response(problem, "- Step 1: France's capital is Paris\n<Answer>: paris", "line")
  assert checked.correct and checked.answer == "paris" and len(checked.labels) == 1
  with pytest.raises(ConfigError, match="task 'capitals-test' is already registered"):
    register_task(Capitals())
  with pytest.raises(ConfigError, match="register_task needs a Task instance, got str"):
    register_task("capitals")
