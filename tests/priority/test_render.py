"""The client's one-line explanation of a wait names the priority and the reservations
(docs/priorities.md#what-you-see)."""

from __future__ import annotations

from app.client.render import queue_line


def line(**candidates: int) -> dict[str, object]:
    return {
        "as": "dut",
        "capability": "board",
        "attrs": {},
        "candidates": {
            "live": 2,
            "busy": 1,
            "draining": 0,
            "quarantined": 0,
            "reserved": 0,
            **candidates,
        },
        "held_by": ["a"],
        "reserved_by": ["w"] if candidates.get("reserved") else [],
    }


def test_a_plain_wait_reads_as_before():
    view = {"queue": {"position": 1, "ahead": 0}, "priority": 0, "reserving": False}
    view["requires"] = [line()]
    assert queue_line(view) == "position 1 (0 ahead); dut [board]: 1 of 2 busy, held by a, 1 free"


def test_priority_reservation_and_reserved_candidates_are_named():
    view = {
        "queue": {"position": 2, "ahead": 1},
        "priority": 5,
        "reserving": True,
        "reserved": ["n1", "n2"],
        "requires": [line(reserved=1)],
    }
    assert queue_line(view) == (
        "position 2 (1 ahead), priority 5, reserving n1, n2;"
        " dut [board]: 1 of 2 busy, held by a, 1 reserved by w, 1 free"
    )
