"""A plugin's modules log under their own names (``trinity_math.judge``, ...): the job keeps
those records too, in each actor's log file and (warnings) on the driver's console."""

from __future__ import annotations

import logging

import pytest

from trinity.report import job_loggers


@pytest.fixture
def restored_loggers():
    names = job_loggers()
    saved = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).level) for n in names}
    yield names
    for name, (handlers, level) in saved.items():
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if handler not in handlers:
                logger.removeHandler(handler)
                handler.close()
        logger.setLevel(level)


def test_the_installed_plugins_packages_are_the_jobs_loggers(tmp_path, monkeypatch):
    names = job_loggers()
    assert names[0] == "trinity" and {"trinity_math", "trinity_algos", "trinity_agents"} <= set(names)
    (tmp_path / "my_plugin.py").write_text("")
    from trinity.plugins import get_manager

    monkeypatch.setattr(type(get_manager()), "plugin_dirs", property(lambda self: [tmp_path]))
    assert "my_plugin" in job_loggers()  # a --plugin-dir module


def test_an_actors_log_file_holds_what_a_plugin_logs(tmp_path, restored_loggers):
    from types import SimpleNamespace

    from trinity.actors import _setup_actor

    config = SimpleNamespace(
        checkpoint_job_dir=str(tmp_path), log=SimpleNamespace(group_by_node=False, level="INFO")
    )
    _setup_actor(config, "explorer")
    logging.getLogger("trinity_math.judge").warning("judge timed out: fallback reward 0.0")
    logging.getLogger("trinity.explorer").info("step 1")
    for handler in logging.getLogger("trinity").handlers:
        handler.flush()
    text = (tmp_path / "log" / "explorer.log").read_text()
    assert "WARNING trinity_math.judge: judge timed out: fallback reward 0.0" in text
    assert "INFO trinity.explorer: step 1" in text
