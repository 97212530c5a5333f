"""Reading ``GET /metrics`` the way Prometheus does: prometheus-client's own parser."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of the text: (sample name, sorted labels) -> value. A sample twice is an
    error (two processes' figures side by side would be)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in samples, f"sample given twice: {key}"
            samples[key] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; a labelled series never touched yet counts 0."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def has(samples: Samples, name: str) -> bool:
    return any(key[0] == name for key in samples)


def scrape(client: Any) -> Samples:
    """``GET /metrics`` through a Flask test client; it must answer 200 in Prometheus text."""
    resp = client.get("/metrics")
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return parse(resp.get_data(as_text=True))
