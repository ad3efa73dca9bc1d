"""``sync_method: nccl``: the weight-sync group and its broadcast, for real, over gloo on CPU
(:mod:`trinity.sync.group`, :mod:`trinity.sync.broadcast`).

The group, handshake, broadcast order and loading are the same code for NCCL; only the backend
object differs (NCCL needs one GPU per rank: see the CUDA-only test at the end). Ranks run as
separate processes where it matters (the multi-process broadcast) and as threads of this
process elsewhere: a process may hold several ranks, as an explorer with several engines does.

vLLM cannot run here (no GPU): its worker extension is driven with a stand-in ``model_runner``,
and the vLLM names it relies on are checked by ``nox -s vllm_api``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from trinity.sync.broadcast import (
    TensorMeta,
    WeightReceiver,
    WeightSender,
    flatten_state_dict,
    metadata_digest,
    parse_metas,
    receive_weights,
    send_weights,
)
from trinity.sync.group import (
    GroupSpec,
    NCCLUnavailableError,
    WeightSyncError,
    WeightSyncGroup,
    choose_backend,
)

HOST = "127.0.0.1"


def _state_dict() -> dict[str, torch.Tensor]:
    """Tied embeddings, bf16 and float32, a non-contiguous view, integer / bool buffers, a
    0-d scalar and an empty tensor."""
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(11, 6, generator=g)
    wide = torch.randn(6, 10, generator=g)
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.mlp.weight": torch.randn(6, 6, generator=g).to(torch.bfloat16),
        "model.layers.0.proj.weight": wide.t(),  # non-contiguous (10, 6)
        "model.layers.0.norm.weight": torch.randn(6, generator=g).half(),
        "model.rotary.positions": torch.arange(7, dtype=torch.int64),
        "model.mask": torch.tensor([True, False, True]),
        "model.scale": torch.tensor(0.125),
        "model.empty": torch.empty(0, 6),
        "lm_head.weight": embed,  # tied to the embedding: sent once
    }


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    )


def _master(world_size: int, timeout_s: float = 10) -> WeightSyncGroup:
    return WeightSyncGroup.create_master(world_size, "gloo", timeout_s, host=HOST)


def _together(*calls):
    """Run the calls in threads at once (ranks of one collective); results or the errors."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(c) for c in calls]
        return [f.exception() or f.result() for f in futures]


def _join(group: WeightSyncGroup, rank: int, world_size: int, timeout_s: float = 10):
    spec = GroupSpec(HOST, group.address[1], world_size, "gloo", timeout_s)
    return lambda: WeightSyncGroup.join(spec, rank, host=HOST)


# -- metadata ------------------------------------------------------------------------------------


def test_flatten_sends_tied_tensors_once_and_contiguous():
    state = _state_dict()
    metas, tensors = flatten_state_dict(state)
    names = [m.name for m in metas]
    assert "lm_head.weight" not in names
    embed = metas[names.index("model.embed_tokens.weight")]
    assert embed.aliases == ("lm_head.weight",)
    assert all(t.is_contiguous() for t in tensors)
    proj = metas[names.index("model.layers.0.proj.weight")]
    assert (proj.dtype, proj.shape) == ("float32", (10, 6))
    assert metas[names.index("model.layers.0.mlp.weight")].dtype == "bfloat16"
    assert metas[names.index("model.scale")].shape == ()
    # Wire form survives msgpack-like round trips (tuples become lists).
    wire = [list(map(lambda x: list(x) if isinstance(x, tuple) else x, m.to_wire())) for m in metas]
    assert parse_metas(wire) == metas
    assert metadata_digest(metas, 3) == metadata_digest(parse_metas(wire), 3)
    assert metadata_digest(metas, 3) != metadata_digest(metas, 4)
    changed = [
        TensorMeta(m.name, m.dtype, (*m.shape, 1) if i == 0 else m.shape, m.aliases)
        for i, m in enumerate(metas)
    ]
    assert metadata_digest(changed, 3) != metadata_digest(metas, 3)


