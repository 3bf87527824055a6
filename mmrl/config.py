"""Typed run configuration: nested dataclasses, YAML deltas, `key=value` overrides.

`load("recipe.yaml", ["train.lr=1e-4"])` merges defaults <- YAML <- overrides with OmegaConf in
struct mode, so an unknown key or a wrong type fails at load time with the key's full path.
Algorithm presets (`algo.preset: dapo`) fill in the family's defaults *under* whatever the YAML
sets explicitly, so a recipe can say "DAPO, but with clip_high 0.3".
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, get_args

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mmrl import config_rules
from mmrl.config_algo import (  # noqa: F401  (config.AlgoConfig, config.Agg, ... are the API)
    KL, PRESETS, Agg, AlgoConfig, HistoryMode, ISLevel, ISMode, LossType, Preset, Ratio,
    ScaleRewards)
from mmrl.config_eval import BenchmarkSpec, EvalConfig  # noqa: F401  (config.BenchmarkSpec: the API)
from mmrl.config_env import EnvConfig, ToolsConfig, ToolSpec  # noqa: F401  (config.ToolsConfig: the API)
from mmrl.config_options import (  # noqa: F401  (config.Backend, ... are the API)
    AttnImplementation, AudioTruncate, Backend, CallFormat, CompileDecode, DType, LRSchedule,
    MemoryCheck, OnBadSample, Parallel, Progress, WeightTransfer)


@dataclass
class DataConfig:
    train: str = MISSING  # JSONL / JSON / Parquet / HF dataset dir
    eval: Optional[str] = None  # held-out set for before/after and in-loop evaluation
    # record adapter: mmrl | vlm_r1 | r1v | easyr1 | video_r1 | r1_aqa | time_r1 | asr; null:
    # detected from the column names (Parquet / Arrow) or first record's keys (mmrl/data/detect.py)
    format: Optional[str] = None
    generate: Optional[str] = None  # synthetic generator that writes `train`/`eval` if missing
    generate_kwargs: dict[str, Any] = field(default_factory=dict)  # the generator's arguments
    max_samples: Optional[int] = None  # use only the first N training records
    shuffle: bool = True  # draw prompts in a seeded shuffled order (resumable)
    on_bad_sample: OnBadSample = "error"  # error: stop naming record and file | skip: count
    # skip: stop when more than this share of the records drawn in an epoch failed to load
    max_bad_fraction: float = 0.5
    # per-image pixel budget: set, images are resized by qwen-vl-utils' fetch_image (min_pixels /
    # max_pixels) before the processor; the box rewards' resized_size is that frame
    image_min_pixels: Optional[int] = None
    image_max_pixels: Optional[int] = None  # see image_min_pixels
    video_fps: Optional[float] = 2.0  # frames sampled per second (or set video_nframes)
    video_nframes: Optional[int] = None  # fixed frame count instead of fps (never both)
    video_max_frames: int = 64  # at most this many frames a clip
    video_max_pixels: Optional[int] = None  # T*H*W bound = 2x qwen-vl-utils' total_pixels
    audio_max_seconds: Optional[float] = None  # longer audio: see audio_truncate
    audio_truncate: AudioTruncate = "error"  # longer audio: error (name the file) | head
    media_cache: Optional[str] = None  # dir for decoded video/audio; later epochs decode nothing
    # processed prompts (and sft.turn_targets demonstrations) kept in memory (LRU), 0 = none
    feature_cache: int = 512
    # Anchor prompt template (vlm_r1, r1v, video_r1, r1_aqa, time_r1, think, answer; *_nothink)
    # or a custom string with {question}; applied at load time, so rollout, SFT and eval agree.
    prompt_template: Optional[str] = None
    # Hybrid think / no-think (TON, TempSamp-R1 hybrid CoT): this share of training samples (chosen
    # by id, stable across epochs) gets nothink_instruction, the rest think_instruction (0 = off).
    think_hybrid: float = 0.0
    think_instruction: str = (  # appended to prompts asked to think
                              "Think step by step inside <think> </think> tags, then give the "
                              "final answer inside <answer> </answer> tags.")
    nothink_instruction: str = (  # appended to prompts asked not to
                                "Do not think: give only the final answer inside <answer> "
                                "</answer> tags.")

    @property
    def skips_bad_samples(self) -> bool:
        """on_bad_sample=skip: a sample whose media fails is skipped and counted (else: raise)."""
        return self.on_bad_sample == "skip"


@dataclass
class LoraSpec:
    r: int = 0  # 0 = full fine-tuning; > 0 trains LoRA adapters (peft) on the language model
    alpha: int = 32  # LoRA scaling: alpha / r
    dropout: float = 0.0  # LoRA dropout
    target_modules: list[str] = field(default_factory=lambda: [  # linear layers that get adapters
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    include_encoders: bool = False  # also adapt vision/audio towers (excluded by default)


@dataclass
class ModelConfig:
    family: str = "qwen2_5_vl"  # registered adapter: `mmrl ls models`
    # "tiny" (the adapter's offline tiny twin), a checkpoint dir, a Hub id, or "shape:NAME[:LAYERS]"
    # (random weights at a published checkpoint's shape): mmrl/models/source.py
    path: str = "tiny"
    tiny: dict[str, Any] = field(default_factory=dict)  # overrides for adapter.tiny()
    dtype: DType = "float32"  # weights and compute (bfloat16 on GPU)
    attn_implementation: AttnImplementation = "sdpa"  # docs/models.md: which to use where
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory
    freeze: list[str] = field(default_factory=list)  # parameter-name prefixes or: vision, audio
    lora: LoraSpec = field(default_factory=LoraSpec)

    @property
    def dense_mask(self) -> bool:
        """Whether attention takes a boolean [rows, 1, L, L] mask (sdpa, eager), which the
        memory plan counts; the varlen kernels take sequence lengths."""
        return self.attn_implementation in ("sdpa", "eager")


@dataclass
class VLLMConfig:
    server_url: Optional[str] = None  # generate through a running `vllm serve` (scripts/vllm_server.sh)
    gpu_memory_utilization: float = 0.3  # share of GPU memory vLLM may take (colocated)
    tensor_parallel_size: int = 1  # GPUs per vLLM engine
    enable_sleep_mode: bool = False  # GPU only: free the KV cache during the update
    max_model_len: Optional[int] = None  # vLLM context length (None: the model's)
    enforce_eager: bool = True  # no CUDA graphs: slower decoding, faster start, less memory
    seed: int = 0  # vLLM sampling seed
    # How new weights reach vLLM after each step. Colocated: auto | bytes | direct. Server mode:
    # auto (= http: base64 safetensors through /collective_rpc) | nccl (GPU: broadcast from the
    # trainer to every server worker) | store (the same protocol over a TCP store, for CPU tests).
    weight_transfer: WeightTransfer = "auto"
    weight_transfer_port: int = 51216  # server mode nccl/store: rendezvous port on the server host
    llm_kwargs: dict[str, Any] = field(default_factory=dict)  # passed on to vllm.LLM(...)


@dataclass
class RolloutConfig:
    backend: Backend = "hf"  # hf: transformers generate | vllm: colocated engine or server
    prompts_per_step: int = 8  # B: prompts sampled per optimizer step
    num_generations: int = 8  # G: completions per prompt (one group)
    max_new_tokens: int = 64  # a completion cut here has no closing tag and seldom scores
    temperature: float = 1.0  # sampling temperature (> 0)
    top_p: float = 1.0  # nucleus sampling (1 = off)
    top_k: int = 0  # 0 = off
    shared_prefill: bool = False  # hf backend: prefill each prompt once for its G samples
    rounds_of: Optional[int] = None  # with shared_prefill: sample G in rounds of this many
    compile_decode: CompileDecode = "auto"  # hf backend: static cache + torch.compile'd step
    # Asynchronous rollouts (docs/async.md): 0 = sample, then train (synchronous). k >= 1: the
    # HF engine runs ahead in its own process on its own copy of the weights; no sample drawn
    # more than k weight versions ago is trained on (the loss is AReaL's decoupled one).
    max_staleness: int = 0
    vllm: VLLMConfig = field(default_factory=VLLMConfig)

    @property
    def runs_hf_generate(self) -> bool:
        """The training model's own generate samples (shared_prefill, rounds_of and compile_decode
        apply)."""
        return self.backend == "hf"

    @property
    def vllm_colocated(self) -> bool:
        """A vLLM engine on the training GPUs, holding vllm.gpu_memory_utilization of each."""
        return self.backend == "vllm" and not self.vllm.server_url


@dataclass
class RewardSpec:
    name: str = MISSING  # a reward in `mmrl ls rewards`, or "pkg.mod:fn"
    weight: float = 1.0  # the total reward is the weighted sum; 0 = logged, not trained on
    params: dict[str, Any] = field(default_factory=dict)  # bound as keyword arguments
    tasks: Optional[list[str]] = None  # score only samples of these tasks (None: all)


@dataclass
class SFTConfig:
    """Optional supervised warm-up on the answers before RL (teaches format on a fresh model)."""

    steps: int = 0  # 0 = off (maximum steps when stop_accuracy is set)
    target: str = "<answer>{solution}</answer>"  # completion to imitate, formatted per sample
    # With data.think_hybrid: the completion for samples asked to think, e.g. "<think>I count
    # them.</think><answer>{solution}</answer>" (None: `target` for every sample).
    think_target: Optional[str] = None
    # With tools.use: a demonstration trajectory instead of one turn, one target per model turn
    # (e.g. a crop call on the record's box, then "<answer>{solution}</answer>"); the real tools
    # answer the calls in between, and the loss covers the model's turns only (Mini-o3's and
    # DeepEyes' multi-turn cold start). A row ends at its first answering target, and may run
    # past tools.max_turns (a look again after a miss). Empty: `target`, one turn.
    turn_targets: list[str] = field(default_factory=list)
    val_samples: int = 64  # held out of the SFT draws to decide when to stop
    lr: float = 1e-3  # a tiny model's warm-up; a real checkpoint seldom needs a warm-up at all
    batch_size: int = 32  # samples a warm-up step
    eval_every: int = 10  # steps between held-out checks
    stop_accuracy: Optional[float] = None  # stop once held-out greedy accuracy reaches this
    # ... on this many checks in a row: 64 val samples read about +-0.06 at 0.7, and one lucky
    # reading stopped the classification row's seed 2 early (0.63, then 0.71; docs/learning.md)
    stop_checks: int = 1
    # What stop_accuracy is read on: a key of the held-out evaluation's result -- "accuracy", or
    # a reward's "<key>_mean" (a reward in `rewards`; weight 0 logs it without training on it),
    # e.g. looked_at_mean: stop once the warm-up's crops find the target, not once it reads it.
    stop_metric: str = "accuracy"


@dataclass
class TrainConfig:
    steps: int = 100  # RL steps (one optimizer update each, or num_iterations)
    lr: float = 1e-6  # AdamW learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])  # AdamW betas
    lr_schedule: LRSchedule = "constant"  # all after warmup
    warmup_steps: int = 0  # linear lr warm-up from 0
    max_grad_norm: float = 1.0  # 0 = no clipping
    micro_batch_size: int = 8  # rows per forward/backward; result independent of it
    # Set: micro-batches are packed by tokens (each group's prompt once + its completions) up to
    # this many per process, micro_batch_size is ignored; the result is the same either way
    # ([scale-out](scale-out.md#token-budget-micro-batches-trainmax_tokens_per_micro_batch)).
    max_tokens_per_micro_batch: Optional[int] = None
    shared_prefix: bool = True  # each group's prompt (media encoder included) computed once
    # Ulysses: each forward's sequence is split over this many processes (attention all-to-all
    # over heads); must divide the process count and the model's attention heads.
    sequence_parallel: int = 1
    # A frozen vision/audio encoder (model.freeze, or LoRA off the towers) runs once per prompt
    # per step; its outputs are kept for the step's later forwards (old, reference, updates).
    # Not with `tools.use` (observation media come inside completions), nor Qwen3-VL's tower
    # (DeepStack). The start of the run says which: `encoders: cached once per step (frozen)`
    # or `encoders: run in every forward`.
    cache_frozen_encoders: bool = True
    seed: int = 0  # model init (tiny), data order, sampling: a run is reproducible
    save_every: int = 0  # 0 = only at the end
    keep_checkpoints: int = 2  # 0 = keep all
    resume: str = "none"  # none | auto | path to a checkpoint dir
    overwrite: bool = False  # a fresh run may replace what a non-empty log.run_dir holds
    run_id: Optional[str] = None  # set at a run's start; resume=auto accepts only its checkpoints
    # A resume may change lr, steps, eval, log, ... (applied); other keys (model, data, G, seed,
    # algo) are refused unless this is true (docs/runs.md).
    allow_config_change: bool = False
    # After SIGTERM / SIGHUP / Ctrl-C, the seconds a step's rollout may take to finish before
    # the step is abandoned (rewound) and the run saves; SLURM: --signal=TERM@120 (docs/runs.md)
    stop_timeout: float = 30.0
    max_nonfinite_steps: int = 3  # consecutive steps skipped for NaN/inf loss or grad norm -> stop
    eval_every: int = 0  # in-loop held-out evaluation (0 = off)
    # How weights, gradients and optimizer state are spread over processes: auto (from the
    # launcher: accelerate's DeepSpeed / FSDP config, else ddp) | ddp | deepspeed | fsdp2.
    parallel: Parallel = "auto"
    deepspeed_config: Optional[str] = None  # DeepSpeed JSON (default: the accelerate config's)
    # On CUDA, `mmrl train` predicts the run's peak memory per GPU before loading the model
    # (docs/memory.md): refuse | warn | off. A no-op on CPU.
    memory_check: MemoryCheck = "refuse"

    @property
    def starts_fresh(self) -> bool:
        """resume=none: a new run (a run dir holding one needs overwrite=true)."""
        return self.resume == "none"

    @property
    def checks_memory(self) -> bool:
        """memory_check is warn or refuse: run the plan before loading the model."""
        return self.memory_check != "off"

    @property
    def refuses_unfit(self) -> bool:
        """memory_check=refuse: a predicted peak over the device's usable memory stops the run."""
        return self.memory_check == "refuse"

    @property
    def resumes_latest(self) -> bool:
        """resume=auto: continue from the newest checkpoint in the run dir, if any."""
        return self.resume == "auto"


