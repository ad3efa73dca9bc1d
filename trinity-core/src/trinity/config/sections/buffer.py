"""The ``buffer`` section: tasksets the explorer reads and experience buffers the trainer reads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import field_validator

from trinity.config.sections.base import F, Section, check_choice, derived, lower_alias

StorageType = Literal["file", "queue", "sql"]
PromptType = Literal["messages", "plaintext"]
SchemaType = Literal["experience", "sft", "dpo", "cpt"]
# Names of `trinity.buffer.queue.PRIORITY_FNS` (kept here so loading a config imports no buffer code).
PRIORITY_FNS: tuple[str, ...] = ("linear_decay", "decay_limit_randomization")


class FormatConfig(Section):
    """Which dataset columns hold what."""

    prompt_type: PromptType = F(
        "messages", "`plaintext` (prompt/response columns) or `messages` (a chat list)."
    )
    prompt_key: str = F("prompt", "Column holding the user prompt (plaintext).")
    response_key: str = F("response", "Column holding the reference answer / response (plaintext).")
    system_prompt_key: str | None = F(None, "Column holding a per-row system prompt.")
    system_prompt: str | None = F(
        None, "System prompt for every row (lower priority than system_prompt_key)."
    )
    messages_key: str = F("message", "Column holding the message list (messages).")
    tools_key: str = F("tools", "Column holding tool definitions (a list of dicts).")
    image_key: str | None = F(
        None,
        "Column holding a row's images: one or a list, each a file path, base64 (or a data URI), bytes or a {bytes, path} mapping; read by simple_mm_workflow and by SFT rows (Qwen2-VL-class models).",
    )
    video_key: str | None = F(
        None,
        "Column holding a row's videos (simple_mm_workflow puts them in the prompt; the rollout engines refuse videos for now).",
    )
    reply_prefix: str | None = F(None, "Text prepended to the assistant reply.")
    workflow_key: str = F("", "Column naming a per-row workflow type.")
    reward_fn_key: str = F("", "Column naming a per-row reward function.")
    chosen_key: str = F("chosen", "Column holding the DPO chosen response.")
    rejected_key: str = F("rejected", "Column holding the DPO rejected response.")
    text_key: str = F("text", "Column holding raw text (continued pre-training, schema `cpt`).")
    enable_concatenated_multi_turn: bool = F(False, "Train on every assistant turn of multi-turn SFT data.")
    chat_template: str | None = F(None, "Chat template for this dataset; defaults to the model's.")
    enable_thinking: bool | None = F(None, "Turn thinking on or off in the chat template.")

    @field_validator("prompt_type", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return lower_alias(value)


class GenerationConfig(Section):
    """Sampling settings of a taskset; unset values come from the ``model`` section."""

    temperature: float | None = F(None, "Sampling temperature; defaults to `model.temperature`.", ge=0)
    top_p: float | None = F(None, "Nucleus-sampling probability; defaults to `model.top_p`.", gt=0, le=1)
    top_k: int | None = F(None, "Top-k (-1 disables); defaults to `model.top_k`.", ge=-1)
    logprobs: int | None = F(None, "Top logprobs per token; defaults to `model.logprobs`.", ge=0)
    max_tokens: int | None = F(None, "Longest response; defaults to `model.max_response_tokens`.", ge=1)
    n: int | None = derived(
        None,
        "Rollouts per task; set from `algorithm.repeat_times` (training) or the taskset's `repeat_times`.",
    )
    stop: list[str] | None = F(None, "Strings that end generation.")
    seed: int | None = F(None, "Sampling seed.")


class DataSelectorConfig(Section):
    """In which order tasks are read."""

    selector_type: str = F(
        "sequential",
        "A registered selector: built in, `sequential` (file order), `shuffle` (reshuffled each "
        "epoch) or `random` (with replacement); `offline_easy2hard` and `difficulty_based` come "
        "with trinity-plugins-algos. Eval tasksets are always read in file order.",
        min_length=1,
    )
    seed: int = F(42, "Seed of the selector's random draws.")
    feature_keys: list[str] = F([], "Columns the selector reads (e.g. difficulty features).")
    kwargs: dict[str, Any] = F({}, "Selector arguments (see the selector's documentation).")

    @field_validator("selector_type", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        # Selector names are lower case; a dotted class path keeps its case.
        return value.strip() if isinstance(value, str) and "." in value else lower_alias(value)


class ReplayBufferConfig(Section):
    """Experience reuse in a queue buffer (a priority queue)."""

    enable: bool = F(False, "Turn the queue into a priority queue that can replay experiences.")
    priority_fn: str = F(
        "linear_decay",
        "Priority function of queued experiences: `linear_decay` (model_version - decay * use_count, "
        "decay 2.0) or `decay_limit_randomization` (the same plus Gaussian noise `sigma`, each "
        "experience used at most `use_count_limit` (3) times).",
    )
    reuse_cooldown_time: float | None = F(
        None, "Seconds before an experience may be reused; unset: never reused.", ge=0
    )
    priority_fn_args: dict[str, Any] = F({"decay": 2.0}, "Arguments of the priority function.")

    @field_validator("priority_fn", mode="before")
    @classmethod
    def _priority_fn(cls, value: Any) -> Any:
        return check_choice(value, PRIORITY_FNS)


class _StorageBase(Section):
    """Keys shared by tasksets and experience buffers."""

    name: str = F("", "Unique name (also the Ray actor name); defaults from its position.")
    path: str | None = F(None, "File, folder, or SQLAlchemy URL of the data.")
    split: str = F("train", "Dataset split (file storage).")
    subset_name: str | None = F(None, "Dataset subset / configuration name (file storage).")
    format: FormatConfig = F(default_factory=FormatConfig, doc="Column mapping.")
    data_selector: DataSelectorConfig = F(default_factory=DataSelectorConfig, doc="Read order.")
    max_retry_times: int = F(
        3,
        "Retries of an SQL write or read that fails with a transient database error (`sql` "
        "experience buffers); no effect on tasksets.",
        ge=0,
    )
    max_retry_interval: int = F(1, "Seconds between those SQL retries; no effect on tasksets.", ge=0)
    enable_progress_bar: bool | None = F(
        None,
        "Console monitor progress bar: `false` prints one plain line per step, `true` always draws "
        "the bar, unset draws it on a terminal. Read from the training tasksets (explorer) and the "
        "experience buffer (trainer); no effect elsewhere.",
    )
    index: int = derived(0, "Read position; restored from checkpoints.", ge=0)
    batch_size: int = derived(
        0, "Rows per read; set from `buffer.batch_size` / `buffer.train_batch_size`.", ge=0
    )
    total_epochs: int = derived(1, "Set from `buffer.total_epochs`.", ge=1)
    total_steps: int | None = derived(None, "Set from `buffer.total_steps`.", ge=1)
    ray_namespace: str | None = derived(None, "Ray namespace of the storage actor; set from the global one.")

    @field_validator("storage_type", mode="before", check_fields=False)
    @classmethod
    def _lower_storage(cls, value: Any) -> Any:
        return lower_alias(value)


class TasksetConfig(_StorageBase):
    """A dataset of tasks for the explorer (training or evaluation)."""

    storage_type: StorageType = F("file", "`file` (jsonl/json/parquet file or folder), `queue` or `sql`.")
    repeat_times: int | None = F(
        None,
        "Rollouts per task; training tasksets use `algorithm.repeat_times`, eval tasksets default to 1.",
        ge=1,
    )
    default_workflow_type: str | None = F(
        None, "Workflow for this taskset; defaults to the buffer-level one."
    )
    default_reward_fn_type: str | None = F(None, "Reward function; defaults to the buffer-level one.")
    rollout_args: GenerationConfig = F(default_factory=GenerationConfig, doc="Sampling settings.")
    workflow_args: dict[str, Any] = F({}, "Extra arguments given to every task's workflow.")
    reward_fn_args: dict[str, Any] = F({}, "Extra arguments given to the reward function.")
    task_selector: DataSelectorConfig | None = F(None, "Deprecated alias of `data_selector`.")
    is_eval: bool = derived(False, "Set automatically: whether this is an eval taskset.")


class ExperienceBufferConfig(_StorageBase):
    """Where experiences go (explorer output) and come from (trainer input)."""

    storage_type: StorageType = F(
        "queue",
        "`queue` (in memory; `path` is its SQL backup, by default `<job_dir>/buffer/<name>.db` in "
        "`both`/`colocate` jobs on a Ray of their own), `sql` or `file` (jsonl).",
    )
    capacity: int = F(10000, "Most experiences a queue holds.", ge=1)
    max_read_timeout: float = F(
        1800, "Seconds a read waits for a full batch before returning what it has.", ge=0
    )
    replay_buffer: ReplayBufferConfig | None = F(
        default_factory=ReplayBufferConfig, doc="Priority queue / replay settings (queue storage)."
    )
    use_priority_queue: bool | None = F(None, "Deprecated alias of `replay_buffer.enable`.")
    reuse_cooldown_time: float | None = F(
        None, "Deprecated alias of `replay_buffer.reuse_cooldown_time`.", ge=0
    )
    schema_type: SchemaType | None = derived(
        None, "Experience schema (`experience`, `sft`, `dpo`, `cpt`); from the algorithm."
    )
    tokenizer_path: str | None = derived(
        None, "Tokenizer for file/SQL datasets; set from `model.model_path`."
    )

    @field_validator("schema_type", mode="before")
    @classmethod
    def _lower_schema(cls, value: Any) -> Any:
        return lower_alias(value)


class ExplorerInput(Section):
    """Tasksets the explorer trains and evaluates on."""

    tasksets: list[TasksetConfig] = F([], "Training tasksets.")
    eval_tasksets: list[TasksetConfig] = F([], "Evaluation tasksets.")
    taskset: TasksetConfig | None = F(None, "A single training taskset (alias of a one-element `tasksets`).")
    default_workflow_type: str | None = F(None, "Workflow of tasksets that name none.")
    default_eval_workflow_type: str | None = F(None, "Workflow of eval tasksets that name none.")
    default_reward_fn_type: str | None = F(None, "Reward function of tasksets that name none.")


class TrainerInput(Section):
    """Experience buffers the trainer reads."""

    experience_buffer: ExperienceBufferConfig | None = F(
        None, "The main buffer (the explorer's output); created as a queue when unset."
    )
    auxiliary_buffers: dict[str, ExperienceBufferConfig] = F(
        {}, "Extra buffers by name (e.g. SFT data to mix in)."
    )


class BufferConfig(Section):
    """Batch sizes, epochs and the explorer / trainer data."""

    batch_size: int = F(1, "Tasks per explore step (do not multiply by repeat_times).", ge=1)
    train_batch_size: int | None = F(
        None,
        "Experiences per training step; unset or 0: batch_size * algorithm.repeat_times.",
        ge=0,
    )
    total_epochs: int = F(1, "Passes over the training tasksets.", ge=1)
    total_steps: int | None = F(None, "Total steps; when set, `total_epochs` is ignored.", ge=1)
    explorer_input: ExplorerInput = F(default_factory=ExplorerInput, doc="Explorer tasksets.")
    trainer_input: TrainerInput = F(default_factory=TrainerInput, doc="Trainer buffers.")
    default_workflow_type: str | None = F(None, "Workflow of tasksets that name none (lowest priority).")
    default_reward_fn_type: str | None = F(
        None, "Reward function of tasksets that name none (lowest priority)."
    )
    tokenizer_path: str | None = derived(None, "Set from `model.model_path`.")
    cache_dir: str | None = derived(None, "Buffer cache folder; set to `<job_dir>/buffer`.")
