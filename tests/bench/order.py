"""The order variants run in within a round of a side-by-side benchmark.

Always running the baseline first biased the paired ratios: with hubd at
the same revision on both sides (bench_local --base-rev HEAD --hubd-rev HEAD,
8 rounds) the second-run variant measured 0.93x msg/s and 1.05x CPU per
message in scenario a. Reversing the order every other round puts each
variant first equally often, so that bias cancels in the median of ratios.
"""

from __future__ import annotations


def in_turn(variants: list[str], round_no: int) -> list[str]:
    """`variants` as given in odd rounds (1, 3, ...), reversed in even ones."""
    return list(variants) if round_no % 2 else list(reversed(variants))
