"""The config builder's API: schema from the models, components, validation, YAML in and out."""

from __future__ import annotations

from pathlib import Path

import yaml

from trinity.config import load_config
from trinity.config.docs import iter_models
from trinity_studio.schema import BEGINNER_KEYS

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart" / "quickstart.yaml"


def test_schema_describes_every_model_and_field(client):
    schema = client.get("/api/schema").json()
    assert schema["root"] == "Config"
    for _, model in iter_models():
        described = schema["models"][model.__name__]
        assert [f["name"] for f in described["fields"]] == list(model.model_fields)
        assert all(f["doc"] for f in described["fields"])
    buffer = {f["name"]: f for f in schema["models"]["BufferConfig"]["fields"]}
    assert buffer["batch_size"] == {**buffer["batch_size"], "type": "int", "default": 1}
    assert buffer["explorer_input"]["type"] == "section"
    assert buffer["explorer_input"]["model"] == "ExplorerInput"
    tasksets = {f["name"]: f for f in schema["models"]["ExplorerInput"]["fields"]}["eval_tasksets"]
    assert (tasksets["type"], tasksets["model"]) == ("sections", "TasksetConfig")
    mode = {f["name"]: f for f in schema["models"]["Config"]["fields"]}["mode"]
    assert mode["type"] == "choice" and "both" in mode["choices"]


def test_beginner_keys_exist_and_component_fields_name_their_kind(client):
    schema = client.get("/api/schema").json()
    beginner = {f["path"]: f for f in schema["beginner"]}
    assert list(beginner) == list(BEGINNER_KEYS)
    assert beginner["algorithm.algorithm_type"]["component"] == "algorithm_type"
    reward = beginner["buffer.explorer_input.default_reward_fn_type"]
    assert (reward["component"], reward["args_field"]) == ("reward_fn", "taskset.reward_fn_args")
    assert beginner["buffer.explorer_input.default_workflow_type"]["component"] == "workflow"
    assert beginner["algorithm.algorithm_type"]["args_field"] is None  # algorithms take no arguments
    assert beginner["trainer.trainer_type"]["type"] == "choice"
    algorithm = {f["name"]: f for f in schema["models"]["AlgorithmConfig"]["fields"]}
    assert (algorithm["kl_loss_fn"]["component"], algorithm["kl_loss_fn"]["args_field"]) == (
        "kl_fn",
        "kl_loss_fn_args",
    )
    operator = {f["name"]: f for f in schema["models"]["OperatorConfig"]["fields"]}
    assert (operator["name"]["component"], operator["name"]["args_field"]) == ("operator", "args")


def test_components_list_what_trinity_plugins_lists_with_default_args(client):
    from trinity.plugins import get_component, list_components

    components = client.get("/api/components").json()
    assert [c["name"] for c in components["policy_loss_fn"]] == list_components("policy_loss_fn")
    ppo = next(c for c in components["policy_loss_fn"] if c["name"] == "ppo")
    assert ppo["args"] == get_component("policy_loss_fn", "ppo").default_args()
    assert ppo["plugin"]
    assert "math_workflow" in [c["name"] for c in components["workflow"]]
    assert "command" not in components  # CLI commands are no config component


def test_validation_reports_each_field_problem_on_one_line(client):
    config = {
        "model": {"model_path": "m", "max_prompt_tokens": 8, "max_response_tokens": 8},
        "buffer": {"batch_size": "eight", "explorer_input": {"taskset": {"pth": "x"}}},
    }
    result = client.post("/api/config/validate", json={"config": config}).json()
    assert not result["ok"]
    assert {e["key"]: e["message"] for e in result["errors"]} == {
        "buffer.batch_size": "expected an integer, got 'eight' (str)",
        "buffer.explorer_input.taskset.pth": "unknown key 'pth'; did you mean 'path'?",
    }
    assert all("\n" not in e["message"] for e in result["errors"])


def test_validation_runs_the_resolve_rules_of_trinity_run(client):
    config = {"model": {"model_path": "m", "max_prompt_tokens": 8, "max_response_tokens": 8}}
    result = client.post(
        "/api/config/validate", json={"config": {**config, "algorithm": {"algorithm_type": "grpoo"}}}
    )
    (error,) = result.json()["errors"]
    assert "grpoo" in error["message"] and "grpo" in error["message"]
    missing_env = {"model": {"model_path": "${oc.env:STUDIO_TEST_UNSET}"}}
    (error,) = client.post("/api/config/validate", json={"config": missing_env}).json()["errors"]
    assert error["key"] == "model.model_path" and "STUDIO_TEST_UNSET" in error["message"]


def test_quickstart_validates_and_dry_run_yaml_matches_load_config(client, tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKSTART_DIR", str(tmp_path))
    raw = client.post("/api/config/load", json={"path": str(QUICKSTART)}).json()["config"]
    assert raw["model"]["model_path"] == "${oc.env:QUICKSTART_DIR,./quickstart-run}/model"  # kept as written
    result = client.post("/api/config/validate", json={"config": raw}).json()
    assert result["ok"], result["errors"]
    assert result["yaml"] == load_config(QUICKSTART).to_yaml()


def test_upstream_configs_load_into_the_builder(client):
    for file in sorted((REPO / "tests" / "upstream_configs").rglob("*.yaml")):
        response = client.post("/api/config/load", json={"path": str(file)})
        assert response.status_code == 200, (file, response.text)
        assert isinstance(response.json()["config"], dict)


def test_save_writes_yaml_that_trinity_run_loads(client, tmp_path):
    config = {
        "project": "p",
        "name": "n",
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {"model_path": "m", "max_prompt_tokens": 8, "max_response_tokens": 8},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4, "optimizer": {}},
        "buffer": {"batch_size": 2, "total_steps": 3, "explorer_input": {"taskset": {"path": "data"}}},
    }
    target = tmp_path / "sub" / "job.yaml"
    saved = client.post("/api/config/save", json={"path": str(target), "config": config}).json()["path"]
    assert saved == str(target)
    assert "optimizer" not in yaml.safe_load(target.read_text())["algorithm"]  # empty sections pruned
    assert load_config(target).algorithm.repeat_times == 4
    text = client.post("/api/config/yaml", json={"config": config}).text
    assert yaml.safe_load(text)["buffer"]["total_steps"] == 3


def test_bad_yaml_and_missing_files_are_one_line_errors(client, tmp_path):
    response = client.post("/api/config/parse", json={"yaml": "a: [1,"})
    assert response.status_code == 400 and response.json()["detail"].startswith("invalid YAML at line")
    response = client.post("/api/config/load", json={"path": str(tmp_path / "none.yaml")})
    assert response.status_code == 400 and "no such file" in response.json()["detail"]
    response = client.post("/api/config/save", json={"path": "", "config": {}})
    assert response.status_code == 400
