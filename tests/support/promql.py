"""Just enough PromQL reading to check alert rules and dashboards against a hub's
/metrics: which metric names an expression reads, and which labels it
groups or matches by. Not a parser: it strips what cannot be a metric name
(strings, label matchers, ranges, grouping clauses, numbers) and keeps the
identifiers that are not functions or keywords."""

from __future__ import annotations

import re

KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
                      "group_right", "bool", "offset", "inf", "nan"})
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"(?<![\w:$.])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names


def grouping_labels(expr: str) -> set[str]:
    """Labels named in by/without/on/ignoring/group_* clauses."""
    text = _STRING.sub(" ", expr)
    labels = set()
    for match in _GROUPING.finditer(text):
        labels.update(part.strip() for part in match.group(2).split(",") if part.strip())
    return labels
