"""Every veRL name the back-end relies on, in one table that ``.ci/check_verl_api.py`` (run by
``nox -s verl_api``) checks against the installed veRL release.

veRL's internals move between minor releases (0.9 replaced ``fsdp_workers.py`` and
``dp_actor.py`` with the engine workers used here), so whoever changes :mod:`.trainer`,
:mod:`.workers`, :mod:`.platform`, :mod:`.loss` or :mod:`.dataproto` updates this table with it.
"""

from __future__ import annotations

# "module:attribute" → names that must be parameters (callables) or attributes (classes).
VERL_API: dict[str, tuple[str, ...]] = {
    "verl:DataProto": (
        "from_dict",
        "to_tensordict",
        "from_tensordict",
        "batch",
        "non_tensor_batch",
        "meta_info",
    ),
    "verl:DataProto.from_dict": ("tensors", "non_tensors", "meta_info"),
    "verl.single_controller.ray:RayResourcePool": ("process_on_nodes", "use_gpu", "name_prefix"),
    "verl.single_controller.ray:RayClassWithInitArgs": ("cls",),
    "verl.single_controller.ray:RayWorkerGroup": (
        "resource_pool",
        "ray_cls_with_init",
        "spawn",
        "world_size",
    ),
    "verl.single_controller.ray:RayWorkerGroup.spawn": ("prefix_set",),
    "verl.single_controller.ray.base:create_colocated_worker_cls": ("class_dict",),
    "verl.single_controller.base.decorator:register": ("dispatch_mode",),
    "verl.single_controller.base.decorator:Dispatch": ("ONE_TO_ALL",),
    "verl.workers.engine_workers:ActorRolloutRefWorker": (
        "init_model",
        "set_loss_fn",
        "compute_log_prob",
        "compute_ref_log_prob",
        "update_actor",
        "save_checkpoint",
        "load_checkpoint",
        "rank",
    ),
    "verl.workers.engine_workers:ActorRolloutRefWorker.__init__": ("config", "role"),
    "verl.workers.engine_workers:ActorRolloutRefWorker.save_checkpoint": (
        "local_path",
        "hdfs_path",
        "global_step",
        "max_ckpt_to_keep",
    ),
    "verl.workers.engine_workers:ActorRolloutRefWorker.load_checkpoint": (
        "local_path",
        "hdfs_path",
        "del_local_after_load",
    ),
    "verl.workers.engine_workers:TrainingWorker": (
        "reset",
        "set_loss_fn",
        "infer_batch",
        "train_mini_batch",
        "save_checkpoint",
        "load_checkpoint",
    ),
    "verl.workers.engine_workers:TrainingWorker.__init__": ("config",),
    "verl.workers.engine.fsdp.transformer_impl:FSDPEngine": ("get_per_tensor_param",),
    "verl.workers.config:TrainingWorkerConfig": (
        "model_type",
        "model_config",
        "engine_config",
        "optimizer_config",
        "checkpoint_config",
    ),
    "verl.workers.config:CriticConfig": (
        "engine",
        "model",
        "optim",
        "checkpoint",
        "ppo_max_token_len_per_gpu",
        "ppo_infer_max_token_len_per_gpu",
    ),
    "verl.workers.utils.padding:left_right_2_no_padding": ("data",),
    "verl.workers.utils.padding:no_padding_2_padding": ("tensor", "data"),
    # Our ActorLoss takes the place of this function, so it must be called the same way.
    "verl.workers.utils.losses:ppo_loss": ("config", "model_output", "data", "dp_group"),
    "verl.workers.utils.losses:value_loss": ("config", "model_output", "data", "dp_group"),
    "verl.utils.tensordict_utils:assign_non_tensor": ("tensor_dict",),
    "verl.utils.tensordict_utils:get": ("tensordict", "key", "default"),
    "verl.utils.tensordict_utils:get_non_tensor_data": ("data", "key", "default"),
    "verl.utils.config:omega_conf_to_dataclass": (),
    # Placement: our placement groups, handed to veRL's pool.
    "verl.single_controller.ray:RayResourcePool.__init__": ("max_colocate_count",),
    "verl.single_controller.ray.base:sort_placement_group_by_node_ip": ("pgs",),
    # The CPU platform (trinity.trainer.verl.platform) and what it prepares in a CPU worker.
    "verl.plugin.platform:PlatformBase": (
        "device_name",
        "device_module",
        "communication_backend_name",
        "ray_resource_name",
    ),
    "verl.plugin.platform:PlatformRegistry.register": ("platform",),
    "verl.utils.device:get_device_name": (),
    "verl.workers.engine.base:EngineRegistry": ("_engines", "register", "get_engine_cls"),
    "verl.workers.engine.base:EngineRegistry.register": ("model_type", "backend", "device"),
    "verl.workers.engine.fsdp.transformer_impl:CPUOffloadPolicy": ("pin_memory",),
    "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead": (),
    "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithValueHead": (),
    "verl.utils.model:load_valuehead_model": (
        "local_path",
        "torch_dtype",
        "model_config",
        "trust_remote_code",
    ),
}

