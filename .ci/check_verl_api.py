"""Check that every veRL name, argument, config key and batch key the ``verl`` trainer back-end
uses exists in the installed veRL.

Run by ``nox -s verl_api`` (veRL installed in its own environment on CPU; nothing is started, no
GPU needed). The names live in ``trinity.trainer.verl.api``; the config keys are those
``build_verl_config`` writes for the example configs, checked against veRL's generated defaults.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import os
import sys
from pathlib import Path

import verl
from omegaconf import OmegaConf

from trinity.trainer.verl.api import VERL_API, VERL_BATCH_KEYS, VERL_META_KEYS, VERL_ROLES, VERL_SOURCE

ROOT = Path(__file__).resolve().parents[1]
VERL_ROOT = Path(verl.__file__).resolve().parents[1]


def resolve(target: str) -> object:
    module, _, attr = target.partition(":")
    obj: object = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def names_of(obj: object) -> set[str]:
    """Parameters of a callable, plus attributes and dataclass fields of a class."""
    names: set[str] = set()
    if inspect.isclass(obj):
        names |= set(dir(obj))
        if dataclasses.is_dataclass(obj):
            names |= {f.name for f in dataclasses.fields(obj)}
    with contextlib.suppress(TypeError, ValueError):
        names |= set(inspect.signature(obj).parameters)
    return names


def check_names() -> list[str]:
    problems = []
    for target, wanted in VERL_API.items():
        try:
            obj = resolve(target)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{target}: missing ({exc})")
            continue
        missing = [n for n in wanted if n not in names_of(obj)]
        if missing:
            problems.append(f"{target}: no {', '.join(missing)}")
    return problems


def check_source_keys() -> list[str]:
    """Keys we set or read must appear, quoted, in the veRL file that reads or sets them."""
    problems = []
    for table in (VERL_META_KEYS, VERL_BATCH_KEYS):
        for key, rel in table.items():
            text = (VERL_ROOT / rel).read_text()
            if f'"{key}"' not in text and f"'{key}'" not in text and f"{key}=" not in text:
                problems.append(f"{key!r} no longer appears in {rel}")
    for rel, needles in VERL_SOURCE.items():
        text = (VERL_ROOT / rel).read_text()
        problems += [f"{needle!r} no longer appears in {rel}" for needle in needles if needle not in text]
    source = inspect.getsource(resolve("verl.workers.engine_workers:ActorRolloutRefWorker.__init__"))
    problems += [
        f"ActorRolloutRefWorker no longer accepts role {r!r}" for r in VERL_ROLES if f'"{r}"' not in source
    ]
    return problems


def _dataclass_fields(section: object) -> set[str]:
    """Fields of the dataclass a config section becomes (its ``_target_``): keys veRL accepts
    there though its generated defaults leave them out (``fsdp_config.mixed_precision``)."""
    target = section.get("_target_") if hasattr(section, "get") else None
    if not target:
        return set()
    module, _, name = str(target).rpartition(".")
    cls = getattr(importlib.import_module(module), name, None)
    return {f.name for f in dataclasses.fields(cls)} if cls and dataclasses.is_dataclass(cls) else set()


def check_config_keys() -> list[str]:
    """Every key build_verl_config writes for the examples, on GPUs and on CPU, exists in veRL's
    full defaults or is a field of the config dataclass its section becomes."""
    from trinity.config import load_config
    from trinity.trainer.verl.config import build_verl_config
    from trinity.trainer.verl.trainer import full_verl_config

    defaults_path = VERL_ROOT / "verl" / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    defaults = OmegaConf.load(defaults_path)
    problems = []

    def walk(tree: dict, prefix: str = "") -> None:
        for key, value in tree.items():
            path = f"{prefix}.{key}" if prefix else key
            parent = OmegaConf.select(defaults, prefix) if prefix else defaults
            # `in` on a DictConfig skips mandatory ("???") keys such as rollout.name; keys() does not.
            if parent is not None and hasattr(parent, "keys") and len(parent.keys()) == 0:
                continue  # an empty mapping in the defaults (`override_config: {}`) takes any keys
            if parent is None or key not in parent.keys():  # noqa: SIM118
                if parent is None or key not in _dataclass_fields(parent):
                    problems.append(f"{example} ({device}): {path} is not a veRL config key")
            elif isinstance(value, dict):
                walk(value, path)

    for example in ("ppo.yaml", "grpo.yaml"):
        for device in ("cuda", "cpu"):
            config = load_config(ROOT / "examples" / "verl" / example)
            config.trainer.dtype = "float32"  # writes the FSDP mixed-precision keys too
            translated = build_verl_config(config, device=device)
            walk(translated)
            full_verl_config(translated)  # merges without a type error
    return problems


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    problems = check_names() + check_source_keys() + check_config_keys()
    for problem in problems:
        print(f"MISSING  {problem}")
    version = getattr(verl, "__version__", "?")
    if problems:
        print(f"veRL {version}: {len(problems)} problem(s)")
        return 1
    n = sum(len(v) or 1 for v in VERL_API.values()) + len(VERL_META_KEYS) + len(VERL_BATCH_KEYS)
    n += sum(len(v) for v in VERL_SOURCE.values())
    print(f"veRL {version}: all {n} names, arguments and keys the verl back-end uses exist")
    return 0


if __name__ == "__main__":
    sys.exit(main())
