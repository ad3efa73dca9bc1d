"""The Data-Juicer service (``service.data_juicer``) and LLM operators pointed at auxiliary
models served by the job: real Data-Juicer recipes, a real service process, a real OpenAI
server in front of a judge engine whose verdict depends on the text it is shown."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

pytest.importorskip("data_juicer", reason="Data-Juicer is the optional extra trinity-core[data-juicer]")
pytest.importorskip("openai", reason="Data-Juicer's API models and the scorer talk through openai")

from trinity.config import InferenceModelConfig
from trinity.config.sections.data import DataJuicerServiceConfig
from trinity.data import dj_client
from trinity.data.data_juicer import DataJuicerOperator
from trinity.data.dj_server import main as server_main
from trinity.data.operator import OperatorContext
from trinity.experience import EID, Experience
from trinity.rollout.base import RolloutEngine, SamplingArgs
from trinity.serving.auxiliary import ServedModels
from trinity.testing.tiny_model import build_tokenizer

RECIPE = [
    {"text_length_filter": {"min_len": 10, "max_len": 60}},
    {"word_repetition_filter": {"rep_len": 1, "min_ratio": 0.0, "max_ratio": 0.5}},
]
RESPONSES = [
    "The answer is twelve, because 3+4+5=12.",
    "short",  # text_length_filter drops it
    "no no no no no no no no no no",  # word_repetition_filter drops it
    "Seven plus five makes twelve in total.",
]
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def _exps() -> list[Experience]:
    return [
        Experience(
            tokens=torch.arange(6),
            prompt_length=3,
            reward=1.0,
            eid=EID(batch=1, task=i // 2, run=i % 2),
            prompt_text=f"question {i // 2}",
            response_text=text,
        )
        for i, text in enumerate(RESPONSES)
    ]


def _outcome(op: DataJuicerOperator) -> list[tuple[str, dict[str, float]]]:
    kept, _ = op.process(_exps())
    return [(e.response_text, dict(e.info)) for e in kept]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def service():
    """A service started by hand (``python -m trinity.data.dj_server``) with a token."""
    port = _free_port()
    env = {**os.environ, "TRINITY_DJ_TOKEN": "s3cret"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trinity.data.dj_server", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    client = dj_client.DataJuicerClient(f"http://127.0.0.1:{port}", "s3cret")
    deadline = time.monotonic() + 120
    while True:
        try:
            client.health(timeout=1.0)
            break
        except ConnectionError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-2000:]
            time.sleep(0.2)
    yield client.url
    proc.terminate()
    proc.wait(10)


@pytest.mark.slow  # over ~3 s on 2 cores: not in `nox -s unit`
def test_a_recipe_through_an_auto_started_service_equals_it_in_process():
    local = DataJuicerOperator(process=RECIPE)
    local.bind(OperatorContext())
    expected = _outcome(local)
    assert [text for text, _ in expected] == [RESPONSES[0], RESPONSES[3]]
    assert all(info["text_len"] == len(text) for text, info in expected)

    first = DataJuicerOperator(process=RECIPE)
    second = DataJuicerOperator(process=RECIPE[:1])
    ctx = OperatorContext(data_juicer=DataJuicerServiceConfig(auto_start=True))
    first.bind(ctx)
    second.bind(ctx)
    started = dj_client._local
    assert started is not None and started.users == 2, "operators of one process share one service"
    assert first._client is not None and first._session is not None
    assert _outcome(first) == expected
    first.close()
    assert started.process.poll() is None, "the service outlives its first operator"
    assert [text for text, _ in _outcome(second)] == [RESPONSES[0], RESPONSES[2], RESPONSES[3]]
    second.close()
    assert started.process.wait(15) is not None and dj_client._local is None


@pytest.mark.slow  # over ~3 s on 2 cores: not in `nox -s unit`
def test_a_running_service_at_server_url_with_its_token(service, monkeypatch):
    config = DataJuicerServiceConfig(server_url=service)
    monkeypatch.setenv("TRINITY_DJ_TOKEN", "wrong")
    with pytest.raises(ValueError, match="401 missing or wrong token"):
        DataJuicerOperator(process=RECIPE).bind(OperatorContext(data_juicer=config))
    monkeypatch.setenv("TRINITY_DJ_TOKEN", "s3cret")
    op = DataJuicerOperator(process=RECIPE)
    op.bind(OperatorContext(data_juicer=config))
    assert [text for text, _ in _outcome(op)] == [RESPONSES[0], RESPONSES[3]]
    op.close()
    assert op._client is None
    tasks = DataJuicerOperator(process=[{"text_length_filter": {"min_len": 10, "text_key": "question"}}])
    tasks.bind(OperatorContext(data_juicer=config))
    rows = [{"question": "What is 3+4+5?", "answer": "12"}, {"question": "hi", "answer": "1"}]
    kept, _ = tasks.process(rows)
    assert [row["question"] for row in kept] == [rows[0]["question"]]
    assert kept[0]["__dj__stats__"]["text_len"] == len(rows[0]["question"])
    tasks.close()
    # A recipe the service cannot build is refused when the operator binds, in one line (here
    # the name is checked first where Data-Juicer is installed; a client without it relies on this).
    bad = DataJuicerOperator(process=RECIPE[:1])
    bad.recipe = [{"no_such_filter": {}}]
    with pytest.raises(ValueError, match="the Data-Juicer service rejected the recipe") as info:
        bad.bind(OperatorContext(data_juicer=config))
    assert "\n" not in str(info.value)
    bad.close()


def test_an_unreachable_service_or_an_unknown_operator_is_one_line():
    url = f"http://127.0.0.1:{_free_port()}"
    op = DataJuicerOperator(process=RECIPE)
    with pytest.raises(ValueError) as info:
        op.bind(OperatorContext(data_juicer=DataJuicerServiceConfig(server_url=url)))
    message = str(info.value)
    assert f"Data-Juicer service at {url} does not answer" in message and "\n" not in message
    assert "python -m trinity.data.dj_server" in message and "auto_start: true" in message
    with pytest.raises(
        ValueError, match="has no operator 'text_lenght_filter'; did you mean 'text_length_filter'"
    ):
        DataJuicerOperator(process=[{"text_lenght_filter": {}}])


def test_the_service_refuses_other_hosts_without_a_token(capsys, monkeypatch):
    monkeypatch.delenv("TRINITY_DJ_TOKEN", raising=False)
    assert server_main(["--host", "0.0.0.0", "--port", "1"]) == 2
    assert "without a token" in capsys.readouterr().err


# -- LLM operators scoring with an auxiliary model this job serves -----------------------------


class JudgeEngine(RolloutEngine):
    """Answers Data-Juicer's quality prompt with all 5s when the sample mentions "twelve",
    all 1s otherwise, and the difficulty prompt with 0.8 / 0.2 the same way."""

    def __init__(self) -> None:
        tokenizer = build_tokenizer()
        super().__init__(tokenizer, chat_template=TEMPLATE, default_args=SamplingArgs(max_tokens=200))
        self.prompts: list[str] = []
        self._lock = threading.Lock()
        self.shut = False

    def generate_tokens(self, prompts, args):
        groups = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt)
            good = "twelve" in text
            with self._lock:
                self.prompts.append(text)
            if "difficulty" in text:
                reply = json.dumps({"difficulty": 0.8 if good else 0.2})
            else:
                score = 5 if good else 1
                dims = {k: score for k in ("accuracy", "grammar", "informativeness", "coherence")}
                reply = json.dumps(
                    {"dimension_scores": dims, "flags": [], "rationale": "r", "recommendation": ["keep"]}
                )
            ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
            groups.append(
                [
                    Experience(
                        tokens=torch.tensor(prompt + ids),
                        prompt_length=len(prompt),
                        logprobs=torch.zeros(len(ids)),
                        response_text=reply,
                        info={"finish_reason": "stop"},
                    )
                    for _ in range(args.n)
                ]
            )
        return groups

    def logprobs(self, tokens, temperature=1.0):
        raise NotImplementedError

    def update_weights(self, state_dict, version):
        pass

    def load_checkpoint(self, path, version):
        pass

    def shutdown(self):
        self.shut = True


JUDGE = InferenceModelConfig(name="judge", model_path="/models/judge-7b")
QUALITY = [
    {
        "llm_quality_score_filter": {
            "api_or_hf_model": "judge",
            "min_score": 0.5,
            "input_keys": ["prompt_text", "response_text"],
            "field_names": ["prompt", "response"],
            "try_num": 1,
        }
    }
]


@pytest.mark.parametrize("where", ["in-process", "service"])
def test_a_data_juicer_llm_operator_scores_with_the_served_auxiliary_model(where, service, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("TRINITY_DJ_TOKEN", "s3cret")
    judge = JudgeEngine()
    with ServedModels([JUDGE], engine_for=lambda i: judge) as served:
        op = DataJuicerOperator(process=QUALITY)
        dj = DataJuicerServiceConfig(server_url=service) if where == "service" else None
        op.bind(OperatorContext(model_url=served.url, data_juicer=dj))
        assert op.models_served == {"judge": served.url("judge")}
        kept, _ = op.process(_exps())
        op.close()
    # The judge saw every sample once and its verdict decided: 5/5 kept, 1/5 dropped.
    assert len(judge.prompts) == len(RESPONSES)
    assert [e.response_text for e in kept] == [RESPONSES[0], RESPONSES[3]]
    assert all(e.info["llm_quality_score"] == 1.0 for e in kept)


def test_an_llm_operator_whose_model_nobody_serves_stops_in_one_line(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    op = DataJuicerOperator(process=QUALITY)
    with pytest.raises(ValueError) as info:
        op.bind(OperatorContext())
    message = str(info.value)
    assert "llm_quality_score_filter calls model 'judge'" in message and "\n" not in message
    # Served under its model_path too; an address of its own wins over the served model.
    op = DataJuicerOperator(
        process=[
            {
                "llm_quality_score_filter": {
                    **QUALITY[0]["llm_quality_score_filter"],
                    "api_or_hf_model": "/models/judge-7b",
                }
            }
        ]
    )
    served = ServedModels([JUDGE], engine_for=lambda i: JudgeEngine())
    url = served.url("/models/judge-7b")
    assert url is not None and served.url("judge") == url and served.url("other") is None
    op.bind(OperatorContext(model_url=served.url))
    assert op.recipe[0]["llm_quality_score_filter"]["model_params"] == {"base_url": url, "api_key": "EMPTY"}
    own = {"base_url": "http://example.invalid/v1"}
    op = DataJuicerOperator(
        process=[
            {"llm_quality_score_filter": {**QUALITY[0]["llm_quality_score_filter"], "model_params": own}}
        ]
    )
    op.bind(OperatorContext(model_url=served.url))
    assert op.recipe[0]["llm_quality_score_filter"]["model_params"] == own and not op.models_served
    served.close()


def test_the_task_pipeline_serves_its_scoring_model_in_the_driver(tmp_path, monkeypatch, capsys):
    """``llm_difficulty_score_filter`` names an auxiliary model: the driver loads it (its
    configured engine), serves it for the pipeline and shuts it down afterwards."""
    from trinity import rollout as engines
    from trinity.config import load_config
    from trinity.data.tasks import run_task_pipeline

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    judges: list[JudgeEngine] = []

    def create_engines(config, **_):
        assert config.name == "judge" and config.engine_num == 1
        judges.append(JudgeEngine())
        return judges[-1:]

    monkeypatch.setattr(engines, "create_engines", create_engines)
    rows = [{"question": f"{word} apples", "answer": "x"} for word in ("twelve", "three", "twelve!", "four")]
    (tmp_path / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "job.yaml").write_text(
        f"""
