"""The log-prob guard (``trainer.logprob_guard_threshold``): each cause of a trainer/engine
mismatch planted in a config or in the experiences, and the step's warning naming it once; the
histogram of the difference, written to TensorBoard (a stand-in back-end, no Ray)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trinity.config import resolve_config
from trinity.config.validation import validate_config
from trinity.monitor.base import Histogram
from trinity.monitor.console import ConsoleMonitor
from trinity.monitor.tensorboard import TensorboardMonitor, read_histograms
from trinity.testing.conformance import make_experiences
from trinity.trainer.batch import build_batch
from trinity.trainer.components import AlgorithmComponents
from trinity.trainer.logprob_guard import likely_causes, trainer_dtype
from trinity.trainer.step import POLICY_STATS, train_step

GRPO = {"algorithm_type": "grpo", "repeat_times": 2}


def _config(
    model_path: str,
    tmp_path,
    *,
    rollout_args: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    rollout_model: dict[str, Any] | None = None,
    trainer: dict[str, Any] | None = None,
    algorithm: dict[str, Any] | None = None,
):
    """A resolved train config whose explorer would sample ``rollout_args`` on ``rollout_model``."""
    data = {
        "mode": "train",
        "project": "test",
        "name": "guard",
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {
            "model_path": model_path,
            "max_prompt_tokens": 16,
            "max_response_tokens": 16,
            **(model or {}),
        },
        "algorithm": {**GRPO, **(algorithm or {})},
        "buffer": {
            "batch_size": 4,
            "explorer_input": {
                "tasksets": [{"name": "math", "path": "unused.jsonl", "rollout_args": rollout_args or {}}]
            },
            "trainer_input": {
                "experience_buffer": {"name": "exp", "storage_type": "sql", "path": "sqlite:///unused.db"}
            },
        },
        "explorer": {"rollout_model": {"dtype": "float32", **(rollout_model or {})}},
        "trainer": {"trainer_type": "native", "use_dynamic_bsz": False, **(trainer or {})},
    }
    return resolve_config(validate_config(data))


@pytest.fixture
def make(tiny_model_path, tmp_path):
    return lambda **kw: _config(tiny_model_path, tmp_path, **kw)


class _Backend:
    """A float32 trainer whose log-probs of the sampled tokens are ``rollout + shift``."""

    policy_stats_names = POLICY_STATS
    old_logprob_from_update = True
    compute_dtype = torch.float32

    def __init__(self, config: Any, shift: float) -> None:
        self.config = config
        self.components = AlgorithmComponents.from_config(config.algorithm)
        self.use_ref = self.components.use_reference
        self.use_critic = False
        self.global_step = 0
        self.shift = shift
        self.calls: list[str] = []

    def prepare(self, experiences):
        return build_batch(experiences), None

    def ref_logprobs(self, batch, plan):
        return torch.zeros_like(batch.action_mask)

    def policy_stats(self, batch, plan, names):
        self.calls.append("stats")
        return {n: batch.rollout_logprobs + self.shift for n in names}

    def update_actor(self, batch, plan):
        self.calls.append("actor")
        return {}, (batch.rollout_logprobs + self.shift if batch.old_logprob is None else None)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "trainer.logprob_guard_threshold" in r.getMessage()]


def _run(config, caplog, *, shift: float = 0.5, steps: int = 2, experiences=None):
    backend = _Backend(config, shift)
    with caplog.at_level("WARNING", logger="trinity.trainer"):
        metrics = [train_step(backend, experiences or make_experiences(4)) for _ in range(steps)]
    return backend, metrics, _warnings(caplog)


def test_a_temperature_mismatch_is_named_once(make, caplog):
    config = make(rollout_args={"temperature": 0.7})
    _, metrics, warned = _run(config, caplog)
    assert metrics[0]["rollout/logprob_diff/mean"] == pytest.approx(0.5)
    assert len(warned) == 1  # two steps over the threshold, one warning
    assert (
        "temperature: the engine sampled at 0.7 (buffer.explorer_input.tasksets[0].rollout_args)" in warned[0]
    )
    assert "model.temperature 1.0" in warned[0]
    assert "top-k" not in warned[0] and "dtype" not in warned[0]


def test_top_p_and_top_k_are_named_for_an_engine_that_renormalises(make, caplog):
    config = make(rollout_args={"top_p": 0.9, "top_k": 20}, rollout_model={"engine_type": "vllm"})
    _, _, warned = _run(config, caplog)
    assert "top-k/top-p" in warned[0] and "top_p 0.9" in warned[0] and "top_k 20" in warned[0]
    # The transformers engine reports the full softmax: top-k/top-p do not explain a mismatch there.
    same = make(rollout_args={"top_p": 0.9, "top_k": 20}, rollout_model={"engine_type": "transformers"})
    assert likely_causes(same, [], "float32") == []


def test_a_repetition_penalty_the_engine_recorded_is_named(make, caplog):
    experiences = make_experiences(4)
    for exp in experiences:
        exp.info["rollout_args"] = {"temperature": 1.0, "repetition_penalty": 1.2}
    _, _, warned = _run(make(), caplog, experiences=experiences)
    assert "repetition penalty: the engine applied 1.2" in warned[0]
    assert "temperature" not in warned[0]  # the recorded temperature matches the trainer's


def test_a_dtype_difference_is_named(make, caplog):
    config = make(rollout_model={"dtype": "bfloat16"})
    _, _, warned = _run(config, caplog)
    assert (
        "dtype: the engine runs in bfloat16 (explorer.rollout_model.dtype), the trainer in float32"
        in warned[0]
    )
    # Without a back-end's compute dtype, trainer.dtype auto resolves as the back-ends do.
    assert trainer_dtype(config, None) is None
    assert trainer_dtype(config, type("B", (), {"device": torch.device("cpu")})()) == "float32"


def test_no_difference_points_at_the_weight_sync(make, caplog):
    _, _, warned = _run(make(), caplog)
    assert "no sampling-setting or dtype difference found" in warned[0]


def test_under_the_threshold_or_without_one_nothing_is_said(make, caplog):
    _, _, warned = _run(make(rollout_args={"temperature": 0.7}), caplog, shift=0.05)
    assert warned == []
    _, _, warned = _run(make(trainer={"logprob_guard_threshold": None}), caplog)
    assert warned == []


def test_the_guard_can_switch_rollout_correction_on(make, caplog):
    config = make(trainer={"logprob_guard_auto_correct": True})
    backend, metrics, warned = _run(config, caplog)
    assert "rollout correction is now on" in warned[0]
    # Step 1 fired the guard; step 2 computed old log-probs first and corrected.
    assert backend.calls == ["actor", "stats", "actor"]
    assert not any(k.startswith("rollout_corr/") for k in metrics[0])
    assert metrics[1]["rollout_corr/rollout_is_max"] == pytest.approx(2.0)  # exp(0.5 * 4) truncated
    assert config.algorithm.rollout_correction is None  # the config itself is left as it was


def test_the_difference_is_logged_as_a_histogram_tensorboard_plots(make, caplog, tmp_path):
    _, metrics, _ = _run(make(), caplog, steps=1)
    hist = metrics[0]["rollout/logprob_diff/histogram"]
    assert isinstance(hist, Histogram)
    assert hist.num == 16 and hist.min == pytest.approx(0.5) and sum(hist.counts) == 16
    monitor = TensorboardMonitor(str(tmp_path / "tb"), "trainer")
    monitor.log(metrics[0], step=1)
    monitor.close()
    [(step, value)] = read_histograms(tmp_path / "tb" / "trainer")["rollout/logprob_diff/histogram"]
    assert step == 1 and value.num == 16 and value.max == pytest.approx(0.5)


def test_a_monitor_without_histograms_notes_it_once(caplog, monkeypatch):
    from trinity.monitor import base

    monkeypatch.setattr(base, "_noted", set())
    values = {"rollout/logprob_diff/histogram": Histogram.of([0.1, -0.2, 0.3]), "actor/pg_loss": 1.0}
    monitor = ConsoleMonitor("trainer", use_rich=False)
    with caplog.at_level("INFO", logger="trinity.monitor"):
        monitor.log(values, 1)
        monitor.log(values, 2)
    notes = [r.getMessage() for r in caplog.records if "does not plot histograms" in r.getMessage()]
    assert len(notes) == 1 and "rollout/logprob_diff/histogram is logged by the tensorboard" in notes[0]


def test_histogram_of_values():
    data = torch.tensor([0.0, 1.0, 1.0, 3.0])
    hist = Histogram.of(data, bins=3)
    assert hist.counts == (1, 2, 1) and hist.edges == (0.0, 1.0, 2.0, 3.0)
    assert (hist.sum, hist.sum_squares) == (5.0, 11.0)
    assert Histogram.of([]).num == 0


def test_what_the_engines_record_decides_whether_top_k_and_top_p_explain_it(make):
    """The built-in engines record what they sampled with (``SamplingArgs.applied``): top-k/top-p
    are named only where the reported log-probs were renormalised over what they keep (vLLM),
    whatever the config says; a workflow's own temperature is seen the same way."""
    from trinity.rollout.base import SamplingArgs

    config = make()  # configured: temperature 1, no top-k / top-p
    sampled = SamplingArgs(temperature=0.7, top_p=0.9, top_k=20)
    vllm = likely_causes(config, [{"rollout_args": sampled.applied(True)}], "float32")
    assert [c.split(":")[0] for c in vllm] == ["temperature", "top-k/top-p"]
    assert "0.7 (the experiences' info" in vllm[0]
    full_softmax = likely_causes(config, [{"rollout_args": sampled.applied(False)}], "float32")
    assert [c.split(":")[0] for c in full_softmax] == ["temperature"]


def test_expert_rows_are_left_out_of_the_agreement():
    """mix's expert rows have no engine log-probs (zeros): comparing them would report their
    whole SFT loss as an engine/trainer mismatch."""
    import torch

    from trinity.trainer.metrics import logprob_agreement

    old = torch.tensor([[-0.5, -0.7], [-3.0, -4.0]])
    batch = {
        "has_rollout_logprobs": True,
        "old_logprob": old,
        "rollout_logprobs": torch.tensor([[-0.5, -0.6], [0.0, 0.0]]),
        "action_mask": torch.ones(2, 2),
        "expert_mask": torch.tensor([False, True]),
    }
    found = logprob_agreement(batch)
    assert found["rollout/logprob_diff/max"] == pytest.approx(0.1)
    assert found["rollout/logprob_diff/mean"] == pytest.approx(0.05)
    batch["expert_mask"] = torch.tensor([False, False])  # as before: the expert row dominates
    assert logprob_agreement(batch)["rollout/logprob_diff/max"] == pytest.approx(4.0)
