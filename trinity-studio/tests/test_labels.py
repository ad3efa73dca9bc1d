"""The Labels page's API (the stores of the runs under the root, the next pair, a label, one
label per pair, the export as DPO rows), the studio the operator serves while it waits, and
``human_preference_annotation_mapper`` labelled over HTTP as the page does it."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from fastapi.testclient import TestClient

from trinity.data.annotation import HumanPreferenceAnnotationMapper, PreferenceStore
from trinity.data.operator import OperatorContext
from trinity.run_status import write_run_status
from trinity_studio.app import create_app
from trinity_studio.labels import serve_labels


def _store(root, project="demo", n=3) -> PreferenceStore:
    run = root / "p" / "job"
    write_run_status(run, "running", "")  # a run folder, as the launcher leaves it
    store = PreferenceStore(str(run / "annotation" / f"{project}.db"), project)
    store.add_pairs([(f"q{i}", f"a{i}", f"b{i}", {"prompt": f"q{i}"}) for i in range(n)])
    return store


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_stores_of_the_runs_under_the_root_are_listed(tmp_path):
    store = _store(tmp_path)
    elsewhere = PreferenceStore(str(tmp_path.parent / f"{tmp_path.name}-other.db"), "given")
    client = TestClient(create_app(str(tmp_path), label_stores=[elsewhere.path]))
    listed = client.get("/api/labels/projects").json()
    assert [(p["project"], p["store"]) for p in listed] == [("given", elsewhere.path), ("demo", store.path)]
    assert listed[1]["counts"] == {"pairs": 3, "labelled": 0, "skipped": 0, "pending": 3}


def test_labelling_through_the_api_gives_dpo_rows_once(tmp_path):
    store = _store(tmp_path)
    client = TestClient(create_app(str(tmp_path)))
    first = client.get("/api/labels/next", params={"store": store.path}).json()["pair"]
    assert (first["prompt"], first["answer1"], first["answer2"]) == ("q0", "a0", "b0")
    body = {"store": store.path, "pair_id": first["pair_id"], "choice": "answer2", "labelled_by": "ann"}
    answer = client.post("/api/labels", json=body)
    assert answer.status_code == 200 and answer.json()["counts"]["labelled"] == 1
    again = client.post("/api/labels", json={**body, "choice": "answer1", "labelled_by": "bob"})
    assert again.status_code == 409 and again.json()["label"]["labelled_by"] == "ann"
    after = client.get("/api/labels/next", params={"store": store.path, "after": first["position"]}).json()
    assert after["pair"]["prompt"] == "q1"
    assert client.post("/api/labels", json={**body, "pair_id": "nope"}).status_code == 404
    assert client.post("/api/labels", json={**body, "labelled_by": ""}).status_code == 400
    export = client.get("/api/labels/export", params={"store": store.path})
    rows = [json.loads(line) for line in export.text.splitlines()]
    assert [(r["prompt"], r["chosen"], r["rejected"], r["labelled_by"]) for r in rows] == [
        ("q0", "b0", "a0", "ann")
    ]


def test_only_known_stores_can_be_opened(tmp_path):
    _store(tmp_path)
    client = TestClient(create_app(str(tmp_path)))
    outside = tmp_path.parent / f"{tmp_path.name}-x.db"
    answer = client.get("/api/labels/next", params={"store": str(outside)})
    assert answer.status_code == 404 and not outside.exists(), "a request never creates a file"


def test_a_busy_port_is_reused_when_it_serves_the_store_and_refused_otherwise(tmp_path):
    store = _store(tmp_path)
    url = f"http://127.0.0.1:{_free_port()}"
    first = serve_labels(store.path, url, root=str(tmp_path))
    try:
        assert first.page_url == f"{url}/#labels?store={store.path}"
        with urllib.request.urlopen(f"{url}/api/labels/projects", timeout=5) as response:
            assert [p["store"] for p in json.load(response)] == [store.path]
        second = serve_labels(store.path, url)  # a studio is serving it there already
        assert second._server is None and second.page_url == first.page_url
        other = PreferenceStore(str(tmp_path.parent / f"{tmp_path.name}-o.db"))
        with pytest.raises(ValueError, match="the port is taken by something that does not serve"):
            serve_labels(other.path, url)
    finally:
        first.close()


def test_a_studio_reachable_from_other_machines_gets_a_token(tmp_path):
    store = _store(tmp_path)
    url = f"http://127.0.0.1:{_free_port()}"
    served = serve_labels(store.path, url, token="sesame")
    try:
        assert "?token=sesame#labels" in served.page_url
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(f"{url}/api/labels/projects", timeout=5)
    finally:
        served.close()


def _label_over_http(api_url: str, choices: dict[str, str], stop: threading.Event) -> None:
    """What the page does: ask for the next pair, post the choice, until nothing is left."""
    while not stop.is_set():
        try:
            with urllib.request.urlopen(f"{api_url}/api/labels/projects", timeout=5) as response:
                projects = json.load(response)
        except OSError:  # not served yet
            time.sleep(0.05)
            continue
        for project in projects:
            query = urllib.parse.urlencode({"store": project["store"]})
            with urllib.request.urlopen(f"{api_url}/api/labels/next?{query}", timeout=5) as response:
                pair = json.load(response)["pair"]
            if pair is None:
                continue
            body = {"store": project["store"], "pair_id": pair["pair_id"], "labelled_by": "http"}
            body["choice"] = choices[pair["prompt"]]
            request = urllib.request.Request(
                f"{api_url}/api/labels", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            urllib.request.urlopen(request, timeout=5).close()
        time.sleep(0.05)


def test_the_operator_serves_the_page_while_it_waits_and_stops_it_after(tmp_path):
    api_url = f"http://127.0.0.1:{_free_port()}"
    op = HumanPreferenceAnnotationMapper(
        wait_for_annotations=True, poll_interval=0.05, timeout=60, api_url=api_url
    )
    op.bind(OperatorContext(job_dir=str(tmp_path / "p" / "job"), checkpoint_root=str(tmp_path)))
    stop = threading.Event()
    person = threading.Thread(
        target=_label_over_http,
        args=(api_url, {"q0": "answer2", "q1": "skip", "q2": "answer1"}, stop),
        daemon=True,
    )
    person.start()
    rows = [{"prompt": f"q{i}", "answer1": f"a{i}", "answer2": f"b{i}"} for i in range(3)]
    try:
        out, metrics = op.process(rows)
    finally:
        stop.set()
        person.join()
    assert [(r["prompt"], r["chosen"], r["labelled_by"]) for r in out] == [
        ("q0", "b0", "http"),
        ("q2", "a2", "http"),
    ]
    assert metrics["skipped"] == 1
    with pytest.raises(OSError):  # the page's server is gone with the wait
        urllib.request.urlopen(f"{api_url}/api/labels/projects", timeout=2)
