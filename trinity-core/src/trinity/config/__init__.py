"""Trinity configuration: pydantic models, YAML loading (OmegaConf) and derived values.

Field names and defaults follow Trinity-RFT, so its YAML files load unchanged. Importing this
package never imports torch, ray or transformers.

    from trinity.config import load_config
    config = load_config("grpo.yaml")          # validated and resolved, or ConfigError
    print(config.to_yaml())
    stages = stage_configs(config)             # one resolved config per stage

Imports go one way: ``yaml_io`` (YAML + interpolations) <- ``loader`` -> ``validation`` ->
``models`` -> ``sections``; ``loader`` -> ``resolve`` (the one place that derives values, also
for renamed runs and later stages) -> ``validation``, ``algorithm_defaults``, ``yaml_io``.
"""

from trinity.config.errors import ConfigError
from trinity.config.loader import load_config
from trinity.config.models import Config, StageConfig
from trinity.config.resolve import resolve_config, stage_configs
from trinity.config.sections.algorithm import AlgorithmConfig, OptimizerConfig
from trinity.config.sections.buffer import (
    BufferConfig,
    DataSelectorConfig,
    ExperienceBufferConfig,
    ExplorerInput,
    FormatConfig,
    GenerationConfig,
    ReplayBufferConfig,
    TasksetConfig,
    TrainerInput,
)
from trinity.config.sections.data import DataProcessorConfig, ServiceConfig
from trinity.config.sections.explorer import ExplorerConfig, InferenceModelConfig
from trinity.config.sections.model import LoRAConfig, ModelConfig
from trinity.config.sections.runtime import ClusterConfig, LogConfig, MonitorConfig, SynchronizerConfig
from trinity.config.sections.trainer import TrainerConfig

__all__ = [
    "AlgorithmConfig",
    "BufferConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "DataProcessorConfig",
    "DataSelectorConfig",
    "ExperienceBufferConfig",
    "ExplorerConfig",
    "ExplorerInput",
    "FormatConfig",
    "GenerationConfig",
    "InferenceModelConfig",
    "LoRAConfig",
    "LogConfig",
    "ModelConfig",
    "MonitorConfig",
    "OptimizerConfig",
    "ReplayBufferConfig",
    "ServiceConfig",
    "StageConfig",
    "SynchronizerConfig",
    "TasksetConfig",
    "TrainerConfig",
    "TrainerInput",
    "load_config",
    "resolve_config",
    "stage_configs",
]
