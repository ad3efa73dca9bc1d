"""Benchmark: chat requests through the OpenAI-compatible API vs calling the engine directly.

    python benchmarks/openai_api.py [--requests 48] [--concurrency 1 16] [--max-tokens 32]
                                    [--hidden 128] [--layers 2] [--repeats 3] [--device cpu]
                                    [--threads 1]

One process, one ``TransformersEngine`` on a locally created tiny model (nothing is downloaded).
``direct``: C threads, each calling ``engine.chat(messages, ...)`` in a loop, the way workflow
code calls the model. ``api``: C threads, each with its own ``openai.OpenAI`` client posting to
``/v1/chat/completions`` of a :class:`ModelWrapper`'s server (history on, so every call is also
recorded as an Experience, as in training). Every request samples exactly ``--max-tokens`` tokens
(``min_tokens = max_tokens``), so both paths do the same engine work; the engine batches
concurrent calls in both. ``--threads`` caps torch's CPU threads (the HTTP server, the clients
and the engine share the cores, as in an explorer process). Each repeat runs both paths back to back at every concurrency, so load
from other processes hits both alike.

With ``--max-batch-size 1`` the engine answers one call per ``generate`` in both paths, which
isolates the API's own cost from how well each path's arrivals batch.

Prints, per path and concurrency: requests/s (median over repeats), p50 and p99 latency of a
request (all repeats pooled), the mean number of calls the engine answered per ``generate``
batch, and the ratio api / direct of requests/s.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

from trinity.explorer.model_wrapper import ModelWrapper
from trinity.rollout.transformers_engine import TransformersEngine
from trinity.testing.tiny_model import create_tiny_model

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 17 + 25? Think step by step."},
]


def run_clients(
    concurrency: int, requests: int, make_call: Callable[[], Callable[[], None]]
) -> tuple[float, list[float]]:
    """``concurrency`` threads share ``requests`` calls (closed loop); ``(seconds, latencies)``."""
    per_thread = [requests // concurrency + (i < requests % concurrency) for i in range(concurrency)]
    latencies: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start_line = threading.Barrier(concurrency + 1)

    def client(count: int) -> None:
        call = make_call()
        mine = []
        start_line.wait()
        try:
            for _ in range(count):
                t0 = time.perf_counter()
                call()
                mine.append(time.perf_counter() - t0)
        except BaseException as exc:
            errors.append(exc)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(c,)) for c in per_thread]
    for t in threads:
        t.start()
    start_line.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return seconds, latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=48, help="requests per path, concurrency and repeat")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--max-batch-size", type=int, default=256, help="engine's max_batch_size (1: no batching of calls)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()

    import openai
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    sampling = {"max_tokens": args.max_tokens, "min_tokens": args.max_tokens, "temperature": 1.0}
    # min_tokens is vLLM's extension of the OpenAI request: the client sends it in extra_body.
    api_sampling = {
        "max_tokens": args.max_tokens,
        "temperature": 1.0,
        "extra_body": {"min_tokens": args.max_tokens},
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = create_tiny_model(tmp, hidden_size=args.hidden, num_layers=args.layers, seed=0)
        engine = TransformersEngine(
            path, dtype="float32", device=args.device, seed=0, max_batch_size=args.max_batch_size
        )
        model = ModelWrapper(engine, enable_history=True)
        base_url = model.openai_base_url

        def direct() -> Callable[[], None]:
            return lambda: engine.chat(MESSAGES, **sampling)

        def api() -> Callable[[], None]:
            client = openai.OpenAI(base_url=base_url, api_key="EMPTY", max_retries=0)

            def call() -> None:
                out = client.chat.completions.create(model="rollout", messages=MESSAGES, **api_sampling)
                assert out.usage.completion_tokens == args.max_tokens

            return call

        paths = {"direct": direct, "api": api}
        rates: dict[tuple[str, int], list[float]] = {}
        batches: dict[tuple[str, int], int] = {}
        lats: dict[tuple[str, int], list[float]] = {}
        for c in args.concurrency:  # warm-up (first generate calls, client connections)
            for fn in paths.values():
                run_clients(c, c, fn)
        model.extract_experience_from_history()
        try:
            for _ in range(args.repeats):
                for c in args.concurrency:
                    for name, fn in paths.items():
                        before = engine.batches_run
                        seconds, latencies = run_clients(c, args.requests, fn)
                        batches[(name, c)] = batches.get((name, c), 0) + engine.batches_run - before
                        rates.setdefault((name, c), []).append(args.requests / seconds)
                        lats.setdefault((name, c), []).extend(latencies)
            recorded = len(model.extract_experience_from_history())
        finally:
            model.close()

    print(
        f"tiny model hidden={args.hidden} layers={args.layers} on {args.device} "
        f"({torch.get_num_threads()} torch threads); {args.max_tokens} tokens per request, "
        f"{args.requests} requests per run, {args.repeats} repeats, engine max_batch_size {args.max_batch_size}"
    )
    print(f"{'path':>7} {'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'calls/batch':>11}")
    for c in args.concurrency:
        for name in paths:
            rate = statistics.median(rates[(name, c)])
            lat = lats[(name, c)]
            per_batch = args.requests * args.repeats / max(1, batches[(name, c)])
            print(
                f"{name:>7} {c:>7} {rate:8.1f} {percentile(lat, 0.5) * 1e3:8.1f} "
                f"{percentile(lat, 0.99) * 1e3:8.1f} {per_batch:11.1f}"
            )
        ratio = statistics.median(rates[("api", c)]) / statistics.median(rates[("direct", c)])
        print(f"{'':>7} {c:>7} api / direct requests/s: {ratio:.2f}")
    expected = args.requests * args.repeats * len(args.concurrency)
    print(f"API calls recorded in the history: {recorded} (expected {expected})")


if __name__ == "__main__":
    main()
