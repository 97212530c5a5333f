"""A run's stored files (docs/security.md#runs-records-and-uploads) are counted in the database, so
the caps hold when uploads of one run arrive at once through several worker processes (here two apps
on one fresh database and one Record store): exactly as many blobs as fit are stored, every other
one is 413, and the run's count is the bytes on disk."""

from __future__ import annotations

from tests.support.actors import cap
from tests.support.agent import advertise, claimed
from tests.support.concurrency import apps_on, connect, race
from tests.support.contracts import contract, role
from tests.support.submitter import submit

UPLOADS = 8  # four threads of each of two worker processes
BLOB = 300


def _placed(client):
    advertise(client, "n1", cap("board"))
    steps = [{"id": "build", "uses": "dut", "run": ["make"]}]
    submit(client, contract("r1", role("dut"), steps=steps), 201)
    claimed(client, "n1")


def test_blobs_uploaded_at_once_through_two_processes_store_only_what_fits_the_run(
    fresh_db_url, tmp_path
):
    records = tmp_path / "records"
    keys = {"records.max_run_bytes": 1000}
    with apps_on(fresh_db_url, records, 2, **keys) as apps, connect(fresh_db_url) as sql:
        _placed(apps.client(0))
        clients = [apps.client(k % 2) for k in range(UPLOADS)]

        resps = race(
            *(
                (lambda c=c, k=k: c.put(f"/v1/runs/r1/steps/1/blob/part-{k}", data=b"p" * BLOB))
                for k, c in enumerate(clients)
            )
        )

        codes = sorted(r.status_code for r in resps)
        assert codes == [204] * 3 + [413] * (UPLOADS - 3), codes
        stored = sorted(p.name for p in (records / "r1" / "blobs").iterdir())
        assert len(stored) == 3
        assert sql.execute("select count(*), sum(bytes) from blobs").fetchone() == (3, 3 * BLOB)
        assert sql.execute("select stored_bytes from runs").fetchone() == (3 * BLOB,)


def test_blobs_of_one_step_uploaded_at_once_make_at_most_max_step_files_files(
    fresh_db_url, tmp_path
):
    records = tmp_path / "records"
    keys = {"records.max_step_files": 5}
    with apps_on(fresh_db_url, records, 2, **keys) as apps, connect(fresh_db_url) as sql:
        _placed(apps.client(0))
        clients = [apps.client(k % 2) for k in range(UPLOADS)]

        resps = race(
            *(
                (lambda c=c, k=k: c.put(f"/v1/runs/r1/steps/1/blob/part-{k}", data=b"p"))
                for k, c in enumerate(clients)
            )
        )

        codes = sorted(r.status_code for r in resps)
        assert codes == [204] * 5 + [413] * (UPLOADS - 5), codes
        assert len(list((records / "r1" / "blobs").iterdir())) == 5
        assert sql.execute("select count(*) from blobs").fetchone() == (5,)
        assert sql.execute("select stored_files from steps").fetchone() == (5,)


def test_logs_appended_at_once_through_two_processes_stop_at_the_runs_byte_cap(
    fresh_db_url, tmp_path
):
    records = tmp_path / "records"
    keys = {"records.max_run_bytes": 1000}
    with apps_on(fresh_db_url, records, 2, **keys) as apps, connect(fresh_db_url) as sql:
        _placed(apps.client(0))
        clients = [apps.client(k % 2) for k in range(UPLOADS)]

        resps = race(
            *(
                (
                    lambda c=c, k=k: c.put(
                        "/v1/runs/r1/steps/1/log",
                        query_string={"name": f"log-{k % 4}"},
                        data=b"Q" * BLOB,
                    )
                )
                for k, c in enumerate(clients)
            )
        )

        assert [r.status_code for r in resps] == [200] * UPLOADS
        on_disk = sum(p.stat().st_size for p in (records / "r1" / "logs").iterdir())
        written = sum(p.read_bytes().count(b"Q") for p in (records / "r1" / "logs").iterdir())
        assert written == 1000  # every byte the cap allows, and not one more
        assert sql.execute("select stored_bytes from runs").fetchone() == (on_disk,)
        assert sum(r.headers.get("X-Enode-Log-Capped") == "1" for r in resps) >= UPLOADS - 3
