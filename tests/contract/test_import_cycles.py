"""No import cycle anywhere in `polyloop`: between any two modules, at any depth.

The import-linter contract in pyproject.toml (acyclic_siblings over `polyloop`) holds the
siblings of every package; it cannot see a cycle that runs through a package's own
`__init__` (`journal/__init__.py` imports `journal.sqlite`, which imports `polyloop.journal`).
This test holds the whole module graph. It counts every import grimp finds: those inside
functions and under `if TYPE_CHECKING:` too, since a cycle that is broken only at run time is
still two modules that cannot be read, moved or tested one without the other.
"""

from __future__ import annotations

import itertools

import grimp

PACKAGE = "polyloop"


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, cache_dir=None)


def _imports(graph: grimp.ImportGraph, module: str) -> list[str]:
    return sorted(m for m in graph.find_modules_directly_imported_by(module) if m in graph.modules)


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(_imports(graph, root)))]
        while work:
            module, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(_imports(graph, nxt))))
                    break
                if nxt in on_stack:
                    low[module] = min(low[module], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return [_shortest_cycle(graph, component) for component in components]


def _shortest_cycle(graph: grimp.ImportGraph, component: list[str]) -> list[str]:
    """The shortest way from the component's first module back to itself, inside it."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for nxt in _imports(graph, module):
                if nxt == start:
                    path = [module]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt in members and nxt not in came_from:
                    came_from[nxt] = module
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{component} is not strongly connected")


def _describe(graph: grimp.ImportGraph, cycle: list[str]) -> str:
    lines = [" -> ".join(cycle)]
    for importer, imported in itertools.pairwise(cycle):
        for detail in graph.get_import_details(importer=importer, imported=imported)[:1]:
            lines.append(f"  {importer}:{detail['line_number']}: {detail['line_contents']}")
    return "\n".join(lines)


def test_no_module_of_polyloop_is_in_an_import_cycle() -> None:
    graph = _graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles (break one import of each):\n" + "\n".join(
        _describe(graph, cycle) for cycle in cycles
    )


def test_a_cycle_through_a_packages_init_is_found_and_named() -> None:
    graph = _graph()
    assert "polyloop.journal.sqlite" in graph.find_modules_directly_imported_by("polyloop.journal")
    graph.add_import(
        importer="polyloop.journal.sqlite",
        imported="polyloop.journal",
        line_number=1,
        line_contents="from polyloop.journal import MemoryJournal",
    )
    assert _cycles(graph) == [["polyloop.journal", "polyloop.journal.sqlite", "polyloop.journal"]]
    assert "polyloop.journal.sqlite:1: from polyloop.journal import MemoryJournal" in _describe(
        graph, _cycles(graph)[0]
    )


def test_a_cycle_of_three_siblings_is_named_in_import_order() -> None:
    graph = _graph()
    for importer, imported in (
        ("polyloop.journal._state", "polyloop.loop"),
        ("polyloop.loop", "polyloop.cli"),
        ("polyloop.cli", "polyloop.journal._state"),
    ):
        graph.add_import(importer=importer, imported=imported)
    (cycle,) = _cycles(graph)
    assert cycle[0] == cycle[-1] and len(set(cycle)) == len(cycle) - 1 >= 2
    for importer, imported in itertools.pairwise(cycle):
        assert graph.direct_import_exists(importer=importer, imported=imported)
