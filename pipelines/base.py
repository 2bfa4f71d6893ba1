"""The adapter interface every model family implements, and the family registry.

An adapter owns only what is model-specific (docs/design.md, "The adapter contract"): prompt
encoding, initial noise, the shifted schedule, the single model call (with CFG or a guidance
embedding), decoding, and how a LoRA is saved so that the family's diffusers pipeline loads it back.
Samplers, losses and the trainer never see model units (timesteps) or latent packing.
"""

from __future__ import annotations

import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from flowgrpo.registry import Registry
from samplers.spaces import CONTINUOUS, StateSpace

# The attention projections of both streams of a joint-attention (MMDiT) block: SD3's and
# FLUX's LoRA recipes train these.
MMDIT_LORA_TARGETS = (
    "attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0",
    "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
)

LOGPROB_WEIGHT = "logprob_weight"
"""The :class:`Cond` key of an optional per-position weight of a step's log-density, ``[B, ...]``
broadcastable to the latents (1: a generated position; 0: a position the model does not generate,
such as a TTS voice prompt's frames or the padding after a clip). Rollouts and replays pass it to
:func:`samplers.gaussian_log_prob` and the KL, so those positions add nothing to ratios or KLs."""

LATENT_LENGTH = "latent_length"
"""The :class:`Cond` key of each sample's own length ``[B]`` (long) along dim 1 of the latents,
for a family whose samples differ in length within a batch (speech with per-prompt durations).
The batch's latents are padded to its longest; a sample's positions from its length on are
padding and stay exactly 0: its initial noise (:meth:`FlowAdapter.initial_noise`) and the noise
of its stochastic steps are drawn at its own length (the numbers a batch of that length alone
draws) and padded with zeros, the family's velocity there is 0, and :data:`LOGPROB_WEIGHT` is 0
there (and ``T / length`` on its own frames, so the mean over the padded latent is the mean over
its own). Absent (every other family): every sample has the latents' full shape."""


@dataclass
class Cond:
    """Prompt encodings; every tensor has the batch on dim 0.

    Negative (unconditional) encodings, when the family uses CFG, are stored per sample too
    (``neg_*`` keys), so that any sub-batch of a rollout can be replayed with :meth:`index`.
    """

    tensors: dict[str, torch.Tensor]
    _last: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0]

    def index(self, idx: torch.Tensor | list[int] | slice) -> Cond:
        """The sub-batch ``idx``.

        The last tensor ``idx`` and its result are remembered: training replays every trained
        step of a minibatch with the same index tensor, and re-gathering the encodings each time
        cost 10 ms per iteration on the tiny SD3 (``benchmarks/overhead.py``)."""
        if self._last is not None and self._last[0] is idx:
            return self._last[1]
        out = Cond({k: v[idx] for k, v in self.tensors.items()})
        if isinstance(idx, torch.Tensor):
            self._last = (idx, out)
        return out

    def to(self, device: torch.device | str) -> Cond:
        return Cond({k: v.to(device) for k, v in self.tensors.items()})

    @staticmethod
    def cat(conds: list[Cond]) -> Cond:
        """Concatenate along the batch; every part must hold the same keys (one-line
        ``ValueError`` otherwise, e.g. a batch mixing edits with text-to-image prompts)."""
        keys = set(conds[0].tensors)
        for c in conds[1:]:
            if set(c.tensors) != keys:
                raise ValueError(f"cannot batch encodings with different parts "
                                 f"({sorted(keys)} vs {sorted(c.tensors)}): a batch mixes "
                                 f"samples with and without a source image or voice prompt")
        return Cond({k: torch.cat([c.tensors[k] for c in conds]) for k in conds[0].tensors})


