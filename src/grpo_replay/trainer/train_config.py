"""`TrainConfig`: the single source of truth for a training run (built-in trainer and `--backend trl`).

Precedence: field defaults < YAML file (`--config`) < command line (flags and `--set`); a preset (`--preset`,
`--testbed`) sets its fields at the layer it is given in (`resolve`).
The resolved config is written to `<run dir>/config.yaml`; `grpo-replay train --config` accepts it back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import yaml

from ..app import configio
from ..errors import ConfigError
from ..advantage import SCALES
from ..tasks.reward_funcs import TASK_REWARD_FUNCS
from ..config import PRESETS, ReplayConfig
from ..loss import LossConfig
from ..validation import MAX_SEED
from ..tasks.testbed.testbed_config import TESTBED_PRESETS, TestbedConfig

REWARDS = ("testbed", "math")
ADVANTAGE_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline")  # verl's adv_estimator names
BACKENDS = ("builtin", "trl")
GENERATORS = ("transformers", "vllm")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "bf16", "fp32")
DEFAULT_OUT_DIR = "runs/{preset}-seed{seed}"


@dataclass
class TrainConfig:
    """One GRPO + replay training run. Defaults: the embedded testbed with the paper's method."""

    # Parameters that control the run as a whole
    seed: int = 0
    """Seed of prompt sampling, generation, evaluation sampling and the replay buffer (the warm start has testbed.seed)."""
    steps: int = 150
    """Training steps (one optimizer update each)."""
    backend: str = "builtin"
    """builtin (this trainer) | trl (ReplayGRPOTrainer)."""

    # Parameters that control the model
    model: Optional[str] = None
    """Local path or hub id of a causal LM, or a GGUF file (.gguf); None = the embedded testbed's warm-started tiny model."""
    model_file: Optional[str] = None
    """A GGUF file inside the `model` directory (or hub repo), e.g. NAME.gguf; None = a regular checkpoint."""
    device: str = "auto"
    """auto (cuda if available) | cpu | cuda."""
    precision: str = "auto"
    """Update precision: auto (bf16 on a GPU, fp32 on a CPU) | bf16 (bf16 autocast with float32 master weights,
    gradients and AdamW state, as TRL's bf16=True and verl's FSDP mixed precision; TF32 matmuls allowed; GPU only)
    | fp32 (float32 throughout)."""
    torch_threads: int = 0
    """CPU threads for torch; 0 = 1 for the embedded testbed (a tiny model runs faster on one thread and is
    deterministic), torch's default otherwise."""

    # Parameters that control the data and the reward
    data: Optional[str] = None
    """Training prompts (with --model): a JSONL file, a .json array, a directory, word_sums, or a Hugging Face dataset
    name (DATASET:CONFIG names a config, e.g. openai/gsm8k:main); GSM8K and MATH field names are read as theirs."""
    heldout_data: Optional[str] = None
    """Held-out prompts for the math task (default: the last eval_problems rows of --data)."""
    reward: str = "testbed"
    """testbed (the synthetic task's exact-match reward) | math (math-verify grading of a \\boxed{} answer)."""
    reward_funcs: tuple[str, ...] = ()
    """The training reward as a weighted sum of named reward functions, each logged as rewards/<name>/mean;
    () = the task's own reward (correct). testbed: correct (1 iff the final answer is right) | digits (partial
    credit: the share of the answer's digit positions, aligned from the units, that are right; 0 without a
    well-formed answer) | format (1 iff the completion ends in a well-formed answer). math: correct. The held-out
    evaluation always scores correct."""
    reward_weights: tuple[float, ...] = ()
    """One weight per reward_funcs entry, in its order (TRL's reward_weights); () = 1 for each."""
    reward_timeout: float = 10.0
    """Seconds a reward call may take before it is scored 0 and counted."""

    # Parameters that control generation
    prompts_per_step: int = 32
    """Fresh prompts per step."""
    group_size: int = 8
    """Rollouts per prompt (G)."""
    temperature: float = 1.0
    """Sampling temperature of the behaviour policy; log-probs are computed at the same temperature."""
    max_new_tokens: int = 0
    """Completion budget in tokens; 0 = the task's default (testbed.max_new_tokens, or 1024 for math)."""
    generator: str = "transformers"
    """Generation backend: transformers (generate with KV cache) | vllm (GPU, optional extra). The held-out
    evaluation of the built-in trainer samples through it too."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (verl's algorithm.filter_groups): after the zero-variance filter, generate further
    rounds of prompts_per_step fresh prompts until the update holds prompts_per_step groups with non-zero
    variance (the surplus is discarded) or max_generation_rounds rounds ran; every round counts in `generated`.
    With replay.fill_filtered, the rows still missing at the round cap are filled from the replay buffer (resample
    up to max_generation_rounds rounds, then fill). Built-in trainer only."""
    max_generation_rounds: int = 10
    """With dynamic_sampling: generation rounds per step at most, the first included (DAPO's recipe sets verl's
    algorithm.filter_groups.max_num_gen_batches=10; verl's own default 0 means no cap). At the cap the step
    trains on the groups it holds (with replay.fill_filtered, plus replay rows in place of the missing ones)."""

    # Parameters that control the replay
    preset: str = "paper"
    """Replay preset applied before any replay.* override: paper | grpo | uniform_pool | sigma_pool."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """Replay settings (replay.tau_max, replay.replay_ratio, ...)."""

    # Parameters that control training
    lr: float = 2e-4
    """AdamW learning rate (the paper uses 1e-6 for 0.6B-4B models; the tiny testbed model needs more)."""
    lr_warmup_steps: int = 0
    """Linear learning-rate warm-up: update k (1-based) uses lr * min(1, k / lr_warmup_steps); 0 = none."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm (0 disables)."""
    micro_batch_size: int = 0
    """Rows per forward/backward pass during the update (gradient accumulation); 0 = whole batch."""
    update_epochs: int = 1
    """Optimizer updates per step on the step's composed batch (the GRPO paper's mu; TRL's num_iterations, verl's
    ppo_epochs). Each is a whole-batch update accumulated over the micro-batches, not one update per micro-batch,
    so micro_batch_size stays a memory setting that does not change the result. Every pass uses the rows'
    behaviour log-probs (the first pass's for fresh rows, the stored ones for replayed rows), so the clip acts on
    fresh rows from the second pass on; the learning-rate schedule advances once per step. Built-in trainer only."""
    advantage_estimator: str = "grpo"
    """How a rollout's advantage is computed from its generation round's rewards (verl's adv_estimator names):
    grpo (r_i - group mean, scaled as advantage_scale says) | rloo (r_i minus the mean of the other rollouts of its
    group, unscaled) | reinforce_plus_plus_baseline (r_i - group mean, then whitened over the round's rollouts).
    A replayed row keeps the advantage its own generation gave it; its priority is |A_i| of that value.
    backend=trl: grpo only (TRL's GRPOTrainer computes the advantages)."""
    advantage_scale: str = "group"
    """With advantage_estimator=grpo (TRL's scale_rewards): group: (r - mean_g) / (std_g + eps); batch:
    (r - mean_g) / (std of the round's rewards + eps); none: r - mean_g (Dr.GRPO). The other estimators fix their
    own scale: group (the default) only."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Policy-loss settings (loss.eps_low, loss.eps_high, ...)."""
    max_bad_steps: int = 5
    """Stop (with a checkpoint) after this many consecutive steps with a NaN/inf loss; such steps are skipped."""

    # Parameters that control evaluation
    eval_every: int = 25
    """Evaluate on the held-out set every this many steps (and at the start and end); 0 = start and end only."""
    eval_problems: int = 256
    """Held-out problems per evaluation."""
    eval_samples: int = 4
    """Sampled completions per held-out problem (mean@n, pass@k); greedy accuracy is measured too."""
    drift_probe: int = 0
    """Policy-drift diagnostic (built-in trainer): probe rows, i.e. held-out prompts with one completion sampled once
    from the initial policy; each step logs drift/kl_1 and drift/kl_tau, the mean per-token KL(pi_t || pi_{t-k}) on
    them for k = 1 and k = replay.tau_max (see trainer/drift.py). 0 = off. It never changes the training run."""

    # Parameters that control logging and checkpoints
    out_dir: str = DEFAULT_OUT_DIR
    """Run directory ({preset} and {seed} are filled in; with backend=trl the default is runs/trl-{preset}-seed{seed},
    with a named testbed runs/[trl-]{testbed_preset}-{preset}-seed{seed}).
    An existing run there is resumed when its config matches (only steps, eval_every and a few others may change)."""
    checkpoint_every: int = 50
    """Write a resumable checkpoint every this many steps (and at the end); 0 = only at the end."""
    keep_checkpoints: int = 2
    """Most recent checkpoints kept."""
    progress: bool = True
    """Show a progress bar."""
    report_to: Union[str, tuple[str, ...]] = "none"
    """Experiment trackers (TRL's word): none | tensorboard | wandb | trackio, several as a list or comma-separated
    (tensorboard,wandb). Each gets every metrics.jsonl / evals.jsonl row under the same names."""

    # Parameters that control the embedded testbed (the task and model when `model` is None)
    testbed_preset: str = "default"
    """Named testbed config applied before any testbed.* override: default (the quick addition testbed) |
    reasoning (running sums where writing the working raises the pass rate; TestbedConfig.reasoning()) |
    small | large (the default task on a 0.11M / 1.71M-parameter model: the model-size series)."""
    testbed: TestbedConfig = field(default_factory=TestbedConfig)
    """The embedded testbed (task, tiny model, warm start)."""

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            configio.bad(self, "preset", ", ".join(PRESETS))
        if self.testbed_preset not in TESTBED_PRESETS:
            configio.bad(self, "testbed_preset", ", ".join(TESTBED_PRESETS))
        named_task = TestbedConfig.named(self.testbed_preset).task
        if self.testbed_preset != "default" and self.testbed.task != named_task:
            raise ConfigError(
                f"TrainConfig.testbed_preset={self.testbed_preset!r} is the {named_task} task but testbed.task="
                f"{self.testbed.task!r}; build it with resolve() (--testbed) or testbed=TestbedConfig.{self.testbed_preset}()"
            )
        if not 0 <= self.seed <= MAX_SEED:
            configio.bad(self, "seed", f"an integer in 0..{MAX_SEED} (numpy and transformers' set_seed take no other)")
        for name in ("steps", "prompts_per_step", "eval_problems", "eval_samples", "max_bad_steps"):
            if getattr(self, name) < 1:
                configio.bad(self, name, "an integer >= 1")
        if self.group_size < 2:
            configio.bad(self, "group_size", "an integer >= 2 (advantages are relative to the group)")
        for name in ("torch_threads", "lr_warmup_steps", "max_new_tokens", "micro_batch_size", "eval_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                configio.bad(self, name, "an integer >= 0")
        if self.drift_probe < 0:
            configio.bad(self, "drift_probe", "an integer >= 0 (0 = off)")
        for name in ("update_epochs", "max_generation_rounds"):
            if getattr(self, name) < 1:
                configio.bad(self, name, "an integer >= 1")
        if not isinstance(self.dynamic_sampling, bool):
            configio.bad(self, "dynamic_sampling", "true or false")
        if not self.dynamic_sampling and self.max_generation_rounds != 10:
            configio.bad(self, "max_generation_rounds", "10 (the default) unless dynamic_sampling is true")
        if self.keep_checkpoints < 1:
            configio.bad(self, "keep_checkpoints", "an integer >= 1")
        for name, ok, allowed in (
            ("lr", lambda x: x > 0, "a finite number > 0"),
            ("temperature", lambda x: x > 0, "a finite number > 0"),
            ("max_grad_norm", lambda x: x >= 0, "a finite number >= 0 (0 disables clipping)"),
            ("weight_decay", lambda x: x >= 0, "a finite number >= 0"),
            ("reward_timeout", lambda x: x > 0, "a finite number > 0"),
        ):
            v = getattr(self, name)
            if not (configio.is_finite(v) and ok(v)):
                configio.bad(self, name, allowed)
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            configio.bad(self, "advantage_estimator", ", ".join(ADVANTAGE_ESTIMATORS))
        if self.advantage_scale not in SCALES:
            configio.bad(self, "advantage_scale", ", ".join(SCALES))
        if self.advantage_estimator != "grpo" and self.advantage_scale != "group":
            configio.bad(self, "advantage_scale", f"group (the default) with advantage_estimator="
                         f"{self.advantage_estimator!r}, which fixes its own scale; batch and none scale grpo")
        if self.device not in DEVICES:
            configio.bad(self, "device", ", ".join(DEVICES))
        if self.backend not in BACKENDS:
            configio.bad(self, "backend", ", ".join(BACKENDS))
        if self.generator not in GENERATORS:
            configio.bad(self, "generator", ", ".join(GENERATORS))
        if self.precision not in PRECISIONS:
            configio.bad(self, "precision", ", ".join(PRECISIONS))
        if self.drift_probe and self.backend != "builtin":
            configio.bad(self, "drift_probe", "0 with backend='trl' (the drift diagnostic is the built-in trainer's)")
        from ..app.tracking import parse_report_to

        self.report_to = ",".join(parse_report_to(self.report_to)) or "none"  # normalised, e.g. "tensorboard,wandb"
        if self.reward not in REWARDS:
            configio.bad(self, "reward", ", ".join(REWARDS))
        self._check_reward_funcs()
        if self.reward == "math" and not self.data:
            raise ConfigError("TrainConfig.reward='math' needs TrainConfig.data (a JSONL path or dataset name)")
        if self.model_file and not self.model:
            raise ConfigError("TrainConfig.model_file names a GGUF file inside TrainConfig.model; set model too")
        if self.reward == "testbed" and (self.model or self.data):
            raise ConfigError(
                "TrainConfig.model / TrainConfig.data are for real models; set reward='math' (--reward math) with them"
            )

    def _check_reward_funcs(self) -> None:
        allowed = TASK_REWARD_FUNCS.get(self.reward, ())
        for name in self.reward_funcs:
            if name not in allowed:
                configio.bad(self, "reward_funcs", f"a list of {', '.join(allowed)} with reward={self.reward!r}")
        if len(set(self.reward_funcs)) != len(self.reward_funcs):
            configio.bad(self, "reward_funcs", "a list of distinct names")
        if self.reward_weights and len(self.reward_weights) != len(self.reward_funcs):
            configio.bad(self, "reward_weights", f"[] or one weight per reward_funcs entry ({len(self.reward_funcs)})")
        if not all(configio.is_finite(w) for w in self.reward_weights):
            configio.bad(self, "reward_weights", "finite numbers")

    @property
    def estimator(self) -> str:
        """The run's entry of the core's `ESTIMATORS` (advantage_estimator with grpo's advantage_scale)."""
        if self.advantage_estimator != "grpo":
            return self.advantage_estimator
        return {"group": "grpo", "batch": "grpo_batch", "none": "dr_grpo"}[self.advantage_scale]

    @property
    def run_dir(self) -> Path:
        template = self.out_dir
        if template == DEFAULT_OUT_DIR:  # never the built-in run's (or the default testbed's) directory
            prefix = ("trl-" if self.backend == "trl" else "") + (
                f"{self.testbed_preset}-" if self.testbed_preset != "default" else "")
            template = f"runs/{prefix}{{preset}}-seed{{seed}}"
        return Path(template.format(preset=self.preset, seed=self.seed)).expanduser()  # `~/runs/x`, as the shell would

    def completion_budget(self) -> int:
        if self.max_new_tokens:
            return self.max_new_tokens
        return self.testbed.max_new_tokens if self.reward == "testbed" else 1024

    def replay_overrides(self) -> dict[str, Any]:
        """The replay.* fields that differ from the preset's values, as `ReplayConfig` keyword arguments."""
        preset = ReplayConfig.from_preset(self.preset).to_dict()
        return {k: v for k, v in self.replay.to_dict().items() if preset[k] != v}

    def to_dict(self) -> dict[str, Any]:
        return configio.to_dict(self)

    def flat(self) -> dict[str, Any]:
        """Every key dotted (`replay.tau_max`) with a plain value (lists, not tuples): the form of config.yaml read
        back, of `--set` and of `FIELDS`, so two configs compare key by key."""
        return configio.flatten(configio.plain(self.to_dict()))

    def to_yaml(self) -> str:
        return yaml.safe_dump(configio.plain(self.to_dict()), sort_keys=False)


FIELDS = configio.flat_fields(TrainConfig)


def check_machine(cfg: TrainConfig) -> None:
    """Refuse, before any compute, settings this machine cannot run (a valid config.yaml may come from another
    machine, so this is not part of TrainConfig's own validation)."""
    import importlib.util

    import torch

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("TrainConfig.device='cuda' but no CUDA device is available here; allowed: auto, cpu")
    if cfg.precision == "bf16" and (cfg.device == "cpu" or not torch.cuda.is_available()):
        raise ConfigError("TrainConfig.precision='bf16' needs a CUDA device, and the run is on the CPU here; "
                          "allowed: auto, fp32")
    if cfg.generator == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                "TrainConfig.generator='vllm' needs vLLM, which is not installed (pip install -e '.[vllm]' in the checkout: the vLLM range TRL supports; GPU only); "
                "allowed: transformers")
        if cfg.device == "cpu" or not torch.cuda.is_available():
            raise ConfigError("TrainConfig.generator='vllm' needs a CUDA device, and none is available here; allowed: transformers")


