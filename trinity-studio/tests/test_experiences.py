"""The Experiences page's API: paging, filters, one experience's tokens, export."""

from __future__ import annotations

import json

import pytest

from trinity_studio.demo import demo_experiences, write_jsonl_experiences
from trinity_studio.experiences import FileSource, Filters

from .conftest import DEMO_EXPERIENCES


@pytest.fixture
def sql_source(demo_root):
    return str(demo_root / "demo" / "tiny" / "buffer" / "experiences.db")


def test_sql_pages_through_rows_in_id_order(client, sql_source):
    page = client.get("/api/experiences", params={"source": sql_source, "offset": 100, "limit": 50}).json()
    assert page["total"] == DEMO_EXPERIENCES
    assert [r["id"] for r in page["rows"]] == list(range(101, DEMO_EXPERIENCES + 1))
    assert page["kind"] == "sql" and page["table"] == "experiences"
    row = page["rows"][0]
    assert set(row) >= {"reward", "model_version", "explorer_step", "consumed_step", "prompt", "response"}


def test_sql_filters_by_reward_and_step(client, sql_source):
    expected = [e for e in demo_experiences(DEMO_EXPERIENCES)]
    page = client.get(
        "/api/experiences", params={"source": sql_source, "min_reward": 0.5, "limit": 500}
    ).json()
    assert page["total"] == sum(e.reward >= 0.5 for e in expected)
    assert all(r["reward"] == 1.0 for r in page["rows"])
    page = client.get("/api/experiences", params={"source": sql_source, "step": 2, "max_reward": 0}).json()
    assert page["total"] == sum(e.eid.batch == 2 and e.reward == 0 for e in expected)
    assert {r["explorer_step"] for r in page["rows"]} == {2}


def test_sql_item_has_the_token_level_arrays(client, sql_source):
    item = client.get("/api/experiences/item", params={"source": sql_source, "id": 4}).json()
    exp = list(demo_experiences(4))[3]
    assert item["tokens"] == exp.tokens.tolist()
    assert item["prompt_length"] == exp.prompt_length
    assert item["logprobs"] == pytest.approx(exp.logprobs.tolist())
    assert item["action_mask"] == exp.action_mask.tolist()
    assert item["advantages"] == pytest.approx(exp.advantages.tolist())
    assert item["response_text"] == exp.response_text
    assert client.get("/api/experiences/item", params={"source": sql_source, "id": 10**6}).status_code == 404


def test_export_streams_matching_experiences_as_jsonl(client, sql_source):
    response = client.get("/api/experiences/export", params={"source": sql_source, "min_reward": 1})
    lines = response.text.splitlines()
    assert response.headers["content-disposition"] == 'attachment; filename="experiences.jsonl"'
    assert len(lines) == sum(e.reward == 1 for e in demo_experiences(DEMO_EXPERIENCES))
    assert all(json.loads(line)["reward"] == 1 for line in lines)


def test_file_source_pages_filters_and_exports(client, tmp_path):
    path = tmp_path / "debug.jsonl"
    write_jsonl_experiences(str(path), 30)
    page = client.get("/api/experiences", params={"source": str(path), "offset": 10, "limit": 5}).json()
    assert (page["total"], page["kind"]) == (30, "file")
    assert [r["id"] for r in page["rows"]] == [11, 12, 13, 14, 15]
    item = client.get("/api/experiences/item", params={"source": str(path), "id": 11}).json()
    assert item["response_text"] == list(demo_experiences(11))[10].response_text
    exported = client.get("/api/experiences/export", params={"source": str(path), "min_reward": 1}).text
    assert len(exported.splitlines()) == 10


def test_file_being_written_is_read_line_by_complete_line(tmp_path):
    path = tmp_path / "live.jsonl"
    write_jsonl_experiences(str(path), 3)
    complete = path.read_bytes()
    last = complete.splitlines(keepends=True)[-1]
    path.write_bytes(complete + last[:40])  # a writer midway through its fourth line
    source = FileSource(str(path))
    assert source.page(0, 10, Filters())["total"] == 3
    with open(path, "ab") as f:
        f.write(last[40:])
    assert source.page(0, 10, Filters())["total"] == 4
    path.write_bytes(complete[: len(complete) - len(last)])  # rewritten shorter: indexed anew
    assert source.page(0, 10, Filters())["total"] == 2


def test_file_source_reads_in_chunks(tmp_path, monkeypatch):
    import trinity_studio.experiences as experiences

    monkeypatch.setattr(experiences, "_CHUNK_BYTES", 1000)  # a few lines per chunk
    path = tmp_path / "chunks.jsonl"
    write_jsonl_experiences(str(path), 25)
    source = FileSource(str(path))
    rows = source.page(0, 100, Filters())["rows"]
    assert [r["id"] for r in rows] == list(range(1, 26))
    assert [r["prompt"] for r in rows] == [e.prompt_text for e in demo_experiences(25)]
    assert source.item(25, None)["response_text"] == list(demo_experiences(25))[24].response_text


def test_unknown_sources_are_one_line_errors(client, tmp_path):
    response = client.get("/api/experiences", params={"source": str(tmp_path / "none.jsonl")})
    assert response.status_code == 400 and "no experience file" in response.json()["detail"]
    response = client.get("/api/experiences", params={"source": str(tmp_path / "none.db")})
    assert response.status_code == 400 and "no SQLite database" in response.json()["detail"]


def test_sources_list_the_buffers_of_runs(client, sql_source):
    assert client.get("/api/experiences/sources").json() == [sql_source]