def test_backend_choice():
    assert choose_backend(["cpu", "cpu"], requested="") == (
        "gloo",
        "no CUDA device, broadcasting over gloo to 1 rank(s)",
    )
    assert choose_backend(["cuda:a", "cuda:b", "cuda:c"], requested="")[0] == "nccl"
    backend, why = choose_backend(["cuda:a", "cpu"], requested="")
    assert backend == "gloo" and "rollout rank 1 on CPU" in why
    backend, why = choose_backend(["cuda:a", "cuda:a"], requested="")
    assert backend == "gloo" and "share GPU a" in why
    assert choose_backend(["cuda:a", "cuda:b"], requested="gloo")[0] == "gloo"
    with pytest.raises(NCCLUnavailableError, match=r"rollout rank 1 on CPU.*sync_method 'memory'"):
        choose_backend(["cuda:a", "cpu"], requested="nccl")
    with pytest.raises(NCCLUnavailableError, match="use nccl, gloo or auto"):
        choose_backend(["cpu", "cpu"], requested="mpi")


def test_backend_env_override(monkeypatch):
    monkeypatch.setenv("TRINITY_WEIGHT_SYNC_BACKEND", "nccl")
    with pytest.raises(NCCLUnavailableError, match="no CUDA device"):
        choose_backend(["cpu", "cpu"])


# -- real processes ------------------------------------------------------------------------------

RECEIVER = """
import sys, torch
from trinity.sync.broadcast import receive_weights
from trinity.sync.group import GroupSpec, WeightSyncGroup
port, rank, world, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
group = WeightSyncGroup.join(GroupSpec("127.0.0.1", port, world, "gloo", 20), rank, host="127.0.0.1")
results = {}
for _ in range(2):
    # The metadata comes from the parent through stdin (one line of Python literals per sync).
    metas, version = eval(sys.stdin.readline())
    loaded, batches = {}, []
    receive_weights(group, metas, version, lambda b: (batches.append(len(b)), loaded.update(b)), batch_bytes=64)
    results[version] = (loaded, batches)
group.close()
torch.save(results, out)
"""


def test_broadcast_to_two_receiver_processes_is_bitwise_exact(tmp_path):
    """Three processes (trainer + two rollout ranks); two syncs through one group."""
    world = 3
    master = _master(world, timeout_s=20)
    script = tmp_path / "receiver.py"
    script.write_text(textwrap.dedent(RECEIVER))
    outs = [tmp_path / f"rank{r}.pt" for r in (1, 2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(master.address[1]), str(r), str(world), str(out)],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r, out in zip((1, 2), outs)
    ]
    try:
        master.connect()
        first = _state_dict()
        second = {k: (v + 1 if v.is_floating_point() else v) for k, v in first.items()}
        second["lm_head.weight"] = second["model.embed_tokens.weight"]
        for version, state in ((1, first), (2, second)):
            metas, tensors = flatten_state_dict(state)
            line = repr(([m.to_wire() for m in metas], version)) + "\n"
            for p in procs:
                p.stdin.write(line)
                p.stdin.flush()
            stats = send_weights(master, metas, tensors, version)
            assert stats["tensors"] == len(metas) == len(state) - 1
        for p in procs:
            p.stdin.close()
            assert p.wait(timeout=60) == 0, p.stderr.read()[-2000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        master.close()
    for out in outs:
        results = torch.load(out, weights_only=False)
        for version, state in ((1, first), (2, second)):
            loaded, batches = results[version]
            assert set(loaded) == set(state)
            assert len(batches) > 1  # batch_bytes=64 split the loading
            for name, tensor in state.items():
                assert _bitwise_equal(loaded[name], tensor), name
            # Tied names arrive as one tensor, as they left.
            assert loaded["lm_head.weight"] is loaded["model.embed_tokens.weight"]


# -- failures are clear and bounded by sync_timeout ----------------------------------------------


def test_receiver_that_never_joins_times_out_clearly():
    master = _master(2, timeout_s=2)
    start = time.monotonic()
    with pytest.raises(
        WeightSyncError, match=r"did not see every other rank join within synchronizer.sync_timeout = 2 s"
    ):
        master.connect()
    assert time.monotonic() - start < 10
    master.close()


@pytest.mark.slow  # over ~3 s on 2 cores: not in `nox -s unit`
def test_trainer_that_never_opens_its_store_times_out_clearly():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"could not reach the trainer's store .* within 2 s"):
        WeightSyncGroup.join(GroupSpec(HOST, port, 2, "gloo", 2), 1, host=HOST)
    assert time.monotonic() - start < 10


