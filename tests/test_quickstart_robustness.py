"""``examples/quickstart/robustness.py``: its settings reach the job, and its table reports each
run and the spread of the gain. (The runs themselves are the README's table.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "robustness.py"


def load():
    spec = importlib.util.spec_from_file_location("quickstart_robustness", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_change_of_rounding_reaches_the_resolved_config(tmp_path: Path, monkeypatch):
    from trinity.config import load_config

    robustness = load()
    monkeypatch.setenv("QUICKSTART_DIR", str(tmp_path))
    monkeypatch.setenv("QUICKSTART_SEED", "2")
    seen = {}
    for name, (_seed, _env, changes) in robustness.SETTINGS.items():
        folder = tmp_path / str(len(seen))
        folder.mkdir()
        config = load_config(robustness.variant_config(folder, changes))
        seen[name] = (
            config.explorer.rollout_model.enforce_eager,
            config.trainer.share_prompt_forward,
            config.trainer.dtype,
        )
        # The seeds stay the environment's (run.py --seed sets QUICKSTART_SEED).
        assert config.trainer.seed == 2 and config.explorer.rollout_model.seed == 2
        assert "${oc.env:QUICKSTART_SEED,0}" in yaml.safe_dump(
            yaml.safe_load((folder / "quickstart.yaml").read_text())
        )
    base = seen["seed 0"]
    assert seen["transformers' forward"] == (True, *base[1:])
    assert seen["no shared prompt forward"] == (base[0], False, base[2])
    assert seen["bf16 autocast"] == (*base[:2], "bfloat16")
    assert robustness.SETTINGS["1 torch thread"][1] == {"OMP_NUM_THREADS": "1"}
    assert [s for s, _, _ in robustness.SETTINGS.values()].count(0) == 5  # seed 0 under every change


def test_the_table_gives_every_run_and_the_spread_of_the_gain():
    robustness = load()
    results = [
        {
            "name": "seed 0",
            "before": 4.0,
            "after": 32.0,
            "minutes": 2.2,
            "blind_before": 33.0,
            "blind_after": 27.0,
        },
        {
            "name": "seed 1",
            "before": 9.0,
            "after": 52.0,
            "minutes": 2.0,
            "blind_before": 39.0,
            "blind_after": 52.0,
        },
        {"name": "bf16 autocast", "error": "run.py exited 1; see out.log"},
    ]
    text = robustness.table(results)
    assert "| seed 0 | 4% | 32% | **+28** | 33% | 27% | 2.2 min |" in text
    assert "| seed 1 | 9% | 52% | **+43** |" in text
    assert "| bf16 autocast | run.py exited 1; see out.log |" in text
    assert "gain over 2 runs: mean +35.5, +28 to +43, sd 10.6" in text
