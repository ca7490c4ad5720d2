"""The import graph of hubd/ and federation/, read from the source with ast
(every import, also the ones inside functions, which would otherwise hide a
cycle): no cycles, the core never imports federation except through the
composition root and the command line, and every import points down the
layers below. And what the door model promises, read from the code (issue
26): the Router dispatches on command types only, doors only translate, one
module asks the federation plugin where a target lives, nothing outside the
actors touches the Router's pending output or live bookkeeping, and no source
file passes 600 lines."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Lowest first. A module may import modules of its own layer or of a lower one.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("wire", ("hubd.wire",)),
    ("base", ("hubd.logs", "hubd.loop_errors", "hubd.metrics", "hubd.faults", "hubd.state", "hubd.journal",
              "hubd.config", "hubd.config_file", "hubd.owner_only", "hubd.timing",
              "hubd.evidence_config",
              "hubd.health", "hubd.auth_log")),
    ("core", ("hubd.core",)),
    ("actors", ("hubd.actors",)),
    ("handlers", ("hubd.handlers",)),
    ("federation", ("federation",)),
    ("doors", ("hubd.http", "hubd.doors")),
    ("hub", ("hubd.hub",)),
    ("composition", ("hubd.composition", "hubd.server")),
    ("command line", ("hubd.cli", "hubd.cli_flags", "hubd.__main__", "hubd.principal_cli", "hubd.preflight",
                      "hubd.snapshot_worker", "hubd.journal_cli", "hubd.security_cli",
                      "hubd.identity_cli")),
]
# the package itself holds only __version__
BASE_MODULES = {"hubd"}
# the only modules of hubd/ that may import federation/
FEDERATION_IMPORTERS = {"hubd.composition", "hubd.cli"}
# federation's operator commands, run by the command line: they sit above the core
COMMAND_MODULES = {"federation.certs_cli", "federation.multihub_cli", "federation.site_cli"}


@functools.cache
def tree_of(path: Path) -> ast.Module:
    """Each source file parsed once for the whole module: every test reads the same tree."""
    return ast.parse(path.read_text(), str(path))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    found = {}
    for top in ("hubd", "federation"):
        for path in sorted((REPO / top).rglob("*.py")):
            found[module_name(path)] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path],
               type_checking: bool = False) -> set[str]:
    """The project modules `name` imports (a `from X import y` names X.y when
    that is a module, else X); with type_checking, also those imported for
    annotations only (under `if TYPE_CHECKING:`)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree_of(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("hubd", "federation"):
                    out.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] not in ("hubd", "federation"):
                continue
            if not type_checking and _in_type_checking(node, path):
                continue
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                out.add(candidate if candidate in modules else source)
    out.discard(name)
    return {m for m in out if m in modules}


_TYPE_CHECKING_LINES: dict[Path, set[int]] = {}


def _in_type_checking(node: ast.AST, path: Path) -> bool:
    """Imports under `if TYPE_CHECKING:` are annotations only, never run."""
    lines = _TYPE_CHECKING_LINES.get(path)
    if lines is None:
        lines = set()
        for block in ast.walk(tree_of(path)):
            if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and \
                    block.test.id == "TYPE_CHECKING":
                for inner in block.body:
                    lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
        _TYPE_CHECKING_LINES[path] = lines
    return node.lineno in lines


def graph(type_checking: bool = False) -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules, type_checking)
            for name, path in modules.items()}


def layer_of(name: str) -> int:
    if name in COMMAND_MODULES:
        return len(LAYERS) - 1
    if name in BASE_MODULES:
        return 1
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if name == prefix or name.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best[0]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = [0]

    def visit(node: str) -> None:
        work = [(node, iter(sorted(edges[node])))]
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        while work:
            current, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[current] = min(low[current], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[current])
            if low[current] == index[current]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == current:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_checker_sees_a_cycle_and_a_lazy_import(tmp_path):
    # the checker itself: a cycle is found, and a function-level import counts
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from hubd.wire import codec\n")
    modules = {"m": source, "hubd.wire.codec": source}
    assert imports_of("m", source, modules) == {"hubd.wire.codec"}


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_no_import_cycle_even_through_annotations():
    # an import for annotations only still says who knows whom: the Router and
    # the session rules used to import each other that way
    assert cycles(graph(type_checking=True)) == []


