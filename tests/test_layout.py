"""The package's layout holds: no import circle between its modules, files short enough to read in one sitting, an
(almost) empty root, and code and docs that cite what a reader has (docs/method.md sections, not issue numbers).

The import graph is read from the source (every `import` and `from ... import`, those inside functions and under
`if TYPE_CHECKING:` included). An import of a package reaches whatever its __init__ imports, so a circle through a
package's re-exports is found between the modules that hold the code. The layer contracts (models import neither
steps, tasks nor jobs; tasks and steps import no models; nothing below jobs imports jobs; errors, fields, registry
and io import nothing above them) are import-linter's, in pyproject.toml, checked by `make test` before pytest
runs.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "reprobe_jax"
MAX_LINES = 450
# The root's own modules, each named with its reason in reprobe_jax/__init__.py.
ROOT_MODULES = {"__init__.py", "errors.py", "fields.py", "registry.py"}


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in PACKAGE.rglob("*.py"):
    parts = path.relative_to(ROOT).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    out[name] = path
  return out


def _imports(path: pathlib.Path, name: str, known: set[str]) -> set[str]:
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
      out.add(base)
      out |= {f"{base}.{alias.name}" for alias in node.names}
  return {m for m in out if m in known}


def import_graph() -> dict[str, set[str]]:
  """Module -> the modules it imports, with imports of a package replaced by what the package's __init__ imports."""
  mods = _modules()
  graph = {n: _imports(p, n, set(mods)) - {n} for n, p in mods.items()}
  packages = {n for n, p in mods.items() if p.name == "__init__.py"}

  def expand(m: str, seen: tuple[str, ...] = ()) -> set[str]:
    if m not in packages or m in seen:
      return {m}
    out = set()
    for c in graph[m]:
      out |= expand(c, seen + (m,))
    return out or {m}

  return {
    n: set().union(*(expand(m) for m in ms)) - {n} if ms else set() for n, ms in graph.items() if n not in packages
  }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
  index, low, on, stack, out, counter = {}, {}, set(), [], [], 0
  for root in sorted(graph):
    if root in index:
      continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = counter
    counter += 1
    stack.append(root)
    on.add(root)
    while work:
      v, children = work[-1]
      for w in children:
        if w not in graph:
          continue
        if w not in index:
          index[w] = low[w] = counter
          counter += 1
          stack.append(w)
          on.add(w)
          work.append((w, iter(sorted(graph[w]))))
          break
        if w in on:
          low[v] = min(low[v], index[w])
      else:
        work.pop()
        if work:
          low[work[-1][0]] = min(low[work[-1][0]], low[v])
        if low[v] == index[v]:
          comp = []
          while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
              break
          if len(comp) > 1:
            out.append(sorted(comp))
  return out


def test_cycle_finder_finds_a_circle_and_passes_a_chain():
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle_between_modules():
  found = cycles(import_graph())
  assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_modules_are_short():
  long = {
    str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES
  }
  assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_root_holds_only_its_named_modules():
  loose = {p.name for p in PACKAGE.glob("*.py")} - ROOT_MODULES
  assert not loose, f"modules at the package root: {sorted(loose)}; put them in a package named for what they hold"
  doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text())) or ""
  for name in ROOT_MODULES - {"__init__.py"}:
    assert name[:-3] in doc, f"reprobe_jax/__init__.py's docstring does not say why {name} is at the root"


def test_code_and_docs_cite_what_a_reader_has():
  """No issue numbers, and the method's definitions cited as docs/method.md's sections (not a file outside)."""
  issue, method = re.compile(r"\bissues? \d+\b", re.I), re.compile(r"\bMETHOD (Part )?[AB]\d?\b")
  cites = lambda line: issue.search(line) or method.search(line)
  found = []
  for base in ("reprobe_jax", "docs", "configs", "bench", "tests"):
    for path in sorted((ROOT / base).rglob("*")):
      if path.suffix in (".py", ".md") and path.is_file():
        found += [
          f"{path.relative_to(ROOT)}:{i}"
          for i, line in enumerate(path.read_text().splitlines(), 1)
          if cites(line) and path.name != "test_layout.py"
        ]
  found += [f"README.md:{i}" for i, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1) if cites(line)]
  assert not found, f"references a reader cannot look up: {found[:10]}"
