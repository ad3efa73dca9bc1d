"""The weight transports the launcher drives (``trinity.sync.transport``), for real through Ray.

Calls that must run together (the trainer's broadcast and the explorer's receive) end in a clear
:class:`WeightSyncFailed` — naming every side's error — when one side fails, and when a side
hangs past the sync timeout, instead of waiting. Each ``sync_method`` runs between stand-in
trainer and explorer actors with the weight-sync methods of ``TrainerActor`` /
``ExplorerActor`` over a plain state dict (``tests/e2e`` runs them inside whole jobs)."""

from __future__ import annotations

import time

import pytest
import torch

from trinity.sync import WeightSyncFailed, make_transport
from trinity.sync.broadcast import WeightReceiver, WeightSender
from trinity.sync.transport import get_together

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


# -- calls that must run together (the ranks of one collective) ---------------------------------


@ray.remote
def _answer(value, delay=0.0):
    time.sleep(delay)
    return value


@ray.remote
def _fail(message, delay=0.0):
    from trinity.sync.group import WeightSyncError

    time.sleep(delay)
    raise WeightSyncError(message)


@ray.remote(num_cpus=0)
class _Unstartable:
    def __init__(self) -> None:
        raise RuntimeError("the veRL trainer needs 3 CPU bundles; Ray has 2 CPU")

    def ready(self) -> bool:
        return True


def test_an_actor_that_cannot_start_is_one_line_naming_its_error(local_ray):
    from trinity.sync.transport import get_result

    with pytest.raises(WeightSyncFailed) as failed:
        get_result(local_ray, _Unstartable.remote().ready.remote(), "starting actors")
    message = str(failed.value)
    assert message == (
        "starting actors: an actor died: _Unstartable.__init__ raised "
        "RuntimeError: the veRL trainer needs 3 CPU bundles; Ray has 2 CPU"
    )


def test_results_in_submission_order(local_ray):
    refs = [_answer.remote("sent", 0.2), _answer.remote("received")]
    assert get_together(local_ray, refs, "weight sync", timeout=30) == ["sent", "received"]


def test_one_side_failing_fails_the_job_with_every_sides_reason(local_ray, monkeypatch):
    monkeypatch.setattr("trinity.sync.transport.COLLECT_ERRORS_S", 2.0)
    refs = [
        _fail.remote("rank 1 refused the weights", 0.3),  # the trainer learns it in the handshake
        _fail.remote("refused the weights: x.weight is not in the model"),
    ]
    with pytest.raises(WeightSyncFailed) as failed:
        get_together(local_ray, refs, "weight sync (broadcast of version 3)", timeout=60)
    message = str(failed.value)
    assert message.startswith("weight sync (broadcast of version 3): WeightSyncError(")
    assert "x.weight is not in the model" in message and "rank 1 refused the weights" in message


def test_a_failure_does_not_wait_for_a_hanging_side(local_ray, monkeypatch):
    monkeypatch.setattr("trinity.sync.transport.COLLECT_ERRORS_S", 1.0)
    start = time.monotonic()
    with pytest.raises(WeightSyncFailed, match="could not join"):
        get_together(
            local_ray,
            [_answer.remote("never", 60), _fail.remote("could not join")],
            "weight sync",
            timeout=60,
        )
    assert time.monotonic() - start < 15


def test_a_side_hanging_past_the_timeout_fails_the_job(local_ray):
    start = time.monotonic()
    with pytest.raises(WeightSyncFailed, match=r"no answer within synchronizer.sync_timeout \(1 s\)"):
        get_together(
            local_ray, [_answer.remote("late", 60), _answer.remote("ok")], "weight sync", 1, grace=0.5
        )
    assert time.monotonic() - start < 10


# -- the transports ------------------------------------------------------------------------------


def _state(step: int) -> dict[str, torch.Tensor]:
    embed = torch.full((4, 3), float(step))
    return {"embed.weight": embed, "mlp.weight": torch.arange(6.0).reshape(2, 3) + step, "head.weight": embed}


