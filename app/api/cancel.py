"""Cancel (docs/api.md#post-v1runsrun_idcancel--cancel-a-run)."""

from __future__ import annotations

from app.api.common import caller, ctx, make_blueprint
from app.api.openapi import PRINCIPAL, RUN_ID, json_reply, operation
from app.api.schemas import RunStateSchema
from app.services.cancel import cancel_run

blp = make_blueprint("cancel", "Cancel queued or running runs")


@blp.route("/runs/<run_id>/cancel", methods=["POST"], parameters=[RUN_ID])
@blp.doc(
    **operation(
        {200: json_reply(RunStateSchema, "cancelled, or already finished (idempotent)")},
        {404: "no such run"},
        roles=("submitter", "operator"),
        parameters=[PRINCIPAL],
    )
)
def post_cancel(run_id: str) -> dict[str, str]:
    return cancel_run(ctx(), run_id, caller())