class FlowAdapter(ABC):
    """A flow-matching generator seen through the conventions (docs/design.md, "Conventions").

    Attributes:
        modality: ``"image"``, ``"video"`` or ``"audio"`` (what :meth:`decode` returns).
        state_space: the kind of state it generates: continuous latents here, tokens for a
            :class:`~pipelines.discrete.DiscreteAdapter`.
        pipeline_classes: the diffusers pipeline class names (``model_index.json``'s
            ``_class_name``) this family loads; ``flowgrpo`` checks ``model.path`` against them
            before loading any weight. Empty (the default): the path is not checked.
        sample_rate: audio samples per second (audio families only).
        transformer: the module LoRA wraps and the optimizer trains.
        pipeline: the underlying diffusers pipeline (components, ``load_lora_weights``).
        default_lora_targets: module names a LoRA targets by default for this family.
        text_encoder_names: pipeline components that only encode prompts (offloadable).
        per_prompt_encoding: whether a prompt's encoding is independent of the other prompts
            encoded with it (so encodings can be cached per prompt and concatenated). False
            when prompts are padded to the batch's longest and the model attends to padding.
        condition_keys: the metadata keys a sample's encoding depends on besides its prompt
            (``("image",)`` for an editing family: the source image's path). Empty (the
            default): :meth:`encode_inputs` is :meth:`encode` and metadata is never read.
    """

    modality: str = "image"
    state_space: StateSpace = CONTINUOUS
    pipeline_classes: tuple[str, ...] = ()
    sample_rate: int | None = None
    default_lora_targets: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0")
    text_encoder_names: tuple[str, ...] = ("text_encoder", "text_encoder_2", "text_encoder_3")
    per_prompt_encoding: bool = True
    condition_keys: tuple[str, ...] = ()
    transformer: torch.nn.Module
    pipeline: Any

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.transformer.parameters()).dtype

    @abstractmethod
    def encode(self, prompts: list[str]) -> Cond:
        """Text (and negative) embeddings for ``prompts``; computed without gradients."""

    def encode_inputs(self, prompts: list[str], metadata: list[dict] | None = None) -> Cond:
        """Encodings of ``prompts`` with each sample's other inputs (its metadata's
        :attr:`condition_keys`, e.g. the source image of an edit); computed without gradients.
        The default ignores metadata: :meth:`encode`."""
        return self.encode(prompts)

    @abstractmethod
    def noise(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Initial latents at sigma = 1, float32 on :attr:`device`, e.g. ``[n, C, h, w]``."""

    def initial_noise(self, generators: list[torch.Generator], cond: Cond) -> torch.Tensor:
        """Initial latents of a batch whose encodings are ``cond``, sample ``i`` drawn from
        ``generators[i]`` alone (rollouts and evaluation draw through this).

        The default concatenates :meth:`noise` ``(1, generators[i])`` and does not read
        ``cond``. A family whose sample shape follows its prompt overrides it: such a shape is
        known only once the prompt is encoded (the speech families' per-prompt durations, see
        :data:`LATENT_LENGTH`)."""
        return torch.cat([self.noise(1, g) for g in generators])

    @abstractmethod
    def schedule(self, num_steps: int) -> torch.Tensor:
        """Descending float32 sigmas ``[num_steps + 1]`` with the model's shift, last = 0."""

    @abstractmethod
    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """The model's velocity ``v ~ eps - x0`` at ``(x, sigma)``, shaped like ``x``.

        Args:
            x: latents (float32 or the model dtype).
            sigma: ``[B]`` noise levels in [0, 1] (the adapter converts to its own units).
            cond: encodings of the same batch.
            guidance: CFG scale (or guidance-embedding value); CFG runs as one batched call.
        """

    @abstractmethod
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Latents at sigma = 0 -> media tensor (image ``[B,3,H,W]`` in [0,1], ...)."""

    def save_lora(
        self,
        directory: str,
        lora_state_dict: dict[str, torch.Tensor],
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Write a LoRA so that this family's diffusers pipeline ``load_lora_weights`` reads it.

        Args:
            directory: folder that receives ``pytorch_lora_weights.safetensors``.
            lora_state_dict: the transformer's peft LoRA state dict (``get_peft_model_state_dict``).
            metadata: the peft ``LoraConfig`` as a dict (rank, alpha, targets), stored alongside.
        """
        type(self.pipeline).save_lora_weights(
            directory,
            transformer_lora_layers=lora_state_dict,
            transformer_lora_adapter_metadata=metadata,
        )

    def add_lora(self, config: Any, adapter_name: str = "default") -> None:
        """Wrap :attr:`transformer`'s ``config.target_modules`` in a peft LoRA named
        ``adapter_name`` (diffusers' ``add_adapter``, or peft's injection for a transformer
        without diffusers' peft mixin)."""
        if hasattr(self.transformer, "add_adapter"):
            self.transformer.add_adapter(config, adapter_name=adapter_name)
        else:
            inject_lora(self.transformer, config, adapter_name)

    def load_lora(self, directory: str) -> None:
        """Load a LoRA written by :meth:`save_lora` into :attr:`transformer`, the component it
        trained.

        The transformer's diffusers ``load_lora_adapter`` reads the folder's ``transformer.``
        weights and the ``LoraConfig`` stored with them (rank, alpha, targets), as the pipeline's
        ``load_lora_weights`` does for its transformer, without also searching the text encoders
        for weights a flowgrpo LoRA never holds. The folder stays a diffusers one:
        ``pipeline.load_lora_weights(directory)`` loads the same LoRA. A transformer without
        diffusers' peft mixin (no ``load_lora_adapter``) is loaded by the pipeline's
        ``load_lora_weights``.
        """
        if not hasattr(self.transformer, "load_lora_adapter"):
            self.pipeline.load_lora_weights(directory)
            return
        # what `load_lora_weights` passes: the safetensors file (without `use_safetensors` this
        # method looks only for a pickled `.bin`), weights assigned instead of a random init (its
        # default with the peft and transformers versions flowgrpo needs), and the pipeline, whose
        # CPU offloading hooks are lifted while the LoRA is injected
        self.transformer.load_lora_adapter(directory, prefix="transformer", use_safetensors=True,
                                           low_cpu_mem_usage=True, _pipeline=self.pipeline)

    def position_weights(self, regions: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """Map region scores ``[B, h, w]`` on the image grid onto the latent grid.

        The default covers ``[B, C, H', W']`` latents: the image grid is resized (area average) to
        the latent's spatial size, because a latent position summarises a VAE-downsampled patch.
        Returns a tensor broadcastable to ``latents``. Families with packed or 5-D latents override.
        """
        if latents.dim() != 4:
            raise NotImplementedError(f"{type(self).__name__} does not map regions to its latents")
        grid = F.interpolate(regions[:, None].float(), size=latents.shape[-2:], mode="area")
        return grid

    def _model(self, **inputs: Any) -> torch.Tensor:
        """One transformer call returning its first output (the velocity)."""
        return self.transformer(**inputs, return_dict=False)[0]

    def move_components(self, names: tuple[str, ...], device: torch.device | str) -> None:
        """Move the named pipeline components (those present) to ``device``."""
        for name in names:
            module = getattr(self.pipeline, name, None)
            if isinstance(module, torch.nn.Module):
                module.to(device)

    def to(self, device: torch.device | str) -> FlowAdapter:
        self.pipeline.to(device)
        return self


LORA_WEIGHTS_NAME = "pytorch_lora_weights.safetensors"
LORA_CONFIG_NAME = "lora_config.json"


def inject_lora(model: torch.nn.Module, config: Any, adapter_name: str = "default") -> None:
    """Add a peft LoRA to a module that has no diffusers peft mixin: peft's
    ``inject_adapter_in_model``, and ``model.peft_config`` set as diffusers' ``add_adapter`` sets
    it (so ``get_peft_model_state_dict(model)`` and checkpoints work the same way)."""
    from peft import inject_adapter_in_model

    inject_adapter_in_model(config, model, adapter_name=adapter_name)
    if not hasattr(model, "peft_config"):
        model.peft_config = {}
    model.peft_config[adapter_name] = config


def save_peft_lora(directory: str, lora_state_dict: dict[str, torch.Tensor],
                   metadata: dict[str, Any] | None) -> None:
    """Write a peft LoRA state dict (``get_peft_model_state_dict`` keys) as safetensors, with its
    ``LoraConfig`` as JSON beside it: the format of families whose pipeline has no LoRA loader."""
    from safetensors.torch import save_file

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    if metadata is None:
        raise ValueError("a LoRA without its config cannot be loaded back: pass the LoraConfig")
    tensors = {k: v.detach().contiguous().cpu() for k, v in lora_state_dict.items()}
    save_file(tensors, str(folder / LORA_WEIGHTS_NAME))
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in metadata.items()}
    (folder / LORA_CONFIG_NAME).write_text(json.dumps(config, indent=2, default=str))


def load_peft_lora(model: torch.nn.Module, directory: str, adapter_name: str = "default") -> None:
    """Load :func:`save_peft_lora`'s folder into ``model``: inject a LoRA with the stored config
    (peft's ``inject_adapter_in_model``) and set its weights (``set_peft_model_state_dict``)."""
    from peft import LoraConfig, set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = Path(directory)
    weights, config_file = folder / LORA_WEIGHTS_NAME, folder / LORA_CONFIG_NAME
    for file in (weights, config_file):
        if not file.is_file():
            raise FileNotFoundError(f"{file} is missing: not a LoRA folder written by save_lora")
    fields = set(inspect.signature(LoraConfig.__init__).parameters)
    stored = json.loads(config_file.read_text())
    config = LoraConfig(**{k: v for k, v in stored.items() if k in fields})
    state = load_file(str(weights))
    inject_lora(model, config, adapter_name)
    result = set_peft_model_state_dict(model, state, adapter_name=adapter_name)
    unexpected = getattr(result, "unexpected_keys", None) or []
    if unexpected:
        raise ValueError(f"{weights}: {len(unexpected)} LoRA weights match no layer of the model "
                         f"(first: {unexpected[0]})")


class PeftLoraFiles:
    """LoRA files for a family whose pipeline has no LoRA loader: :func:`save_peft_lora` and
    :func:`load_peft_lora` on the adapter's ``transformer``. Listed before the adapter's base
    class, so these replace :class:`FlowAdapter`'s pipeline-loader methods."""

    transformer: torch.nn.Module

    def save_lora(self, directory: str, lora_state_dict: dict[str, torch.Tensor],
                  metadata: dict[str, Any] | None = None) -> None:
        save_peft_lora(directory, lora_state_dict, metadata)

    def load_lora(self, directory: str) -> None:
        load_peft_lora(self.transformer, directory)


def guided_call(
    call: Callable[..., torch.Tensor],
    scale: float,
    inputs: dict[str, torch.Tensor | None],
    negative: dict[str, torch.Tensor],
    **shared: Any,
) -> torch.Tensor:
    """Classifier-free guidance as ONE batched model call.

    With ``scale > 1``, every batch-first tensor of ``inputs`` is doubled as ``[negative;
    positive]`` (the negative's own tensor where ``negative`` has the key, else the same tensor),
    the model runs once, and ``neg + scale * (pos - neg)`` is returned; otherwise the model runs on
    ``inputs`` alone. ``shared`` arguments (position ids, flags) pass through unchanged.
    """
    if scale <= 1.0:
        return call(**inputs, **shared)
    doubled = {k: None if v is None else torch.cat([negative.get(k, v), v])
               for k, v in inputs.items()}
    neg, pos = call(**doubled, **shared).chunk(2)
    return neg + scale * (pos - neg)


def load_pipeline(pipeline_cls: Any, family: str, path_or_id: str | None,
                  torch_dtype: str | torch.dtype, pipeline: Any = None, **kwargs: Any) -> Any:
    """``pipeline`` when given, else ``pipeline_cls.from_pretrained(path_or_id)`` in
    ``torch_dtype`` (a name such as ``"bfloat16"`` or a torch dtype), with the components a local
    folder omits passed as ``None``."""
    if pipeline is not None:
        return pipeline
    if path_or_id is None:
        raise ValueError(f"{family} needs a hub id or a local folder (or a built `pipeline`)")
    dtype = getattr(torch, torch_dtype) if isinstance(torch_dtype, str) else torch_dtype
    kwargs = {**absent_components(pipeline_cls, path_or_id), **kwargs}
    return pipeline_cls.from_pretrained(path_or_id, dtype=dtype, **kwargs)


def absent_components(pipeline_cls: Any, path_or_id: str) -> dict[str, None]:
    """``{name: None}`` for the components a local pipeline folder does not hold.

    diffusers' ``from_pretrained`` refuses a folder whose ``model_index.json`` omits an optional
    component (e.g. SD3 without its T5 encoder) unless it is passed as ``None``; a hub id is left
    to diffusers.
    """
    index = Path(path_or_id) / "model_index.json"
    if not index.is_file():
        return {}
    entries = json.loads(index.read_text())
    present = {k for k, v in entries.items() if not (isinstance(v, list) and v[0] is None)}
    params = inspect.signature(pipeline_cls.__init__).parameters
    # only required arguments need an explicit None; settings with defaults keep them
    required = [n for n, p in params.items()
                if n != "self" and p.default is inspect.Parameter.empty
                and p.kind is not inspect.Parameter.VAR_KEYWORD]
    return {name: None for name in required if name not in present}


FAMILIES: Registry[Callable[..., FlowAdapter]] = Registry("pipeline family")
register = FAMILIES.register


def load(family: str, path_or_id: str, **options: Any) -> FlowAdapter:
    """Load ``path_or_id`` (hub id or local folder) as the adapter of ``family``."""
    return FAMILIES.build(family, path_or_id, **options)


def names() -> list[str]:
    """Registered family names."""
    return FAMILIES.names()