@ray.remote(num_cpus=0)
class _Trainer:
    def __init__(self, job_dir: str) -> None:
        self.job_dir, self.step, self.sender = job_dir, 0, None

    def train_step(self) -> int:
        self.step += 1
        return self.step

    def get_weights(self):
        return _state(self.step), self.step

    def save_weights(self):
        path = f"{self.job_dir}/global_step_{self.step}.pt"
        torch.save(_state(self.step), path)
        return path, self.step

    def weight_sync_device(self) -> str:
        return "cpu"

    def open_weight_group(self, world_size, backend, timeout_s):
        self.sender = WeightSender(world_size, backend, timeout_s)
        return self.sender.spec

    def connect_weight_group(self) -> None:
        self.sender.connect()

    def prepare_weights(self):
        return self.sender.prepare(_state(self.step), self.step), self.step

    def send_weights(self):
        return self.sender.send()

    def close_weight_group(self) -> None:
        self.sender.close()


@ray.remote(num_cpus=0)
class _Explorer:
    def __init__(self, refuse: str | None = None) -> None:
        self.refuse, self.weights, self.version = refuse, {}, 0
        self.receiver = WeightReceiver("the stand-in explorer")

    def loaded(self):
        return self.weights, self.version

    def _load(self, state, version: int) -> int:
        self.weights, self.version = dict(state), version
        return version

    def update_weights(self, boxed_ref):
        return self._load(*ray.get(boxed_ref[0]))

    def load_checkpoint(self, path_and_version):
        path, version = path_and_version
        return self._load(torch.load(path), version)

    def weight_sync_devices(self):
        return [["cpu"]]

    def init_weight_group(self, spec) -> None:
        self.receiver.join(spec, 1)

    def receive_weights(self, metas, version):
        got: dict[str, torch.Tensor] = {}
        self.receiver.receive(metas, version, got.update, problem=self.refuse)
        return self._load(got, version)

    def close_weight_group(self) -> None:
        self.receiver.close()


@pytest.mark.parametrize("method", ["memory", "checkpoint", "nccl"])
def test_every_transport_moves_the_trainers_current_weights(local_ray, tmp_path, method):
    trainer, explorer = _Trainer.remote(str(tmp_path)), _Explorer.remote()
    transport = make_transport(method, local_ray, explorer, trainer, 30)
    chosen = transport.open()
    assert chosen == ("no CUDA device, broadcasting over gloo to 1 rank(s)" if method == "nccl" else "")
    for step in (1, 2):
        trainer.train_step.remote()  # calls on one actor run in order: the sync sees this step
        assert transport.sync() == step
        weights, version = local_ray.get(explorer.loaded.remote())
        assert version == step and set(weights) == set(_state(step))
        for name, tensor in _state(step).items():
            torch.testing.assert_close(weights[name], tensor, rtol=0, atol=0)
    transport.close()


@pytest.mark.slow  # over ~3 s on 2 cores: not in `nox -s unit`
def test_a_side_that_refuses_fails_the_sync_with_every_sides_reason(local_ray, tmp_path, monkeypatch):
    monkeypatch.setattr("trinity.sync.transport.COLLECT_ERRORS_S", 10.0)
    trainer = _Trainer.remote(str(tmp_path))
    explorer = _Explorer.remote(refuse="x.weight is not in the model")
    transport = make_transport("nccl", local_ray, explorer, trainer, 30)
    transport.open()
    with pytest.raises(WeightSyncFailed) as failed:
        transport.sync()
    message = str(failed.value)
    assert message.startswith("weight sync (broadcast of version 0): WeightSyncError(")
    assert "refused the weights: x.weight is not in the model" in message
    assert "rank 1 refused the weights" in message  # the trainer's side of the same handshake
    transport.close()


def test_an_unknown_sync_method_is_named():
    with pytest.raises(WeightSyncFailed, match=r"sync_method 'rsync': use 'memory', 'checkpoint', 'nccl'"):
        make_transport("rsync", None, None, None, 1)