def test_only_the_composition_root_and_the_command_line_import_federation():
    offenders = sorted(f"{name} -> {target}" for name, targets in graph().items()
                       if name.startswith("hubd") and name not in FEDERATION_IMPORTERS
                       for target in targets if target.startswith("federation"))
    assert offenders == []


def test_imports_point_down_the_layers():
    upward = sorted(
        f"{name} ({LAYERS[layer_of(name)][0]}) -> {target} ({LAYERS[layer_of(target)][0]})"
        for name, targets in graph().items() for target in targets
        if layer_of(target) > layer_of(name))
    assert upward == []


def test_importing_the_hub_imports_no_federation_and_replay_needs_no_import():
    # In a fresh interpreter: the hub and its core load without federation;
    # what a replay projects comes from the installed plugins alone.
    code = (
        "import sys\n"
        "import hubd.hub, hubd.handlers, hubd.http.app\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'federation'], "
        "sorted(m for m in sys.modules if m.startswith('federation'))\n"
        "from hubd.handlers import core_plugin\n"
        "from hubd.state.hub import HubState\n"
        "core = core_plugin()\n"
        "state = HubState.fresh(core.appliers, core.projections)\n"
        "assert 'forward_outbox' not in state.extensions\n"
        "import hubd.composition\n"
        "from hubd.config import HubConfig\n"
        "from hubd.core.plugin import Installed\n"
        "installed = Installed(hubd.composition.plugins_for(HubConfig()))\n"
        "assert 'forward_outbox' in installed.projections\n"
        "assert 'multihub_message_forward' in installed.peer_verbs\n"
        "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


# -- the door model, read from the code (issue 26)

def _trees() -> dict[str, ast.AST]:
    return {name: tree_of(path) for name, path in all_modules().items()}


def _names_called(tree: ast.AST) -> set[str]:
    return {node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Name, ast.Attribute))}


def test_the_router_dispatches_on_command_types_only():
    called = _names_called(_trees()["hubd.actors.router"])
    assert "callable" not in called
    commands = ast.parse((REPO / "hubd/core/commands.py").read_text())
    # no command carries a function to run
    assert not [node.name for node in ast.walk(commands)
                if isinstance(node, ast.ClassDef) and node.name == "Call"]


def test_doors_only_translate():
    graph_ = graph(type_checking=True)
    doors = [name for name in graph_ if name.startswith(("hubd.doors", "hubd.http"))]
    assert doors
    reaching = sorted(f"{name} -> {target}" for name in doors for target in graph_[name]
                      if target.startswith(("hubd.handlers", "hubd.actors", "federation")))
    assert reaching == []
    trees = _trees()
    routing = sorted(name for name in doors if "route_chat" in _names_called(trees[name]))
    assert routing == []


def test_one_module_asks_the_federation_plugin_where_a_target_lives():
    asking = sorted(name for name, tree in _trees().items()
                    if any(isinstance(node, ast.Attribute) and node.attr == "remote_hubs"
                           and isinstance(node.ctx, ast.Load) for node in ast.walk(tree)))
    assert asking == ["hubd.handlers.routing"]


def _is_router(node: ast.AST) -> bool:
    """`router`, `self.router`, `hub.router`, ... (the Router, from outside it)."""
    return (isinstance(node, ast.Name) and node.id == "router") or \
        (isinstance(node, ast.Attribute) and node.attr == "router")


def test_nothing_outside_the_actors_touches_pending_output_or_live_bookkeeping():
    private = {"out", "live", "_live", "_batch", "_control", "_timers"}
    touching = sorted(f"{name}: router.{node.attr}" for name, tree in _trees().items()
                      if not name.startswith("hubd.actors")
                      for node in ast.walk(tree)
                      if isinstance(node, ast.Attribute) and node.attr in private
                      and _is_router(node.value))
    assert touching == []


# split on the peerlink branch (issue 26 item 5: federation's own splits)
SPLIT_ELSEWHERE = {"federation/policy.py", "federation/merge.py"}


def test_no_source_file_passes_600_lines():
    long = sorted(f"{path.relative_to(REPO)}: {lines}"
                  for path in all_modules().values()
                  if (lines := len(path.read_text().splitlines())) > 600
                  and str(path.relative_to(REPO)) not in SPLIT_ELSEWHERE)
    assert long == []
