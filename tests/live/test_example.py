"""The README's example, played against a real gunicorn: every status it expects, a queued run
promoted by the cancel, and its steps carried through to a SUCCEEDED verdict and a sealed Record."""

import requests

from app.dev.example import run_example
from tests.support.apps import TOKEN


def test_the_readme_example_runs_to_a_sealed_record_on_gunicorn(live_server):
    lines: list[str] = []
    run_example(live_server.url, TOKEN, echo=lines.append)
    text = "\n".join(lines)
    assert "## the sealed Record\n-> 200" in text
    view = requests.get(
        live_server.url + "/v1/runs/kernel-4712-boot", headers=live_server.headers(), timeout=5
    ).json()
    assert view["state"] == "SUCCEEDED"
    assert [s["state"] for s in view["steps"]] == ["DONE", "DONE"]
    first = requests.get(
        live_server.url + "/v1/runs/kernel-4711-boot", headers=live_server.headers(), timeout=5
    ).json()
    assert first["state"] == "FAILED"
    assert first["verdict"]["checks"][0]["note"] == "cancelled by: example@lab.test"
