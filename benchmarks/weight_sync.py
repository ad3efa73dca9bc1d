"""``sync_method: memory``: the trainer's weights as numpy arrays against torch tensors, same run.

    python benchmarks/weight_sync.py [--hidden 128] [--layers 2] [--syncs 50]

Two Ray actors stand in for the trainer and the explorer, the way the launcher's memory
transport calls them: the explorer's ``update_weights`` gets the trainer's ``get_weights``
reference and loads the state dict into its model. The state dict is a locally created Qwen2
model's (the quickstart's size by default: hidden 128, 2 layers). One side sends torch tensors
(what the actors sent before: Ray pickles each through ``torch.save``), the other
:func:`trinity.sync.memory.to_wire`'s numpy arrays (Ray's out-of-band buffers, received as
zero-copy views). Rounds alternate, so both see the same machine load; prints the median sync
time of each and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import ray
import torch

from trinity.sync.memory import from_wire, pack_weights, to_wire
from trinity.testing.tiny_model import create_tiny_model


@ray.remote(num_cpus=0)
class Trainer:
    def __init__(self, path: str) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path)

    def get_weights(self, wire: bool) -> tuple[dict, int]:
        packed = pack_weights(self.model)
        return (to_wire(packed) if wire else packed), 1


@ray.remote(num_cpus=0)
class Explorer:
    def __init__(self, path: str) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path)
        self.params = dict(self.model.named_parameters())

    @torch.no_grad()
    def update_weights(self, boxed: list, wire: bool) -> int:
        state, version = ray.get(boxed[0])
        tensors = from_wire(state) if wire else state
        for name, target in self.params.items():
            target.copy_(tensors[name])
        return version


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--syncs", type=int, default=50)
    args = parser.parse_args()
    ray.init(num_cpus=max(os.cpu_count() or 1, 2), include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = str(create_tiny_model(f"{tmp}/model", hidden_size=args.hidden, num_layers=args.layers))
            trainer, explorer = Trainer.remote(path), Explorer.remote(path)
            wire, _ = ray.get(trainer.get_weights.remote(True))
            size = sum(array.nbytes for array in {id(a): a for a, _ in wire.values()}.values())
            times: dict[bool, list[float]] = {False: [], True: []}
            for i in range(args.syncs + 3):
                for wire in (False, True):
                    start = time.perf_counter()
                    ray.get(explorer.update_weights.remote([trainer.get_weights.remote(wire)], wire))
                    if i >= 3:  # warm-up rounds
                        times[wire].append(time.perf_counter() - start)
    finally:
        ray.shutdown()
    tensors, arrays = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"state dict {size / 2**20:.1f} MiB (hidden {args.hidden}, {args.layers} layers), {args.syncs} syncs each"
    )
    print(f"torch tensors (pickled)        median {tensors * 1000:7.2f} ms/sync")
    print(f"numpy arrays (trinity to_wire) median {arrays * 1000:7.2f} ms/sync")
    print(f"ratio tensors/arrays: {tensors / arrays:.2f}x")


if __name__ == "__main__":
    main()
