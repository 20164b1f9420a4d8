"""Multi-hop QA (out of domain): composed questions over a generated base of facts about people.

People are numbered. Every person has exactly one value for every relation of the problem ("The mentor of 4 is 9."),
so any person reached by a wrong lookup still has an answer for the next hop and errors can propagate. A question
composes 2-3 relations ("Start at 4. Step 1: mentor. Step 2: boss. Who is that? Facts about numbered people: ...",
the boss of the mentor of 4); a step is one lookup, "the mentor of 4 is 9". It is correct when its relation is the
next one of the chain, its subject is the previous written result (or the question's start person), and its object
is what the fact base says. The checker also takes named people ("the mentor of Alice is Beth"), compared without
case.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from reprobe_jax.tasks.family import SyntheticFamily
from reprobe_jax.tasks.base import register_task, Problem, State, advance_pointer, family_rng

# People are numbered 1..10 and relations come from a small pool: the tiny built-in model copies number tokens (it
# does so in every arithmetic step) but, within its CPU-minutes budget, never learned to copy names (docs/tasks.md,
# "qa").
PEOPLE = tuple(str(i) for i in range(1, 11))
RELATIONS = ("boss", "coach", "friend", "mentor", "teacher")
_N_PEOPLE = {1: 3, 2: 4, 3: 4}
_N_RELATIONS = {1: 2, 2: 2, 3: 3}
_N_HOPS = {1: 2, 2: 3, 3: 3}
_STEP = re.compile(r"^\s*the\s+([a-z]+)\s+of\s+([a-z]+|\d+)\s+is\s+([a-z]+|\d+)\s*\.?\s*$", re.IGNORECASE)


def facts(problem: Problem) -> dict[tuple[str, str], str]:
  """The fact base as {(subject, relation): object}."""
  return {(s, r): o for s, r, o in problem.data["facts"]}


class MultiHopQA(SyntheticFamily):
  """Composed lookups; state = (index of the next hop, previous written entity)."""

  name = "qa"
  step_hint = "one fact per step, like 'the boss of 4 is 9'"
  step_rule = "one fact per step"
  flip_kinds = ("entity",)

  def generate(self, seed: int, difficulty: int) -> Problem:
    """3/4/4 people, 2/2/3 relations (6/8/12 facts), and a 2/3/3-hop question."""
    rng = family_rng(self.name, seed, difficulty)
    people = [str(x) for x in rng.choice(PEOPLE, size=_N_PEOPLE[difficulty], replace=False)]
    relations = sorted(str(x) for x in rng.choice(RELATIONS, size=_N_RELATIONS[difficulty], replace=False))
    triples = []
    for s in people:
      for r in relations:
        others = [o for o in people if o != s]
        triples.append([s, r, others[int(rng.integers(len(others)))]])
    hops: list[str] = []
    while len(hops) < _N_HOPS[difficulty]:
      r = relations[int(rng.integers(len(relations)))]
      # Two equal hops in a row would make a skipped hop look like a done one.
      if not hops or hops[-1] != r:
        hops.append(r)
    start = people[int(rng.integers(len(people)))]
    base = {(s, r): o for s, r, o in triples}
    entity = start
    for r in hops:
      entity = base[(entity, r)]
    order = [triples[i] for i in rng.permutation(len(triples))]
    # Each fact is written exactly as a step writes the look-up ("the boss of 4 is 9"), so a right step copies
    # the fact that starts with its relation and subject; with a capital "The" the built-in model got 29% of its
    # line steps right (docs/tasks.md, "qa").
    text = "; ".join(f"the {r} of {s} is {o}" for s, r, o in order) + "."
    # Laid out like an arithmetic chain: the start, then each hop labelled with the step that follows it, so the
    # tiny built-in model finds a step's person and relation the way it finds an arithmetic step's value and
    # operation; only the lookup in the facts is new to it.
    chain = " ".join(f"Step {k}: {r}." for k, r in enumerate(hops, start=1))
    return Problem(
      id=f"{self.name}-d{difficulty}-s{seed}",
      domain=self.name,
      question=f"Start at {start}. {chain} Who is that? Facts about numbered people: {text}",
      answer=entity,
      data={
        "people": sorted(people),
        "relations": relations,
        "facts": triples,
        "start": start,
        "hops": hops,
        "difficulty": difficulty,
      },
    )

  def first_step_question(self, problem: Problem) -> str:
    """'Step 1: mentor.' becomes 'Step 1: the mentor of 4.' (the start person as the first look-up's subject): the
    object is still to be found among the facts, where other facts share the relation or the person."""
    d = problem.data
    return problem.question.replace(f"Step 1: {d['hops'][0]}.", f"Step 1: the {d['hops'][0]} of {d['start']}.", 1)

  def validate(self, problem: Problem, where: str) -> None:
    data = problem.data
    people, relations = data.get("people"), data.get("relations")
    # Named as a step's parse reads them (subject and object capitalised, relation lower case), so every fact can be
    # checked.
    for name, value, pattern in (("people", people, r"[A-Z][a-z]*|\d+"), ("relations", relations, r"[a-z]+")):
      if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(x, str) and re.fullmatch(pattern, x) for x in value)
      ):
        what = "capitalised words or numbers" if name == "people" else "lower-case words"
        raise self.data_error(where, f"'{name}' must be a non-empty list of {what}, found {value!r}")
    triples = data.get("facts")
    if not isinstance(triples, list) or not all(
      isinstance(t, list) and len(t) == 3 and t[0] in people and t[1] in relations and t[2] in people for t in triples
    ):
      raise self.data_error(where, f"'facts' must be a list of [person, relation, person] triples, found {triples!r}")
    base = facts(problem)
    missing = [(s, r) for s in people for r in relations if (s, r) not in base]
    if missing:
      raise self.data_error(where, f"'facts' has no value for {missing[0][1]!r} of {missing[0][0]!r}")
    if data.get("start") not in people:
      raise self.data_error(where, f"'start' must be one of the people, found {data.get('start')!r}")
    hops = data.get("hops")
    if not isinstance(hops, list) or not hops or not all(h in relations for h in hops):
      raise self.data_error(where, f"'hops' must be a non-empty list of the relations, found {hops!r}")
    entity = data["start"]
    for r in hops:
      entity = base[(entity, r)]
    if self.normalize_answer(problem.answer) != entity:
      raise self.data_error(where, f"answer {problem.answer!r} does not match the chain's result {entity!r}")

  def max_steps(self, problem: Problem) -> int:
    return len(problem.data["hops"])

  def initial_state(self, problem: Problem) -> State:
    return (0, problem.data["start"])

  def parse_step(self, body: str) -> tuple[str, str, str] | None:
    m = _STEP.match(body or "")
    if m is None:
      return None
    return m.group(1).lower(), m.group(2).capitalize(), m.group(3).capitalize()

  def step_key(self, parsed: Any) -> str | None:
    return None if parsed is None else parsed[0]

  def judge_step(self, problem: Problem, state: State, parsed: Any, next_parsed: Any | None) -> tuple[bool, State]:
    """Correct iff it looks up the next relation of the chain, for the previous written person, and gets it right."""
    p, entity = state
    relation, subject, obj = parsed
    matched, p_next = advance_pointer(problem.data["hops"], p, relation, self.step_key(next_parsed))
    ok = matched and subject == entity and facts(problem).get((subject, relation)) == obj
    return ok, (p_next, obj)

  def is_done(self, problem: Problem, state: State) -> bool:
    return state[0] >= len(problem.data["hops"])

  def state_answer(self, problem: Problem, state: State) -> str:
    return state[1]

  def match_score(self, problem: Problem, state: State, parsed: Any) -> int:
    p, entity = state
    hops = problem.data["hops"]
    same_relation = p < len(hops) and parsed[0] == hops[p]
    return 2 if same_relation and parsed[1] == entity else int(same_relation or parsed[1] == entity)

  def normalize_answer(self, answer: str) -> str | None:
    text = answer.strip().rstrip(".").strip()
    return text.capitalize() if re.fullmatch(r"[A-Za-z]+|\d+", text) else None

  def honest_step(self, problem: Problem, state: State, rng: np.random.Generator | None) -> tuple[str, State]:
    p, entity = state
    relation = problem.data["hops"][p]
    obj = facts(problem)[(entity, relation)]
    return f"the {relation} of {entity} is {obj}", (p + 1, obj)

  def error_step(self, problem: Problem, state: State, kind: str, rng: np.random.Generator) -> tuple[str, State] | None:
    """'entity': the lookup returns the wrong person; 'relation': another relation is followed (correctly);
    'skip': the hop after the next one is looked up instead."""
    p, entity = state
    hops = problem.data["hops"]
    base = facts(problem)
    relation = hops[p]
    if kind == "entity":
      right = base[(entity, relation)]
      choices = [x for x in problem.data["people"] if x != right]
      obj = choices[int(rng.integers(len(choices)))]
      return f"the {relation} of {entity} is {obj}", (p + 1, obj)
    if kind == "relation":
      # A relation still ahead in the chain would read as a skip.
      choices = [r for r in problem.data["relations"] if r not in hops[p:]]
      if not choices:
        return None
      wrong = choices[int(rng.integers(len(choices)))]
      obj = base[(entity, wrong)]
      return f"the {wrong} of {entity} is {obj}", (p + 1, obj)
    if kind == "skip":
      if p + 1 >= len(hops) or hops[p + 1] == hops[p]:
        return None
      obj = base[(entity, hops[p + 1])]
      return f"the {hops[p + 1]} of {entity} is {obj}", (p + 2, obj)
    return None

  def bug_step(self, problem: Problem, state: State, noise: Any) -> tuple[str, str, State] | None:
    """'inverse': a 'mentor' hop is read backwards, naming the person whose mentor the current one is ("The mentor
    of 7 is 4." read as "the mentor of 4 is 7"); only where exactly one such person exists and differs from the
    right answer. The condition is the relation word, which the model copies into the step before the lookup."""
    p, entity = state
    relation = problem.data["hops"][p]
    if relation != "mentor" or "inverse" not in noise.bugs:
      return None
    base = facts(problem)
    mentees = sorted(s for (s, r), o in base.items() if r == relation and o == entity)
    if len(mentees) != 1 or mentees[0] == base[(entity, relation)]:
      return None
    return "inverse", f"the {relation} of {entity} is {mentees[0]}", (p + 1, mentees[0])

  def error_rates(self, noise: Any) -> list[tuple[str, float]]:
    return [("entity", noise.p_wrong_entity), ("relation", noise.p_wrong_relation), ("skip", noise.p_skip)]


register_task(MultiHopQA())
