"""The package's imports go one way: no import circle between modules, and packages import only
packages below them in :data:`ORDER` (serial). Imports inside functions count too.

A circle means two modules each need the other: neither can be read, tested or moved alone. The
order says the same of folders: layout/ is pure maths that anything may use, and nothing below
commands/ may reach up into it.
"""

import ast
from pathlib import Path

import hpctrain

ROOT = Path(hpctrain.__file__).parent

# The packages (and top-level modules) from the bottom up. A module imports modules of its own
# package and of packages below it, never above. docs/architecture.md draws the same order.
ORDER = ("errors", "io", "device", "kernels", "cost", "layout", "comm", "data", "layers",
         "model", "interchange", "plan", "record", "study", "run", "commands", "cli", "__main__")


def module_names() -> dict[str, Path]:
    names = {}
    for path in ROOT.rglob("*.py"):
        parts = ("hpctrain", *path.relative_to(ROOT).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the hpctrain modules it imports anywhere in its text."""
    modules = module_names()

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in map(owner, targets) if t and t != name}
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "hpctrain.commands.setup" in graph["hpctrain.commands.plan"]  # imported inside run()
    assert "hpctrain.comm.agree" in graph["hpctrain.commands.setup"]
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_itself_through_others():
    circle = find_circle(import_graph())
    assert circle is None, "import circle: " + " -> ".join(circle)


def level(module: str) -> int:
    """The position in :data:`ORDER` of the package (or top-level module) holding ``module``;
    the root package (its version) sits at the bottom with errors."""
    part = module.split(".")[1] if "." in module else "errors"
    return ORDER.index(part)


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import that reaches a package above the importer's, as 'a -> b'."""
    return [f"{name} -> {target}" for name, targets in sorted(graph.items())
            for target in sorted(targets) if level(target) > level(name)]


def test_every_package_has_its_place_in_the_order():
    places = {name.split(".")[1] for name in module_names() if "." in name}
    assert places <= set(ORDER), f"not in ORDER: {sorted(places - set(ORDER))}"


def test_the_order_check_finds_an_upward_import():
    graph = {"hpctrain.layout.moves": {"hpctrain.plan.planner"},
             "hpctrain.plan.planner": {"hpctrain.layout.moves", "hpctrain.errors"}}
    assert upward(graph) == ["hpctrain.layout.moves -> hpctrain.plan.planner"]


def test_packages_import_only_packages_below_them():
    found = upward(import_graph())
    assert not found, "imports against the order of packages:\n" + "\n".join(found)
