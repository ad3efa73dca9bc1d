"""Every accepted config key has an effect, or is on the one no-effect list and warns once."""

from __future__ import annotations

import logging
import re
import typing
from functools import cache
from pathlib import Path

import pytest
from pydantic import BaseModel

from trinity.config import Config, load_config, no_effect
from trinity.config.no_effect import NO_EFFECT, covered, entry_for, find_no_effect, warn_no_effect
from trinity.config.validation import validate_config

REPO = Path(__file__).resolve().parents[3]
RUNTIME_ROOTS = [REPO / "trinity-core" / "src" / "trinity", *sorted(REPO.glob("trinity-plugins-*/src"))]
CONFIG_DIR = REPO / "trinity-core" / "src" / "trinity" / "config"

# Fields the runtime never names because `trinity/config/` consumes them: they are inputs of a
# derivation (resolve_config) or read by a constructed name (``getattr(algorithm, f"{key}_args")``).
CONSUMED_IN_CONFIG = {
    "algorithm.advantage_fn_args": "read as f'{key}_args' by the trainers",
    "algorithm.kl_penalty_fn_args": "read as f'{key}_args' by the trainers",
    "algorithm.policy_loss_fn_args": "read as f'{key}_args' by the trainers",
    "algorithm.kl_loss_fn_args": "read as f'{key}_args' by the trainers",
    "algorithm.entropy_loss_fn_args": "read as f'{key}_args' by the trainers",
    "buffer.explorer_input.default_eval_workflow_type": "resolve_config gives it to eval tasksets",
    "trainer.trainer_config_path": "resolve_config loads it into trainer.trainer_config",
    "stages[*].stage_name": "resolve_config names each stage's experiment after it",
    "algorithm.rollout_correction.loss_type": "only veRL's default (ppo_clip: the configured loss) is accepted",
}


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _container(annotation: object) -> str:
    """``[*]`` when the annotation holds its models in a list or mapping."""
    for arg in [annotation, *typing.get_args(annotation)]:
        if typing.get_origin(arg) in (list, dict):
            return "[*]"
    return ""


def config_fields() -> list[str]:
    """Dotted path of every leaf key of ``Config`` (stage sections are the global classes)."""
    out: list[str] = []

    def walk(model: type[BaseModel], path: str) -> None:
        for name, info in model.model_fields.items():
            key = f"{path}.{name}" if path else name
            subs = _models(info.annotation)
            if not subs:
                out.append(key)
            elif not key.startswith("stages[*]."):
                for sub in subs:
                    walk(sub, key + _container(info.annotation))
            else:
                pass  # a stage's sections: the same models as the global ones

    walk(Config, "")
    return out


@cache
def runtime_source() -> str:
    texts = []
    for root in RUNTIME_ROOTS:
        for file in root.rglob("*.py"):
            if CONFIG_DIR in file.parents:
                continue
            texts.append(file.read_text(encoding="utf-8"))
    return "\n".join(texts)


def read_by_runtime(name: str) -> bool:
    """A source-level check: ``.<name>`` or a ``"<name>"`` string outside ``trinity/config/``."""
    pattern = rf"\.{re.escape(name)}\b|[\"']{re.escape(name)}[\"']"
    return re.search(pattern, runtime_source()) is not None


def test_every_config_field_is_read_or_listed_as_no_effect() -> None:
    problems = []
    for key in config_fields():
        name = key.rsplit(".", 1)[-1]
        if covered(key) or key in CONSUMED_IN_CONFIG or read_by_runtime(name):
            continue
        problems.append(
            f"config field {key!r} is read by nothing in the runtime (no `.{name}` or '{name}' "
            "outside trinity/config/): make it work, or add it to NO_EFFECT in "
            "trinity/config/no_effect.py with a one-line reason (or to CONSUMED_IN_CONFIG here "
            "when resolve_config consumes it)"
        )
    assert not problems, "\n".join(problems)


def test_every_no_effect_entry_names_a_real_key() -> None:
    fields = config_fields()
    for entry in NO_EFFECT:
        assert entry.reason and "\n" not in entry.reason
        matches = [
            f
            for f in fields
            if any(entry_for(".".join(f.split(".")[:n])) is entry for n in range(1, f.count(".") + 2))
        ]
        assert matches, f"NO_EFFECT entry {entry.key!r} matches no config key; fix or remove it"


def test_every_no_effect_description_says_so() -> None:
    """The field descriptions of listed leaf keys tell readers of the docs too."""
    for entry in NO_EFFECT:
        if entry.key.startswith("**.") or read_by_runtime(entry.key.rsplit(".", 1)[-1]):
            continue  # a shared key that works in other places; its description says where
        model: type[BaseModel] = Config
        info = None
        for part in re.sub(r"\[\*\]", "", entry.key).split("."):
            info = model.model_fields[part]
            subs = _models(info.annotation)
            model = subs[0] if subs else model
        assert info is not None and "no effect" in (info.description or "").lower(), entry.key


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(no_effect, "_warned", set())


def _config(data: dict) -> Config:
    return validate_config({"model": {"model_path": "m"}, **data})


