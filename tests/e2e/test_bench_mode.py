"""End to end: `mode: bench` evaluates the checkpoints a finished run left in its job folder.

A 2-step `both` run saves `global_step_1` and `global_step_2`; `trinity run` with `mode: bench`
on the same job then loads each checkpoint into the explorer and runs the eval tasksets,
logging `bench/step_<N>/eval/...` metrics. The ``weights_probe`` eval workflow
(tests/e2e/plugins) reports which weights it ran on, so the test can tell that step N's metrics
really come from checkpoint N. With `explorer.bench_on_latest_checkpoint` only the newest is
evaluated.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trinity.testing.jobs import tiny_job, tiny_taskset, write_job

from .conftest import PLUGINS, probe_taskset

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _config(root: Path, mode: str, latest: bool = False) -> Path:
    config = tiny_job(
        root,
        name="bench",
        mode=mode,
        algorithm={"optimizer": {"lr": 1.0e-2}, "entropy_loss_fn_args": {"entropy_coef": 0.01}},
        buffer={
            "total_steps": 2,
            "explorer_input": {
                "eval_tasksets": [
                    tiny_taskset(root, "arith_test", split="test", rollout_args={"temperature": 0.0}),
                    probe_taskset(root),
                ]
            },
        },
        explorer={"eval_interval": 1, "bench_on_latest_checkpoint": latest, "runner_per_model": None},
        synchronizer={"sync_interval": 1, "sync_offset": 0},
        trainer={"save_interval": 1},
    )
    return write_job(root / f"{mode}_{int(latest)}.yaml", config)


def _bench_scalars(job_dir: Path) -> dict[str, float]:
    from trinity.monitor.tensorboard import read_scalars

    scalars = read_scalars(job_dir / "monitor" / "tensorboard" / "explorer")
    # Bench mode logs everything once, at step 0.
    return {tag: points[-1][1] for tag, points in scalars.items() if tag.startswith("bench/")}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, math_job, trinity_run) -> Path:
    root = math_job(tmp_path_factory.mktemp("bench"), train=16, test=8)
    trinity_run(_config(root, "both"), "--plugin-dir", str(PLUGINS))
    job_dir = root / "ckpt" / "e2e" / "bench"
    assert (job_dir / "global_step_1").is_dir() and (job_dir / "global_step_2").is_dir()
    return root


def test_the_eval_logged_at_step_n_ran_on_the_weights_of_step_n(trained, probe_score):
    from trinity.monitor.tensorboard import read_scalars

    job_dir = trained / "ckpt" / "e2e" / "bench"
    scalars = read_scalars(job_dir / "monitor" / "tensorboard" / "explorer")
    version = dict(scalars["eval/model_version"])
    probe = dict(scalars["eval/probe/probe_logprob"])
    assert sorted(version) == [1, 2] and dict(scalars["eval/probe/probe_version"]) == {1: 1.0, 2: 2.0}
    for step in (1, 2):
        assert version[step] == float(step)
        # The same number a separate evaluation of checkpoint N gives.
        expected = probe_score(job_dir / f"global_step_{step}")
        assert probe[step] == pytest.approx(expected, rel=1e-5, abs=1e-4)


def test_bench_evaluates_every_checkpoint(trained, trinity_run, probe_score):
    job_dir = trained / "ckpt" / "e2e" / "bench"
    proc = trinity_run(_config(trained, "bench"), "--plugin-dir", str(PLUGINS))
    assert "(mode bench)" in proc.stdout
    bench = _bench_scalars(job_dir)
    for step in (1, 2):
        prefix = f"bench/step_{step}/eval"
        assert f"{prefix}/arith_test/accuracy" in bench, sorted(bench)
        assert 0.0 <= bench[f"{prefix}/arith_test/accuracy"] <= 1.0
        assert bench[f"{prefix}/arith_test/num_experiences"] == 8.0  # every test task, once each
        # Step N's metrics were computed with checkpoint N loaded, as version N.
        assert bench[f"{prefix}/probe/probe_version"] == float(step)
        expected = probe_score(job_dir / f"global_step_{step}")
        assert bench[f"{prefix}/probe/probe_logprob"] == pytest.approx(expected, rel=1e-5, abs=1e-4)
    assert not any(tag.startswith("bench/step_0/") or tag.startswith("bench/step_3/") for tag in bench)
    # The accuracy the training run logged at step N is what this separate evaluation of
    # checkpoint N measures (issue 20: an eval labelled N must not have run on N - 1).
    from trinity.monitor.tensorboard import read_scalars

    logged = read_scalars(job_dir / "monitor" / "tensorboard" / "explorer")
    for tag in ("accuracy", "response_length_mean"):
        during = dict(logged[f"eval/arith_test/{tag}"])
        assert {step: during[step] for step in (1, 2)} == {
            step: bench[f"bench/step_{step}/eval/arith_test/{tag}"] for step in (1, 2)
        }, tag
    assert abs(probe_score(job_dir / "global_step_1") - probe_score(job_dir / "global_step_2")) > 1e-3


def test_bench_on_latest_checkpoint_only(trained, trinity_run, tmp_path):
    # A copy of the trained job: the bench run above already logged both steps in the original.
    import shutil

    root = tmp_path / "latest"
    shutil.copytree(trained, root, ignore=shutil.ignore_patterns("*.yaml"))
    job_dir = root / "ckpt" / "e2e" / "bench"
    shutil.rmtree(job_dir / "monitor", ignore_errors=True)
    trinity_run(_config(root, "bench", latest=True), "--plugin-dir", str(PLUGINS))
    bench = _bench_scalars(job_dir)
    assert {tag.split("/")[1] for tag in bench} == {"step_2"}, sorted(bench)
    assert bench["bench/step_2/eval/probe/probe_version"] == 2.0