project: p
name: n
checkpoint_root_dir: {tmp_path}/ckpt
model: {{model_path: {tmp_path}/model, max_model_len: 64}}
algorithm: {{algorithm_type: grpo, repeat_times: 2}}
explorer:
  auxiliary_models: [{{name: judge, model_path: /models/judge-7b, engine_type: transformers}}]
data_processor:
  task_pipeline:
    num_process: 2
    inputs: [{tmp_path}/raw.jsonl]
    operators:
      - name: llm_difficulty_score_filter
        args: {{api_or_hf_model: judge, min_score: 0.5, max_score: 1.0}}
buffer:
  batch_size: 2
  explorer_input:
    taskset: {{name: t, path: {tmp_path}/unused, format: {{prompt_key: question, response_key: answer}}}}
  trainer_input:
    experience_buffer: {{name: e, storage_type: queue}}
"""
    )
    config = load_config(tmp_path / "job.yaml")  # the model is served when the pipeline runs
    assert not judges
    with ServedModels(config.explorer.auxiliary_models) as served:  # what the launcher passes
        folder, counts = run_task_pipeline(config, served)
    with open(os.path.join(folder, "train.jsonl")) as f:
        kept = [json.loads(line) for line in f]
    assert [r["question"] for r in kept] == ["twelve apples", "twelve! apples"]
    assert [r["difficulty_score"] for r in kept] == [0.8, 0.8]
    assert counts["llm_difficulty_score_filter/out_of_range"] == 2.0
    assert len(judges) == 1 and len(judges[0].prompts) == len(rows) and judges[0].shut
    assert "loading auxiliary model 'judge'" in capsys.readouterr().out

    # Without a model server the operator's auxiliary model is one line, never a silent
    # fall-back to $OPENAI_BASE_URL or an engine loaded by the data processor itself.
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    (tmp_path / "raw.jsonl").write_text(json.dumps({"question": "five apples", "answer": "x"}) + "\n")
    with pytest.raises(
        ValueError,
        match=r"operators\[0\] \(llm_difficulty_score_filter\): auxiliary model 'judge' is not served",
    ):
        run_task_pipeline(config)
    assert len(judges) == 1