def preset_fields() -> dict[str, tuple[str, ...]]:
    """preset key -> the flat keys its presets set: every field some named config sets away from the default
    (replay.replay_ratio, .priority, .composition, .granularity; the named testbeds' fields)."""
    def varying(prefix: str, configs: list[dict]) -> tuple[str, ...]:
        return tuple(f"{prefix}{k}" for k in configs[0] if any(c[k] != configs[0][k] for c in configs))

    return {
        "preset": varying("replay.", [ReplayConfig.from_preset(p).to_dict() for p in PRESETS]),
        "testbed_preset": varying("testbed.", [TestbedConfig.named(p).to_dict() for p in TESTBED_PRESETS]),
    }


def _preset_values(key: str, name: Any) -> dict[str, Any]:
    """The flat values preset `key`=`name` sets (its `preset_fields`)."""
    names = PRESETS if key == "preset" else TESTBED_PRESETS
    if name not in names:
        raise ConfigError(f"TrainConfig.{key}={name!r} is invalid; allowed: {', '.join(names)}")
    values = ReplayConfig.from_preset(name).to_dict() if key == "preset" else TestbedConfig.named(name).to_dict()
    return {k: values[k.split(".", 1)[1]] for k in preset_fields()[key]}


def resolve(overrides: Mapping[str, Any] | None = None, yaml_path: str | None = None) -> TrainConfig:
    """Build a validated TrainConfig from a YAML file and dotted overrides (the command line).

    Layers, lowest first: the field defaults, the file, the overrides. A preset (`preset`, `testbed_preset`) given
    in a layer sets its fields (`preset_fields`) over every lower layer; a key given explicitly in the same layer or
    a higher one wins over it. So `--preset grpo` over a saved config.yaml trains GRPO, and
    `--preset grpo --set replay.tau_max=5` keeps tau_max 5.
    """
    checked: dict[str, Any] = {}
    for layer in (configio.load_yaml(yaml_path) if yaml_path else {}, dict(overrides or {})):
        configio.validate_keys(layer, FIELDS)
        layer = {k: configio.check_value(k, v, FIELDS[k][0]) for k, v in layer.items()}
        for key in ("preset", "testbed_preset"):
            if key in layer:
                checked.update(_preset_values(key, layer[key]))
        checked.update(layer)
    _check_testbed_task(checked)
    return configio.build(TrainConfig, checked)


def _check_testbed_task(checked: Mapping[str, Any]) -> None:
    """A testbed.task other than the named testbed's, refused naming both keys (the testbed's own check would
    name the first of its fields the other task cannot use)."""
    named = checked.get("testbed_preset", "default")
    task = TestbedConfig.named(named).task
    asked = checked.get("testbed.task", task)
    if named == "default" or asked == task:
        return
    others = [n for n in TESTBED_PRESETS if TestbedConfig.named(n).task == asked]
    raise ConfigError(
        f"testbed.task={asked!r} is invalid with testbed_preset={named!r} (--testbed {named}), which is the {task} "
        f"task; allowed: testbed.task={task}" + (f", or testbed_preset={'|'.join(others)} for the {asked} task" if others else ""))
