"""After a bulk change the reaper's next pass refreshes the planner's statistics of the tables
requests read (docs/design.md#targets), rather than autovacuum's next look a minute later: a
candidate read planned on the statistics of a fleet of three walks the wrong index at 20,000."""

from __future__ import annotations

from typing import Any

from app.services.reaper import reap_pass
from tests.support.concurrency import await_condition


def table_stats(sql: Any, table: str) -> tuple[int, Any]:
    """(rows changed since the last ANALYZE, the last manual ANALYZE) of ``table``."""
    row = sql.execute(
        "select n_mod_since_analyze, last_analyze from pg_stat_user_tables where relname = %s",
        (table,),
    ).fetchone()
    return int(row[0]), row[1]


def test_a_pass_after_a_bulk_change_analyses_the_table_and_the_next_pass_does_not(ctx, sql):
    _, before = table_stats(sql, "nodes")
    sql.execute(
        "insert into nodes (node_id, capabilities, attr_count, expires_at)"
        " select 'bulk-' || g, jsonb_build_array(jsonb_build_object('capability', 'board',"
        " 'attrs', jsonb_build_object('n', g::text))), 1, now() + interval '1 hour'"
        " from generate_series(1, 5000) as g"
    )
    # The inserting session reports its counts to the statistics at most once a second.
    await_condition(
        lambda: table_stats(sql, "nodes")[0] >= 5000, "the insert counted in pg_stat_user_tables"
    )

    report = reap_pass(ctx)

    assert "nodes" in report.analyzed, report
    mods, after = table_stats(sql, "nodes")
    assert after is not None and (before is None or after > before)
    assert mods < 5000
    assert reap_pass(ctx).analyzed == []