def test_set_keys_warn_and_defaults_do_not() -> None:
    config = _config(
        {
            "explorer": {
                "over_rollout": {"ratio": 0.0, "wait_after_min": 30.0},  # off, as upstream's default
                "max_inflight_batches": 4,
                "rollout_model": {"enable_expert_parallel": True, "use_v1": True},
                "auxiliary_models": [{"model_path": "j", "enable_multimodal": True}],
            },
            "trainer": {"save_strategy": "unrestricted", "enable_preview": False},
            "model": {"model_path": "m", "tinker": {"enable": False, "rank": 8}, "repetition_penalty": 1.1},
            "synchronizer": {"sync_interval": 2, "trainer_sync_interval": 2},
            # image_key is read (simple_mm_workflow): no warning
            "buffer": {"explorer_input": {"tasksets": [{"path": "t", "format": {"image_key": "img"}}]}},
            "data_processor": {"experience_pipeline": {"save_input": True}},
            "stages": [{"stage_name": "s", "explorer": {"concurrent_mode": "asynchronous"}}],
        }
    )
    keys = [key for key, _ in find_no_effect(config)]
    assert keys == [
        "model.repetition_penalty",
        "explorer.rollout_model.enable_expert_parallel",
        "explorer.auxiliary_models[0].enable_multimodal",
        "explorer.max_inflight_batches",
        "trainer.enable_preview",
        "stages[0].explorer.concurrent_mode",
    ]


def test_enabled_sections_warn() -> None:
    config = _config(
        {
            "model": {"model_path": "m", "tinker": {"enable": True}},
            "explorer": {"dynamic_timeout": {"enable": True}, "over_rollout": {"ratio": 0.5}},
            "service": {"data_juicer": {"auto_start": True}},
            "data_processor": {"task_pipeline": {"inputs": ["raw.jsonl"]}},
        }
    )
    # over_rollout, dynamic_timeout and the task pipeline have their effect.
    assert [key for key, _ in find_no_effect(config)] == ["model.tinker", "service.data_juicer"]


def test_data_processor_keys_warn_only_where_they_change_nothing() -> None:
    trainer_buffer = {"name": "exp", "storage_type": "sql", "path": "sqlite:///exp.db"}
    base = {
        "buffer": {"trainer_input": {"experience_buffer": trainer_buffer}},
        "data_processor": {
            "task_pipeline": {"inputs": ["raw.jsonl"], "priority_weights": {"difficulty": 1.0}},
            "experience_pipeline": {"output": trainer_buffer},
        },
    }
    # priority_weights orders the tasks; an output naming the trainer's buffer is the one written.
    assert find_no_effect(_config(base)) == []
    other = {**trainer_buffer, "name": "elsewhere"}
    base["data_processor"]["experience_pipeline"] = {"output": other, "inputs": {"extra": other}}
    assert [key for key, _ in find_no_effect(_config(base))] == [
        "data_processor.experience_pipeline.inputs[extra]",
        "data_processor.experience_pipeline.output",
    ]


def test_native_only_trainer_keys_warn_under_verl_only() -> None:
    native = _config({"trainer": {"trainer_type": "native", "share_prompt_forward": False}})
    verl = _config({"trainer": {"trainer_type": "verl", "share_prompt_forward": False}})
    assert find_no_effect(native) == []
    assert [key for key, _ in find_no_effect(verl)] == ["trainer.share_prompt_forward"]


def test_warns_once_per_key_on_logger(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = _config({"trainer": {"save_strategy": "single_node"}, "monitor": {"detailed_stats": True}})
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        first = warn_no_effect(config)
        again = warn_no_effect(config)
    assert first == [
        "config key trainer.save_strategy has no effect in this version: "
        "checkpoint saving is not coordinated across processes",
        "config key monitor.detailed_stats has no effect in this version: "
        "std/max/min of evaluation metrics are not logged",
    ]
    assert again == []
    assert [r.getMessage() for r in caplog.records if r.name == "trinity.config"] == first


def test_load_config_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("model: {model_path: m}\nexplorer: {max_repeat_times_per_runner: 4}\n")
    with caplog.at_level(logging.WARNING, logger="trinity.config"):
        load_config(file, resolve=False)
    assert any("explorer.max_repeat_times_per_runner has no effect" in r.getMessage() for r in caplog.records)


def test_trinity_run_shows_the_warning_on_stderr(tmp_path: Path) -> None:
    import subprocess
    import sys

    file = tmp_path / "c.yaml"
    file.write_text(
        "model: {model_path: m, max_prompt_tokens: 8, max_response_tokens: 8}\n"
        "buffer: {explorer_input: {tasksets: [{path: t.jsonl}]}}\n"
        "explorer: {rollout_model: {enable_multimodal: true}}\n"
        "algorithm: {algorithm_type: ppo}\n"
    )
    code = "import sys; from trinity.cli import _load_config_or_exit; _load_config_or_exit(sys.argv[1])"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(file)], capture_output=True, text=True, timeout=120, check=False
    )
    assert "explorer.rollout_model.enable_multimodal has no effect in this version" in proc.stderr


def test_stage_prefix_and_wildcards_match() -> None:
    assert covered("stages[2].service.data_juicer.auto_start").key == "service.data_juicer"
    assert covered("buffer.explorer_input.tasksets[0].task_selector.kwargs").key == "**.task_selector.kwargs"
    assert covered("explorer.max_timeout") is None
