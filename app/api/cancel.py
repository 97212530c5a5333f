"""Cancel (SPEC §9)."""

from __future__ import annotations

from app.api.common import caller, ctx, doc_json, make_blueprint
from app.api.schemas import ErrorBodySchema, RunStateSchema
from app.services.cancel import cancel_run

blp = make_blueprint("cancel", "Cancel queued or running runs")


@blp.route("/runs/<run_id>/cancel", methods=["POST"])
@blp.doc(
    responses={
        "200": doc_json(RunStateSchema, "cancelled, or already finished"),
        "404": doc_json(ErrorBodySchema, "unknown run"),
    }
)
def post_cancel(run_id: str) -> dict[str, str]:
    return cancel_run(ctx(), run_id, caller())
