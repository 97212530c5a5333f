"""Node adverts: the agents' heartbeat (SPEC §4)."""

from __future__ import annotations

from typing import Any

from app.api.common import caller, ctx, doc_json, make_blueprint
from app.api.schemas import AdvertReplySchema, ErrorBodySchema, NodeAdvertSchema
from app.services.nodes import advertise

blp = make_blueprint("nodes", "Node agents advertise what they can do")


@blp.route("/nodes", methods=["POST"])
@blp.arguments(NodeAdvertSchema)
@blp.doc(
    responses={
        "200": doc_json(AdvertReplySchema, "the node's leases"),
        "400": doc_json(ErrorBodySchema, "bad body"),
    }
)
def post_advert(body: dict[str, Any]) -> dict[str, Any]:
    return advertise(ctx(), body, caller().principal)
