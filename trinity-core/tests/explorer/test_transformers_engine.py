"""The transformers rollout engine on the tiny local model."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from trinity.rollout.base import SamplingArgs, finish_point
from trinity.testing.tiny_model import create_tiny_model


def _reference_logprobs(model, tokens, prompt_length, temperature):
    """An independent full forward pass over the finished sequence."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    return lp[prompt_length - 1 :]


def test_generate_shapes_texts_and_reasons(engine):
    prompts = ["ab", "a much longer prompt"]
    exps = engine.generate(prompts, n=3, max_tokens=7, temperature=1.0, seed=5)
    assert len(exps) == 6
    for i, exp in enumerate(exps):
        prompt_ids = engine.encode(prompts[i // 3])
        assert exp.tokens[: exp.prompt_length].tolist() == prompt_ids
        assert exp.prompt_text == prompts[i // 3]
        assert 1 <= exp.response_length <= 7
        assert exp.logprobs.shape == (exp.response_length,) and exp.logprobs.dtype == torch.float32
        assert (exp.logprobs <= 0).all()
        assert exp.info["finish_reason"] in {"stop", "length"}
        if exp.info["finish_reason"] == "length":
            assert exp.response_length == 7
            assert exp.response_text == engine.tokenizer.decode(
                exp.tokens[exp.prompt_length :], skip_special_tokens=True
            )
        assert exp.model_version == engine.model_version


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_separate_forward_pass(engine, tiny_model_path, temperature):
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    # Prompts of different lengths: left padding must not change the numbers.
    exps = engine.generate(
        ["x", "hello there", "12+34="], n=2, max_tokens=16, temperature=temperature, seed=0
    )
    for exp in exps:
        tokens = exp.tokens.tolist()
        expected = _reference_logprobs(reference, tokens, exp.prompt_length, temperature)
        torch.testing.assert_close(exp.logprobs, expected, atol=1e-4, rtol=0)
        # ... and the engine's own scoring agrees.
        scored = engine.logprobs(tokens, temperature=temperature)[exp.prompt_length - 1 :]
        torch.testing.assert_close(scored, expected, atol=1e-4, rtol=0)


def test_each_experience_records_what_it_was_sampled_with(engine):
    # Read by the trainer's log-prob guard: this engine reports the full softmax's log-probs.
    exps = engine.generate(["ab"], n=2, max_tokens=3, temperature=0.7, top_k=5, top_p=0.9, seed=1)
    for exp in exps:
        assert exp.info["rollout_args"] == {
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 5,
            "logprobs_renormalised": False,
        }


def test_n_samples_differ_and_seed_reproduces(engine):
    a = engine.generate(["hello"], n=4, max_tokens=10, seed=11)
    b = engine.generate(["hello"], n=4, max_tokens=10, seed=11)
    c = engine.generate(["hello"], n=4, max_tokens=10, seed=12)
    ids = [tuple(e.tokens.tolist()) for e in a]
    assert ids == [tuple(e.tokens.tolist()) for e in b]
    assert len(set(ids)) > 1
    assert ids != [tuple(e.tokens.tolist()) for e in c]


def test_unseeded_calls_continue_one_stream(engine):
    a = engine.generate(["hello"], max_tokens=10)
    b = engine.generate(["hello"], max_tokens=10)
    assert a[0].tokens.tolist() != b[0].tokens.tolist()


def test_greedy_is_the_argmax_path(engine):
    exp = engine.generate(["hello"], temperature=0, max_tokens=8)[0]
    ids = engine.encode("hello")
    with torch.no_grad():
        for _ in range(exp.response_length):
            ids.append(int(engine.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    assert exp.tokens.tolist() == ids


def test_max_tokens_caps_the_response(engine):
    exps = engine.generate(["abc"], n=4, max_tokens=3, seed=2)
    assert all(e.response_length <= 3 for e in exps)
    assert any(e.info["finish_reason"] == "length" and e.response_length == 3 for e in exps)


def test_stop_string_ends_the_response(engine):
    full = engine.generate(["hello"], max_tokens=30, seed=3)[0]
    text = full.response_text
    stop = text[len(text) // 2]  # a character the same seeded sample will produce
    cut = text.index(stop)
    stopped = engine.generate(["hello"], max_tokens=30, seed=3, stop=[stop])[0]
    assert stopped.info["finish_reason"] == "stop"
    assert stopped.response_text == text[:cut]
    assert stopped.response_length == cut + 1  # the token completing the stop string is kept
    assert stopped.logprobs.shape == (cut + 1,)


def test_finish_point_eos_and_multi_token_stop():
    decode = "".join  # one character per "token"
    assert finish_point(list("abc"), {"<eos>"}, [], decode) == (3, "length", "abc")
    assert finish_point(
        ["a", "<eos>", "b"], {"<eos>"}, [], lambda t: "".join(x for x in t if x != "<eos>")
    ) == (
        2,
        "stop",
        "a",
    )
    assert finish_point(list("xxSTOPyy"), set(), ["STOP", "yy"], decode) == (6, "stop", "xx")


def test_chat_applies_the_template(engine):
    messages = [{"role": "user", "content": "hi"}]
    exp = engine.chat(messages, max_tokens=4, seed=0)[0]
    assert exp.prompt_text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    cont = engine.apply_chat_template([*messages, {"role": "assistant", "content": "he"}])
    assert cont.endswith("<|im_start|>assistant\nhe")


def test_sampling_args_validation():
    args = SamplingArgs().updated({"temperature": 0.5, "top_k": None}, n=2, stop="END")
    assert (args.temperature, args.top_k, args.n, args.stop) == (0.5, -1, 2, ["END"])
    with pytest.raises(TypeError, match="max_tokenz"):
        SamplingArgs().updated(max_tokenz=3)
    with pytest.raises(ValueError, match="n must be"):
        SamplingArgs(n=0)


def test_update_weights_and_load_checkpoint(tmp_path, tiny_model_path):
    from trinity.rollout.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_path, dtype="float32", device="cpu")
    tokens = engine.encode("hello world")
    before = engine.logprobs(tokens)
    other_path = create_tiny_model(tmp_path / "other", seed=7)
    other = AutoModelForCausalLM.from_pretrained(other_path, dtype=torch.float32)

    engine.update_weights(other.state_dict(), version=3)
    assert engine.model_version == 3
    expected = _reference_logprobs(other, tokens, 1, 1.0)
    torch.testing.assert_close(engine.logprobs(tokens), expected, atol=1e-5, rtol=0)
    assert engine.generate(["a"], max_tokens=2)[0].model_version == 3

    engine.load_checkpoint(tiny_model_path, version=4)
    torch.testing.assert_close(engine.logprobs(tokens), before, atol=1e-6, rtol=0)
    assert engine.model_version == 4

    with pytest.raises(KeyError, match="not in the rollout model"):
        engine.update_weights({"no.such.weight": torch.zeros(1)}, version=5)
    name, value = next(iter(other.state_dict().items()))
    with pytest.raises(ValueError, match="shape"):
        engine.update_weights({name: torch.zeros(value.shape[0] + 1)}, version=5)
    assert engine.model_version == 4


def _concurrent(engine, calls):
    """Run ``engine.generate_tokens`` for each ``(prompts, args)`` in its own thread, all of them
    queued while the engine is busy (its lock held here), then released at once."""
    import threading
    import time

    results: list = [None] * len(calls)
    errors: list = [None] * len(calls)

    def work(i, prompts, args):
        try:
            results[i] = engine.generate_tokens(prompts, args)
        except BaseException as exc:  # handed back to the test
            errors[i] = exc

    threads = [threading.Thread(target=work, args=(i, *c)) for i, c in enumerate(calls)]
    before = (engine.batches_run, engine.calls_batched)
    with engine._lock:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while len(engine._queue) < len(calls) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(engine._queue) == len(calls)
    for t in threads:
        t.join(timeout=60)
    return results, errors, (engine.batches_run - before[0], engine.calls_batched - before[1])


def test_concurrent_calls_share_one_generate_and_each_gets_its_own_answers(engine, tiny_model_path):
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    args = SamplingArgs(n=3, max_tokens=9, temperature=1.0)
    texts = [["ab"], ["a much longer prompt", "xy"], ["12+34="], ["q"]]
    calls = [([engine.encode(t) for t in group], args) for group in texts]
    results, errors, (batches, answered) = _concurrent(engine, calls)
    assert errors == [None] * 4
    assert (batches, answered) == (1, 4)  # four callers, one generate
    for (prompts, _), groups in zip(calls, results, strict=True):
        assert len(groups) == len(prompts)
        for prompt, group in zip(prompts, groups, strict=True):
            assert len(group) == 3
            for exp in group:
                assert exp.tokens[: exp.prompt_length].tolist() == prompt
                tokens = exp.tokens.tolist()
                # Batched with longer and shorter prompts: the logprobs are still the sequence's own.
                expected = _reference_logprobs(reference, tokens, exp.prompt_length, 1.0)
                torch.testing.assert_close(exp.logprobs, expected, atol=1e-4, rtol=0)


def test_only_calls_with_the_same_arguments_are_batched(engine):
    short, long = SamplingArgs(n=2, max_tokens=2), SamplingArgs(n=2, max_tokens=12, min_tokens=12)
    calls = [([engine.encode("ab")], short), ([engine.encode("cd")], long), ([engine.encode("ef")], short)]
    results, errors, (batches, answered) = _concurrent(engine, calls)
    assert errors == [None] * 3
    assert (batches, answered) == (2, 3)
    assert all(exp.response_length <= 2 for i in (0, 2) for exp in results[i][0])
    assert all(exp.response_length == 12 for exp in results[1][0])


def test_a_seeded_call_samples_the_same_alone_or_batched_with_others(engine):
    args = SamplingArgs(n=2, max_tokens=8, seed=7)
    alone = engine.generate_tokens([engine.encode("hello")], args)
    calls = [
        ([engine.encode("a much longer prompt")], SamplingArgs(n=2, max_tokens=8, seed=3)),
        ([engine.encode("hello")], args),
        ([engine.encode("x")], SamplingArgs(n=2, max_tokens=8)),
    ]
    results, errors, (batches, answered) = _concurrent(engine, calls)
    assert errors == [None] * 3 and (batches, answered) == (1, 3)  # seeds differ, one batch
    # Each row samples with a generator of its own: the neighbours change nothing.
    assert [e.tokens.tolist() for e in results[1][0]] == [e.tokens.tolist() for e in alone[0]]


def test_row_sampler_draws_from_the_tempered_filtered_distribution():
    from trinity.rollout.sampling import RowSampler, row_seeds

    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    scores = probs.log().repeat(4000, 1)
    seeds = row_seeds(0, 4000, 1)

    def frequencies(**kw):
        picks = RowSampler(seeds, **kw)(None, scores).argmax(-1)
        return torch.bincount(picks, minlength=4).float() / len(picks)

    torch.testing.assert_close(frequencies(temperature=1.0, top_k=-1, top_p=1.0), probs, atol=0.03, rtol=0)
    tempered = torch.softmax(probs.log() / 0.5, -1)  # temperature 0.5 sharpens
    torch.testing.assert_close(frequencies(temperature=0.5, top_k=-1, top_p=1.0), tempered, atol=0.03, rtol=0)
    top2 = torch.tensor([0.0, 0.0, 3 / 7, 4 / 7])
    torch.testing.assert_close(frequencies(temperature=1.0, top_k=2, top_p=1.0), top2, atol=0.03, rtol=0)
    # top_p 0.65: the smallest set of most likely tokens holding 65% is {0.4, 0.3}
    torch.testing.assert_close(frequencies(temperature=1.0, top_k=-1, top_p=0.65), top2, atol=0.03, rtol=0)
    assert frequencies(temperature=1.0, top_k=1, top_p=1.0).tolist() == [0.0, 0.0, 0.0, 1.0]
    # The same seeds give the same draws; the output is 0 at the draw and -inf elsewhere.
    out = RowSampler(seeds[:5], 1.0, -1, 1.0)(None, scores[:5])
    assert torch.equal(out, RowSampler(seeds[:5], 1.0, -1, 1.0)(None, scores[:5]))
    assert ((out == 0).sum(-1) == 1).all() and torch.isinf(out).sum() == 5 * 3
    # Each step uses the next draw; a sampler is made for max_steps steps.
    sampler = RowSampler(seeds[:5], 1.0, -1, 1.0, max_steps=2)
    steps = [sampler(None, scores[:5]).argmax(-1) for _ in range(2)]
    cdf = probs.double().cumsum(-1)
    for t in range(2):  # step t inverts the CDF at each row's t-th draw
        expected = torch.searchsorted(cdf, sampler.uniforms[:, t].contiguous(), right=True)
        assert steps[t].tolist() == expected.tolist()
    with pytest.raises(RuntimeError, match="made for 2 steps"):
        sampler(None, scores[:5])


def test_a_failing_batch_fails_every_caller_in_it(engine, monkeypatch):
    def broken(*_):
        raise RuntimeError("generate blew up")

    monkeypatch.setattr(engine, "_generate_chunk", broken)
    args = SamplingArgs(n=1, max_tokens=4)
    calls = [([engine.encode("ab")], args), ([engine.encode("cd")], args)]
    results, errors, (batches, _) = _concurrent(engine, calls)
    assert results == [None, None] and batches == 0  # counts only the batches that succeeded
    assert [str(e) for e in errors] == ["generate blew up"] * 2
    monkeypatch.undo()
    assert engine._queue == []  # nothing left behind for the next caller
    assert len(engine.generate_tokens([engine.encode("ab")], args)) == 1


def _in_thread(fn):
    import threading

    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_a_call_from_outside_a_runner_never_waits_for_others(engine, monkeypatch):
    # Waiting limits that would hold a waiting call for a minute: a call with no runner task
    # marked on the engine (the OpenAI server, a script) must not wait at all.
    monkeypatch.setattr(engine, "batch_wait", 60.0)
    monkeypatch.setattr(engine, "batch_gap", 60.0)
    thread, out = _in_thread(
        lambda: engine.generate_tokens([engine.encode("ab")], SamplingArgs(n=1, max_tokens=3))
    )
    thread.join(timeout=30)
    assert out and len(out[0]) == 1


def test_a_marked_task_busy_elsewhere_holds_a_batch_only_for_the_gap(engine, monkeypatch):
    # One runner task is marked but never calls (busy in its environment): the batch of the one
    # that calls starts once no call came for batch_gap, long before batch_wait.
    monkeypatch.setattr(engine, "batch_wait", 60.0)
    monkeypatch.setattr(engine, "batch_gap", 0.05)
    with engine.caller(), engine.caller():
        assert engine._callers == 2
        thread, out = _in_thread(
            lambda: engine.generate_tokens([engine.encode("ab")], SamplingArgs(n=2, max_tokens=3))
        )
        thread.join(timeout=30)
        assert out and len(out[0][0]) == 2
    assert engine._callers == 0


def test_marked_tasks_calling_at_different_moments_share_one_generate(engine, monkeypatch):
    import threading
    import time

    monkeypatch.setattr(engine, "batch_wait", 60.0)
    monkeypatch.setattr(engine, "batch_gap", 60.0)
    args = SamplingArgs(n=2, max_tokens=4)
    results: list = [None] * 4
    # Every task is on the engine before the first calls (a loaded machine may start a thread
    # late; a task that has not started yet is nobody the batch can wait for).
    started = threading.Barrier(4)

    def task(i):
        with engine.caller():
            started.wait(timeout=30)
            time.sleep(0.02 * i)  # the calls arrive one by one
            results[i] = engine.generate_tokens([engine.encode(f"{i}+1=")], args)

    before = (engine.batches_run, engine.calls_batched)
    threads = [threading.Thread(target=task, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(r is not None and len(r[0]) == 2 for r in results)
    assert (engine.batches_run - before[0], engine.calls_batched - before[1]) == (1, 4)


def _fresh_engine(tiny_model_path, **kwargs):
    from trinity.rollout.transformers_engine import TransformersEngine

    return TransformersEngine(tiny_model_path, dtype="float32", device="cpu", seed=0, **kwargs)


def test_samples_of_a_prompt_share_its_prefill_and_sample_the_same(tiny_model_path):
    prompts = ["x", "hello there", "12+34="]  # different lengths: left padding
    # transformers' forward for every step, so that the hook below sees each of them.
    shared, own = (_fresh_engine(tiny_model_path, lean_decoding=False) for _ in range(2))
    own.share_prefill = False
    widths: list[tuple[int, int]] = []
    shared.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    a = shared.generate(prompts, n=4, max_tokens=12, temperature=1.0, seed=3)
    b = own.generate(prompts, n=4, max_tokens=12, temperature=1.0, seed=3)
    width = max(len(shared.encode(p)) for p in prompts)
    # One pass over the 3 prompts (all but their last column), then generate() runs 12 rows from
    # the last prompt column on.
    assert widths[:2] == [(3, width - 1), (12, 1)]
    assert [e.tokens.tolist() for e in a] == [e.tokens.tolist() for e in b]
    for x, y in zip(a, b):
        torch.testing.assert_close(x.logprobs, y.logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 1.0},
        {"temperature": 0.7, "top_k": 20, "top_p": 0.9},
        {"temperature": 0.0},
        {"temperature": 1.0, "min_tokens": 10},
    ],
    ids=["sample", "top-k-p", "greedy", "min-tokens"],
)
@pytest.mark.parametrize("lean", [True, False], ids=["lean-step", "model-forward"])
def test_own_loop_samples_what_generate_samples(tiny_model_path, kwargs, lean):
    """The engine's loop (finished rows dropped; its steps lean or transformers' forward) and
    transformers' generate: the same tokens, log-probs and finish reasons for the same seeds."""
    prompts = ["x", "hello there", "12+34="]
    own, hf = _fresh_engine(tiny_model_path, lean_decoding=lean), _fresh_engine(tiny_model_path)
    assert (own.lean is not None) == lean
    hf.own_loop = False
    args = {"n": 3, "max_tokens": 12, "seed": 7, **kwargs}
    a, b = own.generate(prompts, **args), hf.generate(prompts, **args)
    assert own.own_loop and not hf.own_loop
    assert [e.tokens.tolist() for e in a] == [e.tokens.tolist() for e in b]
    assert [e.info["finish_reason"] for e in a] == [e.info["finish_reason"] for e in b]
    assert {e.info["finish_reason"] for e in a} == {"stop", "length"}  # rows finish at different steps
    assert min(e.response_length for e in a) >= kwargs.get("min_tokens", 1)
    for x, y in zip(a, b):
        torch.testing.assert_close(x.logprobs, y.logprobs, atol=1e-5, rtol=0)


def test_own_loop_drops_finished_rows(tiny_model_path):
    engine = _fresh_engine(tiny_model_path, lean_decoding=False)  # every step a model forward
    rows: list[int] = []
    engine.model.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    exps = engine.generate(["hello there"], n=8, max_tokens=30, temperature=1.0, seed=2)
    lengths = sorted(e.response_length for e in exps)
    assert lengths[0] < lengths[-1]  # some rows finish early (EOS) ...
    # ... and each decoding step runs only the rows still going: one prefill of the prompt, the
    # last prompt column for all 8 rows, then one step per token with the unfinished rows.
    assert rows[:2] == [1, 8]
    assert rows[2:] == [sum(length > step for length in lengths) for step in range(1, lengths[-1])]


@pytest.mark.parametrize(
    ("method", "flag", "warning"),
    [
        ("batch_repeat_interleave", "share_prefill", "cannot share a prompt's prefill"),
        ("batch_select_indices", "own_loop", "cannot drop finished rows"),
    ],
    ids=["prefill-every-row", "generate"],
)
def test_a_cache_without_a_batch_method_falls_back_once(
    tiny_model_path, monkeypatch, caplog, method, flag, warning
):
    """A cache that cannot repeat rows prefills every row; one that cannot select rows samples
    with ``generate``: one warning, and the same samples."""
    from transformers import DynamicCache

    def refuse(self, arg):
        raise NotImplementedError(f"no {method}")

    monkeypatch.setattr(DynamicCache, method, refuse)
    # The lean decoding step keeps its own cache: this is about transformers' cache.
    engine = _fresh_engine(tiny_model_path, lean_decoding=False)
    with caplog.at_level("WARNING", logger="trinity.rollout.transformers_generate"):
        a = engine.generate(["hello"], n=3, max_tokens=8, seed=4)
        engine.generate(["hello"], n=3, max_tokens=8, seed=4)
    assert getattr(engine, flag) is False
    assert caplog.text.count(warning) == 1
    monkeypatch.undo()
    own = _fresh_engine(tiny_model_path)
    assert [e.tokens.tolist() for e in a] == [
        e.tokens.tolist() for e in own.generate(["hello"], n=3, max_tokens=8, seed=4)
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the engine's loop on the GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_own_loop_on_the_gpu_samples_what_generate_samples(tiny_model_path, dtype):
    from trinity.rollout.transformers_engine import TransformersEngine

    own, hf = (TransformersEngine(tiny_model_path, dtype=dtype, device="cuda", seed=0) for _ in range(2))
    hf.own_loop = False
    args = {"n": 4, "max_tokens": 12, "temperature": 1.0, "seed": 5}
    a, b = own.generate(["x", "hello there"], **args), hf.generate(["x", "hello there"], **args)
    assert own.own_loop
    # bf16 rounding may flip a sample late in a row; the first tokens and most rows agree.
    same = sum(x.tokens.tolist() == y.tokens.tolist() for x, y in zip(a, b))
    assert same == len(a) if dtype == "float32" else same >= len(a) // 2


def test_torch_work_runs_on_the_engines_own_thread(tiny_model_path, monkeypatch):
    """Generation, scoring and weight updates from any thread run on one thread of the
    engine's (one OpenMP team for the process: see TransformersEngine.__init__)."""
    from trinity.rollout.lean_decoding import LeanDecoder

    engine = _fresh_engine(tiny_model_path)
    seen: set[int] = set()
    engine.model.register_forward_pre_hook(lambda module, args: seen.add(threading.get_ident()))
    real_step = LeanDecoder.step
    monkeypatch.setattr(
        LeanDecoder, "step", lambda self, *a: (seen.add(threading.get_ident()), real_step(self, *a))[1]
    )
    real_copy = torch.Tensor.copy_
    copies: set[int] = set()

    def copy(self, *args, **kwargs):
        copies.add(threading.get_ident())
        return real_copy(self, *args, **kwargs)

    def work(i):
        engine.generate(["hello"], n=2, max_tokens=6, seed=i)
        engine.logprobs(engine.encode("12+34="))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    work(3)  # and from this thread
    state = {name: value.clone() for name, value in engine.model.state_dict().items()}
    monkeypatch.setattr(torch.Tensor, "copy_", copy)
    engine.update_weights(state, version=1)
    monkeypatch.undo()
    callers = {t.ident for t in threads} | {threading.get_ident()}
    assert len(seen) == 1 and not seen & callers
    assert copies == seen
