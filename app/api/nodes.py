"""Node adverts: the agents' heartbeat (SPEC §4)."""

from __future__ import annotations

from typing import Any

from app.api.common import caller, ctx, make_blueprint
from app.api.openapi import json_reply, operation
from app.api.schemas import AdvertReplySchema, NodeAdvertSchema
from app.services.nodes import advertise

blp = make_blueprint("nodes", "Node agents advertise what they can do")


@blp.route("/nodes", methods=["POST"])
@blp.arguments(NodeAdvertSchema())  # one instance: not a schema built for every advert
@blp.doc(
    **operation(
        {200: json_reply(AdvertReplySchema, "taken: the node's leases, renewed")},
        {
            400: "bad body: not JSON, not an object, node_id is missing, or a field of the wrong "
            "type or length (the reason names it)",
            413: "body over max_body_bytes",
        },
        roles=("node", "operator"),
    )
)
def post_advert(body: dict[str, Any]) -> dict[str, Any]:
    return advertise(ctx(), body, caller().principal)
