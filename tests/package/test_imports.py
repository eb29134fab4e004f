"""The house has no import cycles: every `import` in orsd/ (module level and inside functions,
since a lazy import only hides a cycle) is an edge, and the graph of orsd's modules must be acyclic.
It also keeps the dependency direction of docs/architecture.md: envs, rubric and ops never import
train, methods, engines or report; report never imports train or ops."""

import ast
from pathlib import Path

import orsd

ROOT = Path(orsd.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = resolve(name, path.name == "__init__.py", node)
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                while target and target not in modules:  # `from pkg import name` → pkg (or pkg.name)
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("orsd"):
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_orsd_has_no_import_cycles():
    graph = import_graph()
    # a package's __init__ re-exporting its own modules is not a cycle between concerns: drop the
    # edges from a module back to its own package's __init__
    graph = {m: {t for t in targets if not (m.startswith(t + ".") and t.count(".") >= 1)} for m, targets in graph.items()}
    cycle = find_cycle(graph)
    assert cycle is None, " → ".join(cycle)


def test_dependency_direction():
    forbidden = {
        "orsd.envs": {"orsd.train", "orsd.methods", "orsd.engines", "orsd.report", "orsd.rubric"},
        "orsd.rubric": {"orsd.train", "orsd.methods", "orsd.engines", "orsd.report"},
        "orsd.ops": {"orsd.train", "orsd.methods", "orsd.engines", "orsd.report", "orsd.envs", "orsd.rubric"},
        "orsd.methods": {"orsd.train", "orsd.engines", "orsd.report"},
        "orsd.engines": {"orsd.train", "orsd.methods", "orsd.report"},
        "orsd.report": {"orsd.train", "orsd.methods", "orsd.engines", "orsd.ops"},
    }
    wrong = [(m, t) for m, targets in import_graph().items() for t in targets
             if package_of(t) in forbidden.get(package_of(m), set())]
    assert not wrong, wrong


def test_the_update_imports_no_engine():
    """train/loss.py is the update's math and loop: which forwards run is replay's and the model's
    business (train/model.py: shares_prefixes), not the loss's."""
    assert not [t for t in import_graph()["orsd.train.loss"] if package_of(t) == "orsd.engines"]


def test_the_walker_sees_a_cycle():
    """The checker itself: a made-up graph with a cycle is caught, an acyclic one is not."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
