"""The package layout's rules, read from the sources: no import circles in sam3track, graphs and om
(imports inside functions count: a deferred import hides a circle, it does not remove it), and the
library never imports its command line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("sam3track", "graphs", "om")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(module: str, path: Path, node: ast.AST, modules: dict) -> set[str]:
    """The project modules one import statement loads: ``from pkg import name`` is pkg.name where that
    is a module, else pkg itself."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    found = set()
    for name in names:
        while name and name not in modules:  # `import pkg.mod.attr`: the module that holds it
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        deps = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps |= _imported(module, path, node, modules)
        deps.discard(module)
        graph[module] = deps
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles (each a set of modules that import one another):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


def test_the_finder_sees_a_circle():
    """The check itself: a circle of three and one of two are found, a chain is not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": set()}
    assert sorted(circles(graph)) == [["a", "b", "c"], ["d", "e"]]


def test_the_library_never_imports_its_command_line():
    graph = import_graph()
    cli = {m for m in graph if m == "sam3track.cli" or m.startswith("sam3track.commands")}
    offenders = {m: sorted(graph[m] & cli) for m in graph if m not in cli and m != "sam3track.__main__"}
    assert not {m: d for m, d in offenders.items() if d}, offenders


def test_both_families_sessions_are_tracking_sessions():
    """Each family's session has every member of sam3track.TrackingSession, and each method takes at
    least the protocol's parameters: a caller written against the protocol runs on either."""
    import inspect

    from sam3track import TrackingSession
    from sam3track.families.sam31.session import Sam31Session
    from sam3track.families.sam3.session import Sam3Session

    members = [n for n in vars(TrackingSession) if not n.startswith("_") or n in ("__enter__", "__exit__")]
    members += list(TrackingSession.__annotations__)
    for cls in (Sam3Session, Sam31Session):
        for name in members:
            assert hasattr(cls, name), f"{cls.__name__} has no {name}"
            wanted = getattr(TrackingSession, name, None)
            if inspect.isfunction(wanted):
                have = inspect.signature(getattr(cls, name)).parameters
                missing = [p for p in inspect.signature(wanted).parameters if p not in have and p not in ("exc",)]
                assert not missing, f"{cls.__name__}.{name} lacks {missing}"
        assert cls.box_prompts in ("tracker", "detector")


def test_each_family_lives_in_its_own_package():
    """SAM 3 and SAM 3.1 side by side over the core: the family registry hands out sessions and configs
    from families/<name>/, and no family module imports the other family."""
    from sam3track.families import FAMILIES

    for name, make in FAMILIES.items():
        family = make()
        package = "sam3track.families." + name.replace(".", "")
        assert family.session_class().__module__.startswith(package), name
        assert family.config_from_manifest.__self__.__module__.startswith(package), name
    graph = import_graph()
    for own, other in (("sam3track.families.sam3.", "sam3track.families.sam31"),
                       ("sam3track.families.sam31.", "sam3track.families.sam3.")):
        crossing = {m: sorted(d for d in graph[m] if d.startswith(other)) for m in graph if m.startswith(own)}
        assert not {m: d for m, d in crossing.items() if d}, crossing


@pytest.mark.parametrize("old, new, name", [
    ("sam3track.session", "sam3track.families.sam3.session", "Session"),
    ("sam3track.frame_loop", "sam3track.families.sam3.frame_loop", "FrameLoop"),
    ("sam3track.planning", "sam3track.families.sam3.planning", "plan_frame"),
    ("sam3track.interactive", "sam3track.families.sam3.clicks", "parse_clicks"),
])
def test_moved_modules_keep_their_old_path_with_a_warning(old, new, name):
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


@pytest.mark.parametrize("module, name, new", [
    ("sam3track.memory_bank", "MemoryBank", "sam3track.families.sam3.memory"),
    ("sam3track.config", "TrackerConfig", "sam3track.families.sam3.config"),
])
def test_moved_names_keep_their_old_path_with_a_warning(module, name, new):
    import importlib

    with pytest.warns(DeprecationWarning, match=f"{module}.{name} moved"):
        value = getattr(importlib.import_module(module), name)
    assert value is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError):
        getattr(importlib.import_module(module), "no_such_name")


def test_the_graphs_families_share_only_the_common_machinery():
    """graphs/sam31 builds on the shared export machinery (onnx_export, comparison, ops, spec_types),
    never on SAM 3's modules; SAM 3's export reads SAM 3.1's checkpoint detector only to name the right
    --family flag for a SAM 3.1 file."""
    graph = import_graph()
    sam31_on_sam3 = {m: sorted(d for d in graph[m] if d.startswith("graphs.sam3."))
                     for m in graph if m.startswith("graphs.sam31.")}
    assert not {m: d for m, d in sam31_on_sam3.items() if d}, sam31_on_sam3
    sam3_on_sam31 = {m: sorted(d for d in graph[m] if d.startswith("graphs.sam31"))
                     for m in graph if m.startswith("graphs.sam3.")}
    assert {m: d for m, d in sam3_on_sam31.items() if d} == {"graphs.sam3.export": ["graphs.sam31.checkpoint"]}
