"""What the Record store tests share: the run they use and a seal with a typical verdict."""

from __future__ import annotations

from app.records import RecordStore

RUN = "run-0001"


def seal_example(rec: RecordStore, run_id: str = RUN) -> None:
    """Seal ``run_id`` as a finished two-step run would be sealed."""
    rec.seal(
        run_id,
        verdict={"state": "SUCCEEDED"},
        steps=[
            (1, "build", {"state": "SUCCEEDED", "node": "n1"}),
            (2, "test", {"state": "SUCCEEDED"}),
        ],
        events=[{"kind": "created"}, {"kind": "finished"}],
        manifest_update={"state": "SUCCEEDED", "ended_at": "2024-01-01T00:00:00Z"},
    )