@dataclass
class LogConfig:
    run_dir: Optional[str] = None  # default: runs/<name>
    tensorboard: bool = True  # RUN_DIR/tensorboard/
    wandb: bool = False  # also log to wandb (offline unless WANDB_MODE says otherwise)
    rollouts_every: int = 10  # write a sample of rollouts every N steps
    rollouts_per_step: int = 8  # rollouts written each such step
    progress: Progress = "auto"  # auto: rich bar on a TTY, lines otherwise
    think_share: bool = False  # log think/{think,empty,none}: share of completions by reasoning kind (TON)
    log_every: int = 10  # lines mode: print a line every N steps


@dataclass
class RunConfig:
    name: str = "run"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    rewards: list[RewardSpec] = field(default_factory=list)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.log.run_dir or f"runs/{self.name}")

    @property
    def env_name(self) -> str:
        """The environment the run's trajectories talk to: "tools", "single_turn", or env.name."""
        return self.env.resolved(self.tools.enabled)

    @property
    def multi_turn(self) -> bool:
        """Whether rows are trajectories (observations inside completions): every environment
        but single_turn."""
        return self.env_name != "single_turn"


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


class ConfigError(ValueError):
    pass


def _apply_preset(merged: DictConfig, explicit_keys: set[str]) -> None:
    preset = merged.algo.preset
    if preset is None:  # else one of PRESETS: the Preset type admits nothing else
        return
    for key, value in PRESETS[preset].items():
        if key not in explicit_keys:
            merged.algo[key] = value