def test_receiver_that_stops_answering_times_out_clearly():
    master = _master(2, timeout_s=2)
    receiver = _together(master.connect, _join(master, 1, 2, timeout_s=2))[1]
    metas, tensors = flatten_state_dict(_state_dict())
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"failed or timed out \(synchronizer.sync_timeout = 2 s\)"):
        send_weights(master, metas, tensors, 1)  # the receiver never calls receive_weights
    assert time.monotonic() - start < 10
    receiver.close()
    master.close()


def test_metadata_mismatch_fails_both_sides_at_once():
    master = _master(2, timeout_s=20)
    receiver = _together(master.connect, _join(master, 1, 2))[1]
    metas, tensors = flatten_state_dict(_state_dict())
    wrong = [
        TensorMeta(m.name, "float64" if i == 1 else m.dtype, m.shape, m.aliases) for i, m in enumerate(metas)
    ]
    loaded = []
    start = time.monotonic()
    sent, got = _together(
        lambda: send_weights(master, metas, tensors, 5),
        lambda: receive_weights(receiver, wrong, 5, loaded.extend),
    )
    assert time.monotonic() - start < 10  # not a timeout: the handshake tells both sides
    assert isinstance(sent, WeightSyncError) and "rank 1 got different metadata" in str(sent)
    assert isinstance(got, WeightSyncError) and "does not match the trainer's" in str(got)
    assert loaded == []
    # A wrong version is a mismatch too; afterwards the group still works.
    sent, got = _together(
        lambda: send_weights(master, metas, tensors, 6),
        lambda: receive_weights(receiver, metas, 7, loaded.extend),
    )
    assert isinstance(sent, WeightSyncError) and isinstance(got, WeightSyncError)
    stats, _ = _together(
        lambda: send_weights(master, metas, tensors, 8),
        lambda: receive_weights(receiver, metas, 8, loaded.extend),
    )
    assert stats["tensors"] == len(metas) and len(loaded) == len(metas) + 1  # + the tied alias
    receiver.close()
    master.close()


def test_a_receiver_that_cannot_load_cancels_the_sync_everywhere():
    master = _master(3, timeout_s=20)
    _, r1, r2 = _together(master.connect, _join(master, 1, 3), _join(master, 2, 3))
    metas, tensors = flatten_state_dict(_state_dict())
    sent, ok, refused = _together(
        lambda: send_weights(master, metas, tensors, 1),
        lambda: receive_weights(r1, metas, 1, lambda b: None),
        lambda: receive_weights(r2, metas, 1, lambda b: None, problem="x.weight is not in the model"),
    )
    assert "rank 2 refused the weights" in str(sent)
    assert "rank 2 refused the weights" in str(ok)
    assert "refused the weights: x.weight is not in the model" in str(refused)

    # A loader that fails mid-way still receives everything (the trainer is not left waiting).
    def failing(batch):
        raise ValueError("disk full")

    stats, good, bad = _together(
        lambda: send_weights(master, metas, tensors, 2),
        lambda: receive_weights(r1, metas, 2, lambda b: None),
        lambda: receive_weights(r2, metas, 2, failing, batch_bytes=1),
    )
    assert stats["tensors"] == len(metas) and good["tensors"] == len(metas)
    assert isinstance(bad, WeightSyncError) and "loading version 2 failed: disk full" in str(bad)
    for group in (r1, r2, master):
        group.close()


