"""The studio application: access token, jobs started from the page, the CLI command."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from trinity_studio import is_loopback, studio_url
from trinity_studio.app import TOKEN_COOKIE, TOKEN_HEADER, create_app
from trinity_studio.jobs import JobManager


def test_page_and_static_files_are_served(client):
    page = client.get("/")
    assert page.status_code == 200 and "Trinity Studio" in page.text
    for name in ("studio.js", "chart.js", "config.js", "runs.js", "experiences.js", "studio.css"):
        assert client.get(f"/static/{name}").status_code == 200
    assert "http" not in "".join(  # nothing is fetched from the network at run time
        line for line in page.text.splitlines() if "src=" in line or "href=" in line
    )


def test_token_is_required_on_every_request_when_set(demo_root):
    app = create_app(str(demo_root), token="s3cret")
    anonymous = TestClient(app)
    assert anonymous.get("/").status_code == 401
    assert anonymous.get("/api/runs").status_code == 401
    assert anonymous.get("/api/runs", headers={TOKEN_HEADER: "wrong"}).status_code == 401
    assert anonymous.get("/api/runs", headers={TOKEN_HEADER: "s3cret"}).status_code == 200
    browser = TestClient(app)
    first = browser.get("/?token=s3cret")
    assert first.status_code == 200 and first.cookies.get(TOKEN_COOKIE) == "s3cret"
    assert browser.get("/api/runs").status_code == 200  # the cookie carries it from now on
    assert browser.get("/static/studio.js").status_code == 200


def test_only_loopback_hosts_go_without_a_token():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4") and not is_loopback("example.org")
    assert studio_url("0.0.0.0", 9000, "abc") == f"http://{socket.gethostname()}:9000/?token=abc"
    assert studio_url("::1", 9000) == "http://[::1]:9000/"
    assert studio_url("127.0.0.1", 8080, None, "experiences") == "http://127.0.0.1:8080/#experiences"


def test_launch_prints_a_token_for_other_hosts(monkeypatch, capsys, tmp_path):
    import uvicorn

    import trinity_studio as studio

    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    studio.launch(host="0.0.0.0", port=9999, root=str(tmp_path))
    out = capsys.readouterr().out
    token = out.split("Access token: ")[1].split()[0]
    assert f"?token={token}" in out and served["host"] == "0.0.0.0" and served["port"] == 9999
    assert TestClient(served["app"]).get("/api/info").status_code == 401
    studio.launch(root=str(tmp_path), experience_file=str(tmp_path / "x.jsonl"))
    out = capsys.readouterr().out
    assert "Access token" not in out and "#experiences" in out
    info = TestClient(served["app"]).get("/api/info").json()
    assert info["experience_file"] == str(tmp_path / "x.jsonl")


# A stand-in for `trinity run --config FILE`: prints, then waits until SIGINT like the launcher.
_FAKE_RUN = (
    "import signal, sys, time\n"
    "print('started', sys.argv[1], flush=True)\n"
    "signal.signal(signal.SIGINT, lambda *a: (print('interrupted', flush=True), sys.exit(130)))\n"
    "time.sleep(60)\n"
)


def _wait_for(predicate, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_launch_streams_output_and_stop_sends_sigint(demo_root, tmp_path):
    app = create_app(str(demo_root))
    app.state.studio.jobs = JobManager([sys.executable, "-c", _FAKE_RUN])
    client = TestClient(app)
    config = {
        "project": "studio",
        "name": "launched",
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {"model_path": "m", "max_prompt_tokens": 8, "max_response_tokens": 8},
        "buffer": {"explorer_input": {"taskset": {"path": "data"}}},
    }
    bad = client.post("/api/jobs", json={"config": {**config, "buffer": {"batch_size": 0}}})
    assert bad.status_code == 400 and bad.json()["errors"][0]["key"] == "buffer.batch_size"
    job = client.post("/api/jobs", json={"config": config, "path": str(tmp_path / "job.yaml")}).json()
    assert job["status"] == "running" and job["job_dir"] == str(tmp_path / "ckpt" / "studio" / "launched")
    assert (tmp_path / "job.yaml").is_file()

    def output():
        return client.get(f"/api/jobs/{job['id']}/output").json()

    assert _wait_for(lambda: "started" in output()["text"])
    assert client.post(f"/api/jobs/{job['id']}/stop").status_code == 200
    assert _wait_for(lambda: output()["status"] != "running")
    final = output()
    assert (
        final["text"].endswith("interrupted\n") and final["exit_code"] == 130 and final["status"] == "failed"
    )
    assert (
        client.get(f"/api/jobs/{job['id']}/output", params={"offset": len(final["text"])}).json()["text"]
        == ""
    )
    assert client.get("/api/jobs/99/output").status_code == 404


def test_cli_command_is_registered_and_lazy():
    from trinity.cli import cli

    result = CliRunner().invoke(cli, ["studio", "--help"])
    assert result.exit_code == 0 and "--host" in result.output and "--root" in result.output
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from trinity.cli import cli\n"
        "out = CliRunner().invoke(cli, ['--help']).output\n"
        "assert 'studio' in out, out\n"
        "out = CliRunner().invoke(cli, ['plugins']).output\n"
        "assert 'command: studio' in out, out\n"
        # the hook module and the command's module load; the application and its server do not
        "heavy = ('fastapi', 'uvicorn', 'trinity_studio.app', 'torch', 'ray', 'transformers')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("port", ["0", "70000"])
def test_cli_rejects_bad_ports(port):
    from trinity.cli import cli

    assert CliRunner().invoke(cli, ["studio", "--port", port]).exit_code == 2
