"""Unicode format characters (category Cf: bidi overrides such as U+202E, zero-width characters)
(docs/security.md#runs-records-and-uploads): names that become files of a Record refuse them as they
refuse control characters, with a 400 naming the field; adverts and results, which are never refused
for their text (docs/compatibility.md#compatibility-with-the-original-fleets-agent-and-runctl), keep
them as U+FFFD, as they keep a NUL. A name could otherwise show one file and be another:
``report\\u202etxt.exe`` reads as ``reportexe.txt``."""

from __future__ import annotations

import sys
import unicodedata
from urllib.parse import quote

import pytest

import app.contract.fields
from tests.support.actors import cap
from tests.support.agent import advertise, claimed
from tests.support.contracts import contract_naming
from tests.support.rows import find_run, one, scalar, step_row
from tests.support.scenes import placed_on_n1
from tests.support.submitter import submit
from tests.support.wire import error_of

one_app_per_module = True

FORMAT = ["\u202e", "\u200b", "\u200d", "\ufeff", "\u2066", "\u00ad", "\U000e0041"]
FORMAT_IDS = ["RLO", "ZWSP", "ZWJ", "BOM", "LRI", "SHY", "TAG-A"]
WHERE = ["out", "in.from", "ask.out", "ask.show", "loop.until.produced", "success_when.produced"]


def test_the_format_characters_refused_are_every_character_of_category_cf():
    every_cf = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"]

    # Looked up at call time: a module without it fails this test, not the whole file.
    has_format_character = app.contract.fields.has_format_character
    assert all(has_format_character(f"a{c}b") for c in every_cf)
    assert not has_format_character("plain name-1.2_x:y@z é ü 日本 \U0001f600")


@pytest.mark.parametrize("char", FORMAT, ids=FORMAT_IDS)
@pytest.mark.parametrize("where", WHERE)
def test_an_artifact_name_with_a_format_character_is_a_400_naming_the_field(
    client, sql, where, char
):
    advertise(client, "n1", cap("board"))
    doc, path = contract_naming(where, f"report{char}txt.exe")

    resp = submit(client, doc)

    assert resp.status_code == 400, resp.get_json()
    assert error_of(resp).startswith(f"{path} must not contain a Unicode format character, got ")
    assert find_run(sql, "r1") is None


@pytest.mark.parametrize("char", FORMAT, ids=FORMAT_IDS)
def test_an_upload_name_with_a_format_character_is_a_400_naming_name_and_stores_nothing(
    client, sql, ctx, char
):
    placed_on_n1(client)
    name = f"report{char}txt.exe"

    resp = client.put(f"/v1/runs/r1/steps/1/blob/{quote(name)}", data=b"MZ")

    assert resp.status_code == 400
    assert error_of(resp) == f"name must not contain a Unicode format character, got {name!r}"
    assert char not in error_of(resp)  # the reason shows it escaped, never as itself
    assert scalar(sql, "select count(*) from blobs") == 0
    blobs = ctx.records.path("r1") / "blobs"
    assert not blobs.exists() or list(blobs.iterdir()) == []


@pytest.mark.parametrize("char", FORMAT, ids=FORMAT_IDS)
def test_a_log_name_with_a_format_character_is_a_400_naming_name(client, char):
    placed_on_n1(client)

    put = client.put("/v1/runs/r1/steps/1/log", query_string={"name": f"a{char}b"}, data=b"x\n")

    assert put.status_code == 400
    assert error_of(put).startswith("name must be")


def test_format_characters_in_an_advert_become_u_fffd(client, sql):
    advert = {
        "node_id": "n1",
        "label": "rack\u202e7 board",
        "instance": "boot\u200b1",
        "capabilities": [
            {"capability": "board", "attrs": {"ro\u2066om": "b\u200d1", "soc": "x\ufeff"}}
        ],
    }

    assert client.post("/v1/nodes", json=advert).status_code == 200

    node = one(sql, "select label, instance, capabilities from nodes")
    assert node == {
        "label": "rack\ufffd7 board",
        "instance": "boot\ufffd1",
        "capabilities": [
            {"capability": "board", "attrs": {"ro\ufffdom": "b\ufffd1", "soc": "x\ufffd"}}
        ],
    }


def test_format_characters_in_a_result_become_u_fffd_and_the_result_is_taken(client, sql):
    placed_on_n1(client)
    step = claimed(client, "n1")
    result = {
        "node": "n1",
        "exit_code": 1,
        "produced": [],
        "error": "flash failed at \u202eoffset\u202c 0x40",
        "diagnostics": {"ste\u200bp": ["\U000e0041x"]},
    }

    resp = client.post(f"/v1/runs/r1/steps/{step['seq']}/result", json=result)

    assert resp.status_code == 200, resp.get_json()
    row = step_row(sql, "r1", 1, "error, result")
    assert row["error"] == "flash failed at \ufffdoffset\ufffd 0x40"
    assert row["result"]["diagnostics"] == {"ste\ufffdp": ["\ufffdx"]}


def test_control_characters_in_a_result_error_are_kept(client, sql):
    # Only format characters (and NUL) are replaced: an error's newlines and tabs are its text.
    placed_on_n1(client)
    step = claimed(client, "n1")

    resp = client.post(
        f"/v1/runs/r1/steps/{step['seq']}/result",
        json={"node": "n1", "exit_code": 1, "produced": [], "error": "line 1\n\tline 2"},
    )

    assert resp.status_code == 200
    assert step_row(sql, "r1", 1, "error")["error"] == "line 1\n\tline 2"