def test_a_closed_group_says_so_and_a_new_one_can_follow():
    sender = WeightSender(2, "gloo", 10)
    receiver = _together(sender.connect, _join(sender.group, 1, 2))[1]
    metas = sender.prepare(_state_dict(), 1)
    got = {}
    _together(sender.send, lambda: receive_weights(receiver, metas, 1, got.update))
    with pytest.raises(WeightSyncError, match="without prepare"):
        sender.send()
    sender.close()
    receiver.close()
    with pytest.raises(WeightSyncError, match=r"not connected.*closed"):
        receiver.broadcast(torch.zeros(1))
    # Next stage: a fresh group on a fresh port.
    again = WeightSender(2, "gloo", 10)
    assert again.address[1] != sender.address[1]
    again.close()


def test_group_spec_wire_form_and_a_receiver_joining_group_after_group():
    spec = GroupSpec(HOST, 1234, 3, "gloo", 20.0)
    assert GroupSpec.from_wire(spec.to_wire()) == spec and GroupSpec.from_wire(spec) is spec
    assert all(isinstance(v, (str, int, float)) for v in spec.to_wire().values())  # msgpack-able
    with pytest.raises(ValueError, match="backend 'mpi'"):
        GroupSpec(HOST, 1234, 2, "mpi", 1)
    receiver = WeightReceiver("the test's receiver")
    with pytest.raises(WeightSyncError, match="the test's receiver has not joined a weight-sync group"):
        receiver.receive([], 1, lambda b: None)
    state = _state_dict()

    def stage(version: int) -> None:
        sender = WeightSender(2, "gloo", 10)
        previous = receiver.group
        _together(sender.connect, lambda: receiver.join(sender.spec.to_wire(), 1))
        assert previous is None or previous.closed
        got: dict[str, torch.Tensor] = {}
        metas = sender.prepare(state, version)
        _together(sender.send, lambda: receiver.receive(metas, version, got.update))
        assert set(got) == set(state) and all(_bitwise_equal(got[k], state[k]) for k in state)
        sender.close()

    stage(1)
    stage(2)  # one group per stage: joining the next leaves the previous one
    receiver.close()
    assert receiver.group is None


# -- rollout engines -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_models(tiny_model):
    return str(tiny_model(hidden_size=32, seed=0)), str(tiny_model(hidden_size=32, seed=1))


def test_transformers_engines_receive_the_broadcast(tiny_models):
    """Two transformers engines in one process (two ranks), as an explorer with engine_num 2."""
    from transformers import AutoModelForCausalLM

    from trinity.rollout.transformers_engine import TransformersEngine

    engines = [TransformersEngine(tiny_models[0], dtype="float32", device="cpu") for _ in range(2)]
    trained = AutoModelForCausalLM.from_pretrained(tiny_models[1]).state_dict()
    assert [e.weight_sync_devices() for e in engines] == [["cpu"], ["cpu"]]
    sender = WeightSender(3, "gloo", 20)
    _together(
        sender.connect,
        *(
            lambda e=e, r=r: e.init_weight_group(sender.spec, r)
            for r, e in ((1, engines[0]), (2, engines[1]))
        ),
    )
    metas = sender.prepare(trained, 4)
    results = _together(sender.send, *(lambda e=e: e.receive_weights(metas, 4) for e in engines))
    assert not any(isinstance(r, BaseException) for r in results), results
    for engine in engines:
        assert engine.model_version == 4
        for name, tensor in engine.model.state_dict().items():
            assert _bitwise_equal(tensor, trained[name]), name
    # Weights the rollout model does not have are refused on every rank; nothing changes.
    metas = sender.prepare({**trained, "extra.weight": torch.ones(2)}, 5)
    sent, *got = _together(sender.send, *(lambda e=e: e.receive_weights(metas, 5) for e in engines))
    assert isinstance(sent, WeightSyncError) and "refused" in str(sent)
    assert all("not in the rollout model: extra.weight" in str(g) for g in got)
    assert all(e.model_version == 4 for e in engines)
    for engine in engines:
        engine.close_weight_group()
    sender.close()


