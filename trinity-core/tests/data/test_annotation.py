"""Human preference labels: the label store (resume, one label per pair, who and when) and the
``human_preference_annotation_mapper`` task operator (waiting, batches, timeouts, the task
pipeline of a DPO train job). The Labels page itself is tested with the studio
(``trinity-studio/tests/test_labels.py``, ``tests/e2e/test_studio_labels_browser.py``)."""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from trinity.config import load_config
from trinity.data.annotation import AlreadyLabelled, HumanPreferenceAnnotationMapper, PreferenceStore
from trinity.data.operator import OperatorContext
from trinity.data.tasks import apply_task_pipeline, run_task_pipeline
from trinity.testing import check_component

NAME = "human_preference_annotation_mapper"


def _pairs(n: int) -> list[tuple[str, str, str, dict]]:
    return [(f"q{i}", f"good{i}", f"bad{i}", {"prompt": f"q{i}", "id": i}) for i in range(n)]


def _rows(n: int) -> list[dict]:
    return [{"prompt": f"q{i}", "answer1": f"a{i}", "answer2": f"b{i}", "id": i} for i in range(n)]


def _parse(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


# -- the store -------------------------------------------------------------------------------


def test_a_label_records_who_and_when_and_gives_a_dpo_row(tmp_path):
    store = PreferenceStore(str(tmp_path / "labels.db"), "demo")
    ids = store.add_pairs(_pairs(3))
    before = datetime.now(timezone.utc).replace(microsecond=0)
    first = store.label(ids[0], "answer1", "ann")
    store.label(ids[1], "answer2", " bob ")
    store.label(ids[2], "skip", "ann")
    after = datetime.now(timezone.utc)
    assert first.labelled_by == "ann" and before <= _parse(first.labelled_at) <= after
    rows = store.dpo_rows()
    assert [(r["prompt"], r["chosen"], r["rejected"], r["labelled_by"]) for r in rows] == [
        ("q0", "good0", "bad0", "ann"),
        ("q1", "bad1", "good1", "bob"),  # answer2 preferred: it is the chosen one
    ]
    assert all(r["labelled_at"] for r in rows) and rows[0]["id"] == 0, "the task row's fields stay"
    assert store.counts() == {"pairs": 3, "labelled": 2, "skipped": 1, "pending": 0}
    named = store.dpo_rows(chosen_key="better", rejected_key="worse")
    assert named[0]["better"] == "good0" and "chosen" not in named[0]


def test_a_reopened_store_keeps_its_labels_and_asks_only_for_the_rest(tmp_path):
    path = str(tmp_path / "labels.db")
    store = PreferenceStore(path, "demo")
    ids = store.add_pairs(_pairs(3))
    store.label(ids[1], "answer1", "ann")
    again = PreferenceStore(path)  # a restarted job or studio
    assert again.project == "demo"
    assert again.add_pairs(_pairs(3)) == ids, "the same pairs are not added twice"
    assert [p.pair_id for p in again.pairs(pending=True)] == [ids[0], ids[2]]
    assert again.next_pending().pair_id == ids[0]
    assert again.next_pending(after=0).pair_id == ids[2]
    assert again.next_pending(after=2).pair_id == ids[0], "wraps round to the first undecided pair"
    assert again.pairs([ids[1]])[0].label.labelled_by == "ann"


def test_a_pair_is_labelled_once_even_by_two_people_at_the_same_time(tmp_path):
    path = str(tmp_path / "labels.db")
    (pid,) = PreferenceStore(path).add_pairs(_pairs(1))
    results: list[object] = []
    start = threading.Barrier(6)

    def click(who: str) -> None:
        start.wait()
        try:
            results.append(PreferenceStore(path).label(pid, "answer1", who))
        except AlreadyLabelled as exc:
            results.append(exc)

    threads = [threading.Thread(target=click, args=(f"p{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    labels = [r for r in results if not isinstance(r, AlreadyLabelled)]
    refused = [r for r in results if isinstance(r, AlreadyLabelled)]
    assert len(labels) == 1 and len(refused) == 5
    assert all(r.label == labels[0] for r in refused), "the refusal names the first label"
    assert len(PreferenceStore(path).dpo_rows()) == 1


def test_bad_labels_are_refused(tmp_path):
    store = PreferenceStore(str(tmp_path / "labels.db"))
    (pid,) = store.add_pairs(_pairs(1))
    with pytest.raises(ValueError, match="choice must be one of"):
        store.label(pid, "both", "ann")
    with pytest.raises(ValueError, match="say who labels"):
        store.label(pid, "answer1", "  ")
    with pytest.raises(KeyError):
        store.label("nope", "answer1", "ann")
    assert store.counts()["pending"] == 1


# -- the operator ----------------------------------------------------------------------------


def _op(tmp_path: Path, **args) -> HumanPreferenceAnnotationMapper:
    op = HumanPreferenceAnnotationMapper(**{**HumanPreferenceAnnotationMapper.default_args(), **args})
    op.bind(OperatorContext(job_dir=str(tmp_path / "job"), checkpoint_root=str(tmp_path)))
    return op


def test_it_conforms(tmp_path):
    rows = _rows(4)
    check_component(
        "operator",
        HumanPreferenceAnnotationMapper,
        init_args={"store_path": str(tmp_path / "s.db")},
        rows=rows,
    )


def test_without_waiting_it_returns_the_pairs_labelled_so_far(tmp_path, caplog):
    op = _op(tmp_path, project_name_prefix="Demo Project")
    assert op.store_path == str(tmp_path / "job" / "annotation" / "Demo_Project.db")
    rows, metrics = op.process(_rows(3))
    assert rows == [] and metrics["pairs"] == 3 and metrics["unlabelled"] == 3
    assert "3 of 3 pairs not labelled yet (wait_for_annotations is false) are left out" in caplog.text
    store = PreferenceStore(op.store_path)
    first = store.pairs()[0]
    store.label(first.pair_id, "answer2", "ann")
    rows, metrics = _op(tmp_path, project_name_prefix="Demo Project").process(_rows(3))
    assert [(r["prompt"], r["chosen"], r["rejected"], r["labelled_by"]) for r in rows] == [
        ("q0", "b0", "a0", "ann")
    ]
    assert metrics["labelled"] == 1 and metrics["unlabelled"] == 2 and store.counts()["pairs"] == 3


def _labeller(store_path: str, choices: dict[str, str], seen: list[int], stop: threading.Event) -> None:
    """A person at the page: decides each pair that appears (by prompt), noting how many pairs
    the store held at the time."""
    while not stop.is_set():
        try:
            store = PreferenceStore(store_path)
        except Exception:  # not created yet
            time.sleep(0.02)
            continue
        for pair in store.pairs(pending=True):
            seen.append(store.counts()["pairs"])
            store.label(pair.pair_id, choices.get(pair.prompt, "answer1"), "tester")
        time.sleep(0.02)


def test_it_waits_batch_by_batch_and_says_what_it_waits_for(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(HumanPreferenceAnnotationMapper, "_serve", lambda self, store: "http://page")
    caplog.set_level(logging.INFO, logger="trinity.data.annotation")
    op = _op(tmp_path, wait_for_annotations=True, poll_interval=0.05, timeout=30, max_tasks_per_batch=2)
    seen: list[int] = []
    stop = threading.Event()
    person = threading.Thread(
        target=_labeller, args=(op.store_path, {"q1": "answer2", "q2": "skip"}, seen, stop), daemon=True
    )
    person.start()
    try:
        rows, metrics = op.process(_rows(3))
    finally:
        stop.set()
        person.join()
    assert [(r["prompt"], r["chosen"]) for r in rows] == [("q0", "a0"), ("q1", "b1")]
    assert metrics["skipped"] == 1 and metrics["unlabelled"] == 0 and metrics["timed_out_batches"] == 0
    assert max(seen[:2]) == 2, "the second batch is added only once the first is decided"
    assert "waiting up to 30 s for" in caplog.text and "label them at http://page" in caplog.text


def test_a_timeout_keeps_what_was_labelled_and_says_what_is_left(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(HumanPreferenceAnnotationMapper, "_serve", lambda self, store: "http://page")
    caplog.set_level(logging.INFO, logger="trinity.data.annotation")
    op = _op(tmp_path, wait_for_annotations=True, poll_interval=0.05, timeout=0.3)
    store = PreferenceStore(op.store_path)
    store.add_pairs([("q0", "a0", "b0", _rows(1)[0])])
    store.label(store.pairs()[0].pair_id, "answer1", "ann")
    start = time.monotonic()
    rows, metrics = op.process(_rows(2))
    assert time.monotonic() - start < 5
    assert [r["prompt"] for r in rows] == ["q0"] and metrics["unlabelled"] == 1
    assert metrics["timed_out_batches"] == 1
    assert "waiting up to 0.3 s for 1 labels" in caplog.text
    assert "1 of 2 pairs still unlabelled after waiting 0.3 s are left out" in caplog.text


def test_without_the_studio_it_says_how_to_install_it(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "trinity_studio" else real(name, *a)
    )
    op = HumanPreferenceAnnotationMapper(wait_for_annotations=True)
    with pytest.raises(ValueError) as info:
        op.bind(OperatorContext(job_dir=str(tmp_path)))
    message = str(info.value)
    assert "\n" not in message and "pip install" in message and "trinity-studio" in message
    HumanPreferenceAnnotationMapper(wait_for_annotations=False).bind(OperatorContext(job_dir=str(tmp_path)))


def test_label_studio_settings_without_a_counterpart_are_reported_once(tmp_path, caplog):
    args = {"notification_config": {"enabled": True}, "label_config_file": "ui.xml", "samples_per_task": 2}
    _op(tmp_path, **args)
    notes = [r.message for r in caplog.records if r.name == "trinity.data.annotation"]
    assert len(notes) == 3 and any("notification_config has no effect" in n for n in notes)
    caplog.clear()
    _op(tmp_path, notification_config={"enabled": False})  # upstream's example: nothing to say
    assert not [r for r in caplog.records if r.name == "trinity.data.annotation"]


def test_bad_arguments_fail_in_one_line():
    for args, text in (
        ({"timeout": 0}, "timeout and poll_interval must be positive"),
        ({"max_tasks_per_batch": 0}, "max_tasks_per_batch must be at least 1"),
        ({"api_url": "localhost:7070"}, "api_url must be an http URL"),
    ):
        with pytest.raises(ValueError, match=text):
            HumanPreferenceAnnotationMapper(**args)


# -- the task pipeline of a DPO train job ------------------------------------------------------


def _dpo_job(tmp_path: Path, **op_args) -> object:
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows(3)))
    text = {
        "project": "p",
        "name": "dpo",
        "mode": "train",
        "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {"model_path": str(tmp_path / "model"), "max_model_len": 64},
        "algorithm": {"algorithm_type": "dpo"},
        "buffer": {
            "train_batch_size": 2,
            "trainer_input": {
                "experience_buffer": {"name": "dpo", "storage_type": "file", "path": str(tmp_path / "unused")}
            },
        },
        "data_processor": {
            "task_pipeline": {
                "inputs": [str(data)],
                "target_fields": ["prompt"],  # as upstream's example: the answers are kept too
                "operators": [{"name": NAME, "args": op_args}],
            }
        },
    }
    (tmp_path / "job.yaml").write_text(json.dumps(text))
    return load_config(tmp_path / "job.yaml")


def test_a_dpo_train_job_trains_on_the_labelled_pairs_and_sees_new_labels(tmp_path):
    from trinity.config.paths import check_paths

    config = _dpo_job(tmp_path)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    check_paths(config)  # the dataset the trainer reads is the pipeline's output: not there yet
    store = PreferenceStore(
        str(Path(config.checkpoint_job_dir) / "annotation" / "Human_Preference_Annotation.db")
    )
    ids = store.add_pairs([(r["prompt"], r["answer1"], r["answer2"], r) for r in _rows(3)])
    store.label(ids[0], "answer2", "ann")
    applied = apply_task_pipeline(config)
    folder = applied.buffer.trainer_input.experience_buffer.path
    assert folder == str(Path(config.checkpoint_job_dir) / "task_pipeline")
    rows = [json.loads(line) for line in (Path(folder) / "train.jsonl").read_text().splitlines()]
    assert [(r["prompt"], r["chosen"], r["rejected"]) for r in rows] == [("q0", "b0", "a0")]
    store.label(ids[2], "answer1", "bob")
    _, counts = run_task_pipeline(config)  # labels given since: not the saved output again
    rows = [json.loads(line) for line in (Path(folder) / "train.jsonl").read_text().splitlines()]
    assert [r["labelled_by"] for r in rows] == ["ann", "bob"] and counts["output_rows"] == 2


def test_the_dpo_reader_reads_the_labelled_rows(tmp_path):
    from trinity.buffer.sft import SFTDatasetReader
    from trinity.config.sections.buffer import ExperienceBufferConfig
    from trinity.testing.tiny_model import build_tokenizer

    store = PreferenceStore(str(tmp_path / "s.db"))
    ids = store.add_pairs([("2+2=", "4", "5", {"prompt": "2+2="}), ("1+1=", "3", "2", {"prompt": "1+1="})])
    store.label(ids[0], "answer1", "ann")
    store.label(ids[1], "answer2", "bob")
    (tmp_path / "dpo").mkdir()
    (tmp_path / "dpo" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in store.dpo_rows()))
    config = ExperienceBufferConfig(
        name="dpo",
        storage_type="file",
        path=str(tmp_path / "dpo"),
        schema_type="dpo",
        format={"prompt_type": "plaintext", "prompt_key": "prompt"},  # as upstream's example
    )
    tokenizer = build_tokenizer()
    reader = SFTDatasetReader(config, tokenizer)
    assert [s.response_text for s in reader.samples] == ["4", "2"] and not reader.skipped
    assert tokenizer.decode(reader.samples[0].rejected).strip().startswith("5")


def test_a_start_stopped_while_waiting_for_labels_keeps_them(tmp_path):
    from trinity.launcher import _remove_unstarted, _Start
    from trinity.run_status import write_run_status

    config = _dpo_job(tmp_path)
    job_dir = Path(config.checkpoint_job_dir)
    write_run_status(job_dir, "running")  # this process's start, stopped before its actors were up
    store = PreferenceStore(str(job_dir / "annotation" / "labels.db"))
    store.label(store.add_pairs(_pairs(1))[0], "answer1", "ann")
    stopped = KeyboardInterrupt()
    _remove_unstarted(config, job_dir, _Start(), stopped)
    assert PreferenceStore(store.path).counts()["labelled"] == 1
    assert "holds the labels given so far" in stopped.__notes__[0]
    store_less = _dpo_job(tmp_path / "other")  # without labels the folder goes, as before
    other_dir = Path(store_less.checkpoint_job_dir)
    write_run_status(other_dir, "running")
    _remove_unstarted(store_less, other_dir, _Start(), KeyboardInterrupt())
    assert not other_dir.exists()
