"""Side-by-side benchmarks put each variant first in half the rounds."""

from tests.bench.order import in_turn


def test_variants_alternate_which_runs_first():
    variants = ["hubd-base", "hubd"]
    assert [in_turn(variants, r) for r in (1, 2, 3, 4)] == [
        ["hubd-base", "hubd"], ["hubd", "hubd-base"], ["hubd-base", "hubd"], ["hubd", "hubd-base"]]
    assert variants == ["hubd-base", "hubd"]  # the caller's list is left as it was


def test_three_variants_reverse_whole():
    assert in_turn(["reference", "hubd", "hubd-private"], 2) == ["hubd-private", "hubd", "reference"]
