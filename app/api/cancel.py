"""Cancel (SPEC §9)."""

from __future__ import annotations

from app.api.common import caller, ctx, make_blueprint, requires_role
from app.api.schemas import ErrorBodySchema, RunStateSchema
from app.services.cancel import cancel_run

blp = make_blueprint("cancel", "Cancel queued or running runs")


@blp.route("/runs/<run_id>/cancel", methods=["POST"])
@requires_role("submitter", "operator")
@blp.doc(
    responses={
        "200": {"description": "cancelled, or already finished", "content": {"application/json": {"schema": RunStateSchema}}},
        "404": {"description": "unknown run", "content": {"application/json": {"schema": ErrorBodySchema}}},
    }
)
def post_cancel(run_id: str) -> dict[str, str]:
    return cancel_run(ctx(), run_id, caller())
