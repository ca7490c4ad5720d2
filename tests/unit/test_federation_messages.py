"""Federation talks to the Router by typed messages, read from the source:
no federation module hands the Router a closure, every message type it
posts is a frozen type the plugin registers with a handler, and the actors
(federation/actors/) import nothing of the Router's side."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from federation.plugin import COMMANDS
from tests.unit.test_layers import graph

REPO = Path(__file__).resolve().parents[2]
FEDERATION = REPO / "federation"


def _posts(tree: ast.AST):
    """Every argument of a `*.post_control(...)` call or a put on a Router's inbox."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "post_control" or (
                    node.func.attr in ("put", "put_nowait")
                    and isinstance(node.func.value, ast.Attribute)
                    and node.func.value.attr == "inbox"
                    and "router" in ast.unparse(node.func.value.value)):
                yield from node.args


def test_no_federation_module_hands_the_router_a_closure():
    closures = []
    for path in sorted(FEDERATION.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for arg in _posts(tree):
            text = ast.unparse(arg)
            if isinstance(arg, ast.Lambda) or text.startswith(("partial(", "Call(")) or \
                    (isinstance(arg, ast.Attribute) and arg.attr.startswith("_")):
                closures.append(f"{path.relative_to(REPO)}:{arg.lineno}: {text}")
    assert closures == []
    calls = [f"{path.relative_to(REPO)}" for path in sorted(FEDERATION.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) and node.module == "hubd.core.commands"
             and any(alias.name == "Call" for alias in node.names)]
    assert calls == []  # Call(fn) is a closure on the Router's inbox too


def test_every_command_is_a_frozen_type_with_a_handler():
    for kind, handler in COMMANDS.items():
        frozen = (dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen) or \
            (issubclass(kind, tuple) and hasattr(kind, "_fields"))
        assert frozen, f"{kind.__name__} is not a frozen dataclass or a NamedTuple"
        assert callable(handler)


def test_the_actors_import_nothing_of_the_routers_side():
    offenders = sorted(f"{name} -> {target}" for name, targets in graph().items()
                       if name.startswith("federation.actors.")
                       for target in targets
                       if target.startswith(("federation.handlers", "federation.plugin",
                                             "hubd.actors", "hubd.handlers")))
    assert offenders == []