# veRL behaviour the back-end relies on, as text that must still appear in veRL's source.
VERL_SOURCE: dict[str, tuple[str, ...]] = {
    # The pool uses placement groups already set (VerlTrainer places them with a timeout); CPU
    # workers get our platform through worker_env.
    "verl/single_controller/ray/base.py": ("if self.pgs is not None:", '"worker_env"'),
    # Platform selection: external modules imported by `import verl`, and the explicit override.
    "verl/__init__.py": ("VERL_USE_EXTERNAL_MODULES",),
    "verl/plugin/platform/platform_manager.py": ("VERL_PLATFORM",),
    # veRL initialises the process group only when none exists (CPU workers create it with gloo).
    "verl/utils/distributed.py": ("if not torch.distributed.is_initialized():",),
    # The reference model's pinned offload policy, built unpinned on CPU; the value model's
    # hard-coded flash attention, loaded with the config's attention on CPU.
    "verl/workers/engine/fsdp/transformer_impl.py": ("CPUOffloadPolicy(pin_memory=True)",),
    "verl/utils/model.py": ('attn_implementation="flash_attention_2"',),
}

# Non-tensor keys the driver sets on a batch, and where veRL reads each one.
VERL_META_KEYS: dict[str, str] = {
    "compute_loss": "verl/workers/engine_workers.py",
    "calculate_entropy": "verl/workers/engine/fsdp/transformer_impl.py",
    "global_batch_size": "verl/workers/utils/losses.py",
    "mini_batch_size": "verl/workers/engine_workers.py",
    "epochs": "verl/workers/engine_workers.py",
    "seed": "verl/workers/engine_workers.py",
    "dataloader_kwargs": "verl/workers/engine_workers.py",
    "temperature": "verl/workers/engine/fsdp/transformer_impl.py",
    "global_token_num": "verl/workers/engine_workers.py",
    # Set by veRL's engine, read by our loss:
    "batch_num_tokens": "verl/workers/engine/fsdp/transformer_impl.py",
    "dp_size": "verl/workers/engine/fsdp/transformer_impl.py",
}

# Batch keys veRL's own workers and value loss read from our DataProto.
VERL_BATCH_KEYS: dict[str, str] = {
    "input_ids": "verl/workers/utils/padding.py",
    "attention_mask": "verl/workers/utils/padding.py",
    "position_ids": "verl/workers/utils/padding.py",
    "response_mask": "verl/workers/utils/padding.py",
    "prompts": "verl/workers/utils/padding.py",
    "responses": "verl/workers/utils/padding.py",
    "values": "verl/workers/utils/losses.py",
    "returns": "verl/workers/utils/losses.py",
    "old_log_probs": "verl/workers/utils/losses.py",
    "advantages": "verl/workers/utils/losses.py",
    "ref_log_prob": "verl/workers/utils/losses.py",
    "rollout_log_probs": "verl/trainer/ppo/ray_trainer.py",
    "token_level_scores": "verl/trainer/ppo/ray_trainer.py",
    "token_level_rewards": "verl/trainer/ppo/ray_trainer.py",
    "uid": "verl/trainer/ppo/ray_trainer.py",
}

# Roles our driver creates ActorRolloutRefWorker with (it asserts a fixed list).
VERL_ROLES = ("actor", "ref")

__all__ = ["VERL_API", "VERL_BATCH_KEYS", "VERL_META_KEYS", "VERL_ROLES", "VERL_SOURCE"]
