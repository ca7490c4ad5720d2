"""hubd/actors/timers.py: the Router's timers are commands due at a time,
kept by key (no loop handle in state), bounded by the live ones."""

from hubd.actors.timers import TimerHeap


def test_due_commands_come_in_time_order_and_once():
    heap = TimerHeap()
    heap.push(3.0, "c")
    heap.push(1.0, "a")
    heap.push(2.0, "b")
    assert heap.next_at() == 1.0
    assert heap.due(2.5) == ["a", "b"]
    assert heap.due(2.5) == []
    assert heap.next_at() == 3.0 and len(heap) == 1


def test_a_cancelled_timer_never_comes_and_the_heap_stays_bounded():
    heap = TimerHeap()
    keys = [heap.push(float(i), i) for i in range(1000)]
    for key in keys[:-1]:
        heap.cancel(key)
    heap.cancel(None)  # a waiter without a timer
    heap.cancel(keys[0])  # twice
    assert len(heap) == 1 and heap.next_at() == 999.0
    assert len(heap._heap) <= 2 * len(heap) + 64  # cancelled entries were dropped
    assert heap.due(10_000.0) == [999]
