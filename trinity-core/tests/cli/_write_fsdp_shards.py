"""Write a real veRL-style FSDP checkpoint of a tiny model on CPU (gloo, 2 processes).

Usage: ``python _write_fsdp_shards.py MODEL_DIR OUT_DIR PORT``. Writes, like veRL's
``FSDPCheckpointManager``, ``OUT_DIR/<kind>/global_step_1/actor/`` with
``model_world_size_2_rank_{0,1}.pt`` (each rank's SHARDED state dict), ``fsdp_config.json`` and
``huggingface/`` (config and tokenizer, no weights), for ``kind`` = ``fsdp1``
(``FullyShardedDataParallel`` on a device mesh, ``StateDictType.SHARDED_STATE_DICT``) and
``fsdp2`` (``fully_shard``). Run as a script: spawned children must be able to import it.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2


def _save(model, state_dict, actor_dir, rank, fsdp_version, model_dir):
    from transformers import AutoTokenizer

    os.makedirs(actor_dir, exist_ok=True)
    torch.save(state_dict, os.path.join(actor_dir, f"model_world_size_{WORLD_SIZE}_rank_{rank}.pt"))
    if rank == 0:
        hf_dir = os.path.join(actor_dir, "huggingface")
        model.config.save_pretrained(hf_dir)
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(hf_dir)
        with open(os.path.join(actor_dir, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": fsdp_version, "world_size": WORLD_SIZE}, f)


def _worker(rank: int, model_dir: str, out_dir: str, port: int) -> None:
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardedStateDictConfig, StateDictType, fully_shard
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers import AutoModelForCausalLM

    mesh = init_device_mesh("cpu", (WORLD_SIZE,), mesh_dim_names=("fsdp",))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    layer_cls = type(model.model.layers[0])

    # FSDP1 as veRL wraps it: decoder layers as units, a device mesh (so DTensor shards).
    fsdp1 = FSDP(
        model,
        device_mesh=mesh,
        auto_wrap_policy=ModuleWrapPolicy({layer_cls}),
        use_orig_params=True,
        device_id=torch.device("cpu"),
    )
    with FSDP.state_dict_type(fsdp1, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig()):
        state_dict = fsdp1.state_dict()
    _save(model, state_dict, os.path.join(out_dir, "fsdp1", "global_step_1", "actor"), rank, 1, model_dir)

    # FSDP2: fully_shard per layer and the root; its state dict holds DTensors.
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _save(
        model,
        model.state_dict(),
        os.path.join(out_dir, "fsdp2", "global_step_1", "actor"),
        rank,
        2,
        model_dir,
    )

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    model_dir, out_dir, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    mp.spawn(_worker, args=(model_dir, out_dir, port), nprocs=WORLD_SIZE)