class _FakeWorker:
    """What WeightUpdateExtension needs of vLLM's worker: ``rank``, ``device`` and
    ``reload_weights(weights_iterator=..., is_checkpoint_format=True)`` (here recording each
    reload's weights, and how many received batches were waiting while it read them)."""

    def __init__(self, rank: int, fail_after: int | None = None):
        self.rank = rank
        self.device = torch.device("cpu")
        self.model_runner = type("Runner", (), {"model": None})()
        self.reloads: list[list[tuple[str, torch.Tensor]]] = []
        self.fail_after = fail_after

    def reload_weights(self, weights_iterator, is_checkpoint_format):
        assert is_checkpoint_format
        got: list[tuple[str, torch.Tensor]] = []
        self.reloads.append(got)
        for pair in weights_iterator:
            got.append(pair)
            if self.fail_after is not None and len(got) == self.fail_after:
                raise RuntimeError("reload failed")


def test_vllm_worker_extension_reloads_each_version_in_one_pass():
    from trinity.rollout.vllm_weights import WeightUpdateExtension

    worker_cls = type("Worker", (WeightUpdateExtension, _FakeWorker), {"trinity_load_batch_bytes": 200})
    # One engine with tensor_parallel_size 2: its workers are ranks offset+0 and offset+1; the
    # second fails its reload half-way and must still take every broadcast (or rank 1 would hang).
    workers = [worker_cls(0), worker_cls(1, fail_after=2)]
    assert [w.trinity_weight_sync_device() for w in workers] == ["cpu", "cpu"]
    sender = WeightSender(3, "gloo", 20)
    # vLLM's collective_rpc passes arguments through msgpack: plain ints, floats, strings, lists.
    _together(
        sender.connect,
        *(lambda w=w: w.trinity_init_weight_group(sender.spec.to_wire(), 1) for w in workers),
    )
    assert [w.trinity_weight_receiver.group.rank for w in workers] == [1, 2]
    state = _state_dict()
    for version in (9, 10):  # a failed reload leaves the group usable for the next version
        metas = sender.prepare(state, version)
        ok, failed = _together(
            sender.send, *(lambda w=w, m=metas, v=version: w.trinity_receive_weights(m, v) for w in workers)
        )[1:]
        assert not isinstance(ok, BaseException), ok
        assert isinstance(failed, RuntimeError) and str(failed) == "reload failed"
    good = workers[0]
    # One reload per version: vLLM processes each layer once all of it is loaded.
    assert len(good.reloads) == 2
    got = dict(good.reloads[-1])
    assert set(got) == set(state)
    assert all(_bitwise_equal(got[name], state[name]) for name in state)
    for worker in workers:
        worker.trinity_close_weight_group()
    sender.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: NCCL backend")
def test_nccl_backend_on_one_gpu_per_rank():  # pragma: no cover - CPU machines skip it
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: NCCL allows one rank per GPU")
    master = WeightSyncGroup.create_master(2, "nccl", 60, host=HOST)

    def receiver():
        torch.cuda.set_device(1)
        group = WeightSyncGroup.join(GroupSpec(HOST, master.address[1], 2, "nccl", 60), 1, host=HOST)
        got = {}
        receive_weights(group, metas, 1, got.update)
        return group, got

    torch.cuda.set_device(0)
    state = {k: v.cuda() for k, v in _state_dict().items()}
    metas, tensors = flatten_state_dict(state)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(receiver)
        master.connect()
        send_weights(master, metas, tensors, 1)
        group, got = future.result()
    for name, tensor in state.items():
        assert _bitwise_equal(got[name].cpu(), tensor.cpu()), name
    group.close()
    master.close()
