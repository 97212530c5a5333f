"""Node adverts: the agents' heartbeat (docs/queue.md#heartbeats-what-a-node-learns)."""

from __future__ import annotations

from typing import Any

from app.api.common import caller, ctx, make_blueprint
from app.api.openapi import NODE_ID, json_reply, operation
from app.api.schemas import (
    AdvertReplySchema,
    NodeAdvertSchema,
    NodeDrainBodySchema,
    NodeQuarantineBodySchema,
    NodeViewSchema,
)
from app.services.nodes import advertise
from app.services.operators import hold_node, lift_node, quarantine_node, resume_node

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


# ---------------------------------------------------------------- operators (docs/operators.md)

_NODE_ERRORS = {
    400: "a node_id that is no valid name",
    403: "not an operator",
    404: "no such node: it never advertised",
}


@blp.route("/nodes/<node_id>/drain", methods=["POST"], parameters=[NODE_ID])
@blp.arguments(NodeDrainBodySchema())
@blp.doc(
    **operation(
        {200: json_reply(NodeViewSchema, "held: the node's line")},
        {**_NODE_ERRORS, 400: "a bad node_id or mode, or reason missing, empty or over 1 KiB"},
        roles=("operator",),
    )
)
def post_drain(body: dict[str, Any], node_id: str) -> dict[str, Any]:
    return hold_node(ctx(), node_id, body, caller())


@blp.route("/nodes/<node_id>/drain", methods=["DELETE"], parameters=[NODE_ID])
@blp.doc(
    **operation(
        {200: json_reply(NodeViewSchema, "the hold lifted (or none was set): the node's line")},
        _NODE_ERRORS,
        roles=("operator",),
    )
)
def delete_drain(node_id: str) -> dict[str, Any]:
    return resume_node(ctx(), node_id, caller())


@blp.route("/nodes/<node_id>/quarantine", methods=["POST"], parameters=[NODE_ID])
@blp.arguments(NodeQuarantineBodySchema())
@blp.doc(
    **operation(
        {200: json_reply(NodeViewSchema, "quarantined: the node's line")},
        {**_NODE_ERRORS, 400: "a bad node_id, or reason missing, empty or over 1 KiB"},
        roles=("operator",),
    )
)
def post_quarantine(body: dict[str, Any], node_id: str) -> dict[str, Any]:
    return quarantine_node(ctx(), node_id, body, caller())


@blp.route("/nodes/<node_id>/quarantine", methods=["DELETE"], parameters=[NODE_ID])
@blp.doc(
    **operation(
        {200: json_reply(NodeViewSchema, "lifted (or none was set): the node's line")},
        _NODE_ERRORS,
        roles=("operator",),
    )
)
def delete_quarantine(node_id: str) -> dict[str, Any]:
    return lift_node(ctx(), node_id, caller())
