"""The HTTP API: one blueprint a resource; each parses, authorises, calls a service and renders."""
