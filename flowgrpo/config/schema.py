"""The configuration tree: one dataclass per section, every field with help text and units.

Sizes are per process and everything hardware-dependent is derived at run time. Values are
checked here, at load time, before any model is loaded (see :mod:`flowgrpo.config.io` for YAML
loading, ``--set`` overrides and the cross-section checks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from flowgrpo.config.checks import require, require_choice
from flowgrpo.errors import ConfigError
from flowgrpo.validation import is_number

# torch.compile modes of model.compile ('' leaves the model eager)
COMPILE_MODES = ("", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _help(text: str, **kw: Any) -> Any:
    """A dataclass field with help text (shown by ``flowgrpo config --help-fields``)."""
    if "default_factory" in kw:
        return field(default_factory=kw.pop("default_factory"), metadata={"help": text})
    return field(default=kw.pop("default"), metadata={"help": text})


DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class ModelConfig:
    family: str = _help("model family adapter", default="sd3")
    path: str = _help("hub id or local diffusers folder; 'digits' is the shipped CPU toy",
                      default="digits")
    height: int = _help("image height in pixels (0: the model's native size)", default=0)
    width: int = _help("image width in pixels (0: the model's native size)", default=0)
    dtype: str = _help("dtype the weights are loaded in: float32, bfloat16 or float16",
                       default="float32")
    mixed_precision: str = _help("autocast for model calls: fp32 (none), bf16 or fp16; step "
                                 "math stays fp32", default="fp32")
    guidance: float = _help("CFG scale (or guidance-embedding value) for rollout, training and "
                            "eval; 1 disables CFG", default=1.0)
    negative_prompt: str = _help("unconditional prompt for CFG", default="")
    options: dict = _help("extra family options passed to pipelines.load (e.g. num_frames)",
                          default_factory=dict)
    lora: bool = _help("train a LoRA adapter (true) or fine-tune all transformer weights",
                       default=True)
    lora_rank: int = _help("LoRA rank r", default=8)
    lora_alpha: float = _help("LoRA alpha (scale = alpha / r)", default=16.0)
    lora_targets: list = _help("module names the LoRA wraps ([]: the family's default)",
                               default_factory=list)
    gradient_checkpointing: bool = _help("recompute transformer activations in backward "
                                         "(less memory, ~30% more time)", default=False)
    offload_encoders: bool = _help("move text encoders and VAE to CPU between uses",
                                   default=False)
    cache_prompt_embeds: bool = _help("keep prompt encodings across epochs (encode each prompt "
                                      "once per run)", default=True)
    compile: str = _help("torch.compile the transformer's forward: '' (off), default, "
                         "reduce-overhead, max-autotune or max-autotune-no-cudagraphs",
                         default="")

    def validate(self) -> None:
        require_choice("model.dtype", self.dtype, DTYPES)
        require_choice("model.mixed_precision", self.mixed_precision, ("fp32", "bf16", "fp16"))
        require_choice("model.compile", self.compile, COMPILE_MODES)
        require(self.height >= 0 and self.width >= 0, "model.height/width", (self.height,
                self.width), "must be >= 0 (0 = native)")
        require(self.guidance >= 0, "model.guidance", self.guidance, "must be >= 0")
        require(self.lora_rank >= 1, "model.lora_rank", self.lora_rank, "must be >= 1")
        require(self.lora_alpha > 0, "model.lora_alpha", self.lora_alpha, "must be > 0")


@dataclass
class SamplerConfig:
    name: str = _help("stochastic sampler for rollouts (samplers registry)", default="sde")
    params: dict = _help("sampler parameters, e.g. {noise_level: 0.7}", default_factory=dict)
    num_steps: int = _help("denoising steps per rollout", default=10)
    eval_num_steps: int = _help("Euler steps for eval images (0: num_steps)", default=0)
    after_window: str = _help("solver after each sample's last trained step: euler (same grid) "
                              "or dpm2 (MixGRPO-Flash re-gridded DPM-Solver++(2M))",
                              default="euler")
    flash_ratio: float = _help("dpm2 only: fraction of the remaining steps kept", default=0.5)
    storage_dtype: str = _help("dtype of stored trajectory latents", default="float32")
    rollout: str = _help("how a batch is rolled out (flowgrpo.rl.rollout.ROLLOUTS): chain (every "
                         "sample its own trajectory) or tree (BranchGRPO: each group one tree "
                         "with shared prefixes)", default="chain")
    rollout_params: dict = _help("rollout parameters, e.g. {branch_at: [0, 3], factor: 2}",
                                 default_factory=dict)

    def validate(self) -> None:
        require(self.num_steps >= 2, "sampler.num_steps", self.num_steps, "must be >= 2")
        require(self.eval_num_steps >= 0, "sampler.eval_num_steps", self.eval_num_steps,
                "must be >= 0")
        require_choice("sampler.after_window", self.after_window, ("euler", "dpm2"))
        require(0 < self.flash_ratio <= 1, "sampler.flash_ratio", self.flash_ratio,
                "must be in (0, 1]")
        require_choice("sampler.storage_dtype", self.storage_dtype, DTYPES)


@dataclass
class RewardConfig:
    name: str = _help("reward (reward_models registry); left at its default when components "
                      "is set", default="digit")
    params: dict = _help("reward parameters", default_factory=dict)
    components: list = _help("weighted mix: a list of {name, weight, params}",
                             default_factory=list)
    aggregation: str = _help("how several rewards become one advantage: sum_then_normalize or "
                             "normalize_then_sum (GDPO)", default="sum_then_normalize")
    mix_mode: str = _help("how components combine into one score: weighted (sum of weight x "
                          "score) or sample (one component per sample, drawn with probability "
                          "proportional to its weight; FlowTTS-GRPO)", default="weighted")
    async_workers: int = _help("reward worker threads overlapping the next rollout (0: inline)",
                               default=0)

    def specs(self) -> list[dict]:
        """The rewards as ``[{name, weight, params}]`` (one entry for a single reward)."""
        if not self.components:
            return [{"name": self.name, "weight": 1.0, "params": dict(self.params)}]
        return [{"weight": 1.0, "params": {}, **c} for c in self.components]

    def validate(self) -> None:
        if self.components:  # a mix replaces the single reward: its keys would be ignored
            require(not self.params, "reward.params", self.params, "unused when "
                    "reward.components is set: give each component its own params")
            require(self.name == RewardConfig.name, "reward.name", self.name, "unused when "
                    "reward.components is set: list it as a component (or drop components)")
        for i, spec in enumerate(self.components):
            require(isinstance(spec, dict) and "name" in spec, f"reward.components[{i}]", spec,
                   "each component is a mapping with a 'name' (and optional weight, params)")
            extra = set(spec) - {"name", "weight", "params"}
            require(not extra, f"reward.components[{i}]", sorted(extra),
                   "allowed keys: name, weight, params")
        for i, spec in enumerate(self.specs()):
            key = f"reward.components[{i}].weight" if self.components else "reward.weight"
            require(is_number(spec["weight"]) and abs(spec["weight"]) < math.inf, key,
                    spec["weight"], "must be a finite number")
        require_choice("reward.aggregation", self.aggregation,
                       ("sum_then_normalize", "normalize_then_sum"))
        if self.mix_mode == "sample":
            weights = [spec["weight"] for spec in self.specs()]
            require(all(w >= 0 for w in weights) and sum(weights) > 0,
                   "reward.components[].weight", weights, "mix_mode sample draws each reward "
                   "with probability proportional to its weight: weights >= 0, positive sum")
        require(self.async_workers >= 0, "reward.async_workers", self.async_workers, "must be >= 0")


@dataclass
class DataConfig:
    prompts: str = _help("training prompts: a built-in set ('digits'; 'digits_video'; "
                         "'tts_hard', hard texts for speech) or a .txt (one per line) / .jsonl "
                         "({prompt, ...metadata}) file", default="digits")
    eval_prompts: str = _help("eval prompts, same forms ('': the training prompts)", default="")
    eval_images_per_prompt: int = _help("eval images per prompt, each with a fixed seed",
                                        default=4)

    def validate(self) -> None:
        from flowgrpo.data.prompts import load_prompts

        require(self.eval_images_per_prompt >= 1, "data.eval_images_per_prompt",
                self.eval_images_per_prompt, "must be >= 1")
        # reading the prompt files is cheap: a missing or malformed one fails now, not after the
        # model has loaded
        load_prompts(self.prompts, "data.prompts")
        if self.eval_prompts:
            load_prompts(self.eval_prompts, "data.eval_prompts")


@dataclass
class TrainConfig:
    group_size: int = _help("samples per prompt (the GRPO group)", default=8)
    batch_size: int = _help("samples rolled out per epoch, per process (a multiple of "
                            "group_size)", default=32)
    sample_batch_size: int = _help("samples per rollout forward, per process (0: batch_size)",
                                   default=0)
    train_batch_size: int = _help("samples per training forward, per process (0: batch_size)",
                                  default=0)
    gradient_accumulation: int = _help("training minibatches per optimizer step", default=1)
    num_inner_epochs: int = _help("passes over each rollout batch", default=1)
    lr: float = _help("AdamW learning rate", default=3e-4)
    weight_decay: float = _help("AdamW weight decay", default=1e-4)
    adam_beta1: float = _help("AdamW beta1", default=0.9)
    adam_beta2: float = _help("AdamW beta2", default=0.999)
    optimizer_kernel: str = _help("AdamW implementation: auto (fused on CUDA, torch's default "
                                  "elsewhere), fused or foreach", default="auto")
    max_grad_norm: float = _help("gradient-norm clip (0: off)", default=1.0)
    loss: str = _help("policy loss on the per-step ratio (objective ratio)", default="clip")
    loss_params: dict = _help("loss parameters, e.g. {clip_low: 1e-4, clip_high: 1e-4}",
                              default_factory=dict)
    beta: float = _help("KL weight against the reference model (0: no reference calls)",
                        default=0.0)
    kl: str = _help("KL estimator against the reference model, one the objective takes ('': the "
                    "objective's default)", default="")
    objective: str = _help("what the update minimises: ratio (per-step Gaussian ratio + "
                           "train.loss) or a likelihood-free objective", default="ratio")
    objective_params: dict = _help("objective parameters", default_factory=dict)
    step_selection: str = _help("which steps each sample trains (all: every trainable step)",
                                default="all")
    step_selection_params: dict = _help("step-selection parameters, e.g. window {size: 2, "
                                        "strategy: random} or flash {steps: [0, 1, 2]}",
                                        default_factory=dict)
    credit: str = _help("how rewards are credited to steps (outcome: one reward per sample)",
                        default="outcome")
    credit_params: dict = _help("credit parameters", default_factory=dict)
    views: int = _help("extra captions per prompt group, each re-scoring the same samples "
                       "(MV-GRPO; 0: the prompt only)", default=0)
    enhancer: str = _help("condition enhancer giving the views", default="template")
    enhancer_params: dict = _help("enhancer parameters, e.g. {templates: ['a photo of {prompt}']}",
                                  default_factory=dict)
    advantage: str = _help("advantage estimator (group: GRPO's per-group normalisation)",
                           default="group")
    advantage_params: dict = _help("advantage-estimator parameters, e.g. focal {gamma: 2}",
                                   default_factory=dict)
    pruner: str = _help("prune low-information samples before the update, reweighting the "
                        "kept ones so the expected gradient is unchanged (none: off)",
                        default="none")
    pruner_params: dict = _help("pruner parameters, e.g. dppo {group_rate: 0.5, sample_rate: "
                                "0.5}", default_factory=dict)
    adv_clip: float = _help("advantages clipped to [-adv_clip, adv_clip] (0: off)", default=5.0)
    skip_zero_advantage: bool = _help("skip training samples whose advantages are all exactly "
                                      "0; with beta > 0 they are still trained (their KL term "
                                      "has a gradient)", default=True)
    ema: bool = _help("keep an EMA of trainable weights, used for eval", default=False)
    ema_decay: float = _help("EMA decay per optimizer step", default=0.95)

    def validate(self) -> None:
        require(self.group_size >= 2, "train.group_size", self.group_size,
                "must be >= 2 (advantages are relative within a group)")
        require(self.batch_size >= 1, "train.batch_size", self.batch_size, "must be >= 1")
        require(self.batch_size % self.group_size == 0, "train.batch_size", self.batch_size,
                f"must be a multiple of train.group_size ({self.group_size})")
        for key in ("sample_batch_size", "train_batch_size"):
            value = getattr(self, key)
            require(0 <= value <= self.batch_size, f"train.{key}", value,
                   f"must be in [0, batch_size = {self.batch_size}] (0: batch_size)")
        require(self.gradient_accumulation >= 1, "train.gradient_accumulation",
                self.gradient_accumulation, "must be >= 1")
        require(self.num_inner_epochs >= 1, "train.num_inner_epochs", self.num_inner_epochs,
                "must be >= 1")
        require(math.isfinite(self.lr) and self.lr > 0, "train.lr", self.lr,
                "must be a finite number > 0")
        require(math.isfinite(self.weight_decay) and self.weight_decay >= 0, "train.weight_decay",
                self.weight_decay, "must be a finite number >= 0 (0: off)")
        for key in ("adam_beta1", "adam_beta2"):
            require(0 <= getattr(self, key) < 1, f"train.{key}", getattr(self, key),
                   "must be in [0, 1)")
        require(self.max_grad_norm >= 0, "train.max_grad_norm", self.max_grad_norm, "must be >= 0")
        require_choice("train.optimizer_kernel", self.optimizer_kernel,
                       ("auto", "fused", "foreach"))
        require(self.beta >= 0, "train.beta", self.beta, "must be >= 0")
        require(self.adv_clip >= 0, "train.adv_clip", self.adv_clip, "must be >= 0 (0: off)")
        require(0 <= self.ema_decay < 1, "train.ema_decay", self.ema_decay, "must be in [0, 1)")
        require(self.views >= 0, "train.views", self.views, "must be >= 0")


@dataclass
class RunConfig:
    output_dir: str = _help("run directory ('': a fresh runs/<timestamp>)", default="")
    seed: int = _help("base random seed: prompt groups, noise and minibatch order are drawn "
                           "from (seed, epoch, global index), the same on any number of "
                           "processes", default=0)
    epochs: int = _help("training epochs (one rollout batch + its updates each)", default=40)
    eval_every: int = _help("epochs between evals (0: only at start and end)", default=5)
    save_every: int = _help("epochs between checkpoints (0: only at the end)", default=10)
    keep_checkpoints: int = _help("checkpoints kept on disk (oldest deleted)", default=2)
    tensorboard: bool = _help("write TensorBoard logs", default=True)
    wandb: bool = _help("log to Weights & Biases (needs `pip install wandb`)", default=False)
    wandb_project: str = _help("W&B project name", default="flowgrpo")
    cpu: bool = _help("run on CPU even if an accelerator is present", default=False)
    progress: bool = _help("show a progress bar", default=True)
    on_reward_error: str = _help("when a reward raises or returns the wrong number of scores: "
                                 "stop (checkpoint, exit 1), skip_group (train without the "
                                 "groups of the failed chunk) or retry (run.reward_retries "
                                 "times, then stop)", default="retry")
    reward_retries: int = _help("retries of a failed reward call (on_reward_error: retry)",
                                default=2)
    on_nonfinite: str = _help("when a reward returns NaN or inf: stop (checkpoint, exit 1) or "
                              "skip_group (train without the groups holding one)",
                              default="stop")
    max_nonfinite_steps: int = _help("optimizer steps with a non-finite loss or gradient are "
                                     "skipped; this many in a row stop the run", default=3)

    def validate(self) -> None:
        require(self.epochs >= 1, "run.epochs", self.epochs, "must be >= 1")
        require_choice("run.on_reward_error", self.on_reward_error, ("stop", "skip_group", "retry"))
        require_choice("run.on_nonfinite", self.on_nonfinite, ("stop", "skip_group"))
        require(self.reward_retries >= 0, "run.reward_retries", self.reward_retries,
                "must be >= 0")
        require(self.max_nonfinite_steps >= 1, "run.max_nonfinite_steps",
                self.max_nonfinite_steps, "must be >= 1")
        for key in ("eval_every", "save_every"):
            require(getattr(self, key) >= 0, f"run.{key}", getattr(self, key), "must be >= 0")
        require(self.keep_checkpoints >= 1, "run.keep_checkpoints", self.keep_checkpoints,
                "must be >= 1")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def validate(self) -> Config:
        """Check every section, then what spans sections; raise :class:`ConfigError` on the first
        bad value."""
        from flowgrpo.config.pieces import validate_pieces

        for f in fields(self):
            getattr(self, f.name).validate()
        validate_pieces(self)
        self.check_sampler()
        self.check_steps()
        from flowgrpo.rl.objectives import OBJECTIVES

        per_sample = not OBJECTIVES.get(self.train.objective).needs_transitions
        require(not (per_sample and (self.train.views or self.train.credit != "outcome")),
                "train.objective", self.train.objective, "a likelihood-free objective takes one "
                "outcome advantage per sample: use train.credit: outcome and train.views: 0")
        require(not (self.train.views and self.train.credit != "outcome"), "train.views",
                self.train.views, f"views need train.credit: outcome (got {self.train.credit!r})")
        return self

    def check_sampler(self) -> None:
        """A deterministic sampler is allowed exactly when nothing needs per-step transitions."""
        import samplers
        from flowgrpo.config.pieces import builtin_names
        from flowgrpo.rl.objectives import OBJECTIVES

        tc = self.train
        sampler = samplers.build(self.sampler.name, **self.sampler.params)
        space = OBJECTIVES.get(tc.objective).state_space
        require(space is None or sampler.state_space is space, "train.objective", tc.objective,
                f"the objective trains a model of {getattr(space, 'name', '')} states but sampler "
                f"{self.sampler.name!r} steps in {sampler.state_space.name} states (a token model "
                f"samples with ctmc)")
        from flowgrpo.rl.credit import CREDITS

        credit_space = CREDITS.get(tc.credit).state_space
        require(credit_space is None or sampler.state_space is credit_space, "train.credit",
                tc.credit, f"the credit needs {getattr(credit_space, 'name', '')} states but "
                f"sampler {self.sampler.name!r} steps in {sampler.state_space.name} states (use "
                f"train.credit: outcome)")
        if sampler.is_stochastic:
            return
        free = [n for n in builtin_names("objective") if not OBJECTIVES.get(n).needs_transitions]
        require(not OBJECTIVES.get(tc.objective).needs_transitions, "sampler",
                f"{self.sampler.name} {self.sampler.params}",
                f"a deterministic sampler (std 0) has no transitions for objective "
                f"{tc.objective!r} to train; use a noise level > 0 or a likelihood-free objective "
                f"({', '.join(free)})")
        require(tc.step_selection == "all" and tc.credit == "outcome", "sampler",
                self.sampler.name, "a deterministic sampler has no stochastic steps to select or "
                "credit: use train.step_selection: all and train.credit: outcome")

    def check_steps(self) -> None:
        """Dry-run the step selection on a uniform schedule of ``sampler.num_steps`` steps, so a
        window that does not fit fails now rather than after the model loads."""
        import torch

        import samplers
        from flowgrpo.rl import step_selection as steps

        tc = self.train
        selection = steps.build(tc.step_selection, seed=self.run.seed, **tc.step_selection_params)
        sigmas = torch.linspace(1.0, 0.0, self.sampler.num_steps + 1)
        sampler = samplers.build(self.sampler.name, **self.sampler.params)
        try:
            trained = selection.select(sigmas, torch.zeros(tc.group_size, dtype=torch.long), 0,
                                       sampler)
            selection.weights(sigmas, trained, sampler)  # e.g. a Gaussian-only loss weight
        except ValueError as err:
            raise ConfigError(f"train.step_selection_params: {err}") from None