# YAML 1.1 reads a bare `off` as false; these options have "off" among their legal values.
_OFF_KEYS = ("log.progress", "train.memory_check")


def _load_layer(path) -> DictConfig:
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                          f"{column}); save the file as UTF-8") from None
    try:
        layer = OmegaConf.create(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {clip(' '.join(str(e).split()))}") from None
    if not isinstance(layer, DictConfig):
        raise ConfigError(f"{path}: expected a mapping of sections (data:, model:, ...), got a list")
    for key in _OFF_KEYS:
        if OmegaConf.select(layer, key) is False:
            OmegaConf.update(layer, key, "off")
    return layer


def _override(merged: DictConfig, item: str) -> str:
    """Apply one `a.b.c=value` (value parsed as YAML) with the schema's checks; returns the key."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {clip(item)}: expected key=value (or a YAML file to "
                          f"layer)")
    value = yaml.safe_load(raw) if raw else ""
    if key in _OFF_KEYS and value is False:
        value = "off"
    if isinstance(value, str) and _NUMBER.fullmatch(value):  # YAML 1.1 reads "1e-4" as a string
        value = float(value)
    parent_key, _, leaf = key.rpartition(".")
    if isinstance(value, (dict, list)) and not any(part.isdigit() for part in key.split(".")):
        # Containers go through a merge so the schema converts them (e.g. dicts -> RewardSpec);
        # a list replaces the old list whole.
        nested: Any = value
        for part in reversed(key.split(".")):
            nested = {part: nested}
        merged.merge_with(OmegaConf.create(nested))
        return key
    parent = OmegaConf.select(merged, parent_key) if parent_key else merged
    if parent is None:
        raise ConfigError(f"override {clip(item)}: no config section {parent_key!r}")
    # update (not setattr) converts an int given for a float key without OmegaConf's
    # FutureWarning; struct mode still refuses an unknown key or a wrong type, naming the key.
    OmegaConf.update(merged, key, value, merge=False)
    return key


def load(path: str | Path | None, overrides: list[str] | None = None,
         world: int | None = None) -> RunConfig:
    """Defaults <- YAML <- overrides; returns a typed RunConfig (dataclass instance).

    An override that is a path to another YAML file is merged as a further delta layer (e.g. a
    recipe's `tiny.yaml`, which shrinks it to an offline CPU run). An error names what caused it:
    the YAML layer, or the override as typed (`override train.lr=abc: ...`). `world`: the
    process count the cross-field rules check against (default: the launcher's WORLD_SIZE)."""
    where = f"{path}: " if path else ""
    set_by: dict[str, str] = {}  # key -> what set it last: an overlay file or "override k=v"
    merged = OmegaConf.structured(RunConfig)
    explicit: set[str] = set()
    items = [(str(path), True)] if path else []
    for item, is_layer in items + [(o, _is_layer(o)) for o in overrides or []]:
        culprit = f"{item}: " if is_layer else f"override {clip(item)}: "
        try:
            if is_layer:
                layer = _load_layer(item)
                explicit |= set((layer.get("algo") or {}).keys())
                merged = OmegaConf.merge(merged, layer)
                set_by.update(dict.fromkeys(_leaf_keys(layer), item))
                continue
            key = _override(merged, item)
        except OmegaConfBaseException as e:  # unknown key / wrong type: the message has its path
            raise ConfigError(f"{culprit}{_short(e)}") from None
        set_by[key] = f"override {clip(item)}"
        if key.startswith("algo."):
            explicit.add(key.split(".")[1])
    try:
        _apply_preset(merged, explicit)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ConfigError(f"{where}required key(s) not set: {', '.join(missing)}")
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{where}{_short(e)}") from None
    if path and cfg.log.run_dir is None and cfg.name == "run":
        cfg.name = Path(path).stem if Path(path).stem != "config" else Path(path).parent.name
    # Under torchrun / accelerate the process count is known already at load.
    world = int(os.environ.get("WORLD_SIZE", "1")) if world is None else world
    check(cfg, world=world, where=where, set_by=set_by)
    return cfg


def _leaf_keys(layer: DictConfig) -> list[str]:
    """The dotted keys a YAML layer sets (a list or an empty mapping counts as one value)."""
    out, todo = [], [("", OmegaConf.to_container(layer, resolve=False))]
    while todo:
        prefix, node = todo.pop()
        for k, v in node.items():
            if isinstance(v, dict) and v:
                todo.append((f"{prefix}{k}.", v))
            else:
                out.append(f"{prefix}{k}")
    return out


def _is_layer(item: str) -> bool:
    return item.endswith((".yaml", ".yml")) and "=" not in item


def check(cfg: RunConfig, world: int = 1, where: str = "",
          set_by: dict[str, str] | None = None) -> None:
    """Raise ConfigError with one line naming the first key out of its legal range (ranges and
    cross-field rules: mmrl/config_rules.py; legal values are the Literal types of
    config_options.py and config_algo.py), and
    what set it (`set_by`: key -> the YAML file or "override k=v" that set it last) where known,
    else `where` (the base recipe)."""
    found = config_rules.problems(cfg, world)
    if found:
        more = f" (and {len(found) - 1} more: mmrl validate lists them)" if len(found) > 1 else ""
        named = list(dict.fromkeys(label for key, label in (set_by or {}).items()
                                   if re.search(rf"(^|\s){re.escape(key)}=", found[0])))
        overrides = [n.removeprefix("override ") for n in named if n.startswith("override ")]
        named = [n for n in named if not n.startswith("override ")] + \
            ([f"override {', '.join(overrides)}"] if overrides else [])
        raise ConfigError(f"{clip(', '.join(named)) + ': ' if named else where}"
                          f"{clip(found[0], 1000)}{more}")


def choices(literal) -> tuple[str, ...]:
    """The legal values of an option type, e.g. `choices(Agg)`."""
    return get_args(literal)


def _short(e: Exception) -> str:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.strip().startswith(("object_type", "reference_type"))]
    return " | ".join(clip(ln) for ln in keep)


def clip(text: str, limit: int = 300) -> str:
    """`text` cut to `limit` characters, saying how long it was: an error echoes a value, and a
    10 MB value must not become 10 MB on the terminal."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def to_yaml(cfg: RunConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def save(cfg: RunConfig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_yaml(cfg))
