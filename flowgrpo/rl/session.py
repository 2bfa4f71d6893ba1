"""The model session: what the algorithm pieces may do with the model, without the trainer.

Credit schemes, views, objectives (through :class:`~flowgrpo.rl.objectives.Policy`) and the
evaluator run extra model calls: they encode prompts, decode latents, read the sampling schedule
and wrap calls in autocast. :class:`ModelSession` is the one object that owns those, so a piece
receives it instead of reaching into the training loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from flowgrpo import distributed as engines
from flowgrpo.distributed import unwrap
from flowgrpo.rl.reference import lora_state_dict
from pipelines import FlowAdapter

Score = Callable[[torch.Tensor, list[str], list[dict]], Any]
"""A synchronous reward call: ``score(decoded media, prompts, metadata) -> RewardOutput``."""


def autocast_factory(mixed_precision: str, device: torch.device):
    """A zero-argument context factory: autocast in bf16/fp16, or nothing."""
    if mixed_precision == "fp32":
        return nullcontext
    dtype = torch.bfloat16 if mixed_precision == "bf16" else torch.float16
    return lambda: torch.autocast(device.type, dtype=dtype)


class ModelSession:
    """The adapter of a run with its prompt-encoding cache, offloading, autocast, decoding and
    schedule.

    Args:
        adapter: the model family adapter (its transformer is the trained policy).
        device: where the model runs (the offloaded components come back here).
        mixed_precision: ``fp32``, ``bf16`` or ``fp16`` (``model.mixed_precision``).
        guidance: the CFG scale of rollouts (``model.guidance``).
        num_steps: sampling steps of a rollout (``sampler.num_steps``): :meth:`schedule`.
        offload_encoders: keep the text encoders and the VAE on the CPU outside their calls
            (``model.offload_encoders``).
        cache_prompt_embeds: keep prompt encodings across calls (``model.cache_prompt_embeds``).
        params: the trainable parameters (what a checkpoint saves by name).
    """

    def __init__(self, adapter: FlowAdapter, device: torch.device, *,
                 mixed_precision: str = "fp32", guidance: float = 1.0, num_steps: int = 1,
                 offload_encoders: bool = False, cache_prompt_embeds: bool = False,
                 params: list | None = None) -> None:
        self.adapter, self.device = adapter, torch.device(device)
        self.autocast: Callable = autocast_factory(mixed_precision, self.device)
        self.guidance, self.num_steps = guidance, num_steps
        self.offload_encoders, self.cache_prompt_embeds = offload_encoders, cache_prompt_embeds
        self.params = list(params or [])
        self._cond_cache: dict[tuple, object] = {}  # (prompt, *condition values) -> Cond
        self._held: set[str] = set()  # offloaded components on the device now

    def schedule(self) -> torch.Tensor:
        """The sigmas of a rollout's full schedule."""
        return self.adapter.schedule(self.num_steps)

    def encode(self, prompts: list[str], metadata: list[dict] | None = None,
               cache: bool = True):
        """Encode each distinct input once and expand to the batch.

        An input is a prompt, plus the metadata values the family's encoding depends on
        (``adapter.condition_keys``, e.g. an edit's source image). When the family allows it
        (``per_prompt_encoding``), each input is encoded on its own, so its encoding does not
        depend on which inputs share the call: a resumed run and a run on more processes see the
        same numbers. The encodings are cached across calls when the session keeps them
        (``cache_prompt_embeds``) and ``cache`` is True (generated captions pass False)."""
        from pipelines import Cond

        keys = self.adapter.condition_keys
        metadata = metadata if metadata is not None else [{} for _ in prompts]
        inputs = [(p, *(repr(m.get(k)) for k in keys)) for p, m in zip(prompts, metadata)]
        first = {}
        for i, key in enumerate(inputs):
            first.setdefault(key, i)
        if not self.adapter.per_prompt_encoding:  # one call, so every row shares its padding
            unique = sorted(first)
            with self.offloaded(self.adapter.text_encoder_names):
                enc = self.adapter.encode_inputs([prompts[first[k]] for k in unique],
                                                 [metadata[first[k]] for k in unique])
            return enc.index([unique.index(k) for k in inputs])
        todo = sorted(k for k in first if k not in self._cond_cache)
        if todo:
            with self.offloaded(self.adapter.text_encoder_names):
                for k in todo:
                    i = first[k]
                    self._cond_cache[k] = self.adapter.encode_inputs([prompts[i]], [metadata[i]])
        cond = Cond.cat([self._cond_cache[k] for k in inputs])
        if not (self.cache_prompt_embeds and cache):
            self._cond_cache.clear()
        return cond

    @contextmanager
    def offloaded(self, names: tuple[str, ...]) -> Iterator[None]:
        """With ``offload_encoders``, the named components sit on the device only inside the
        block and wait on the CPU otherwise; a block inside another that holds them moves
        nothing."""
        names = tuple(n for n in names if n not in self._held) if self.offload_encoders else ()
        if not names:
            yield
            return
        self.adapter.move_components(names, self.device)
        self._held.update(names)
        try:
            yield
        finally:
            self._held.difference_update(names)
            self.adapter.move_components(names, "cpu")

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Decoded media of final latents (the VAE on the device for the call)."""
        with self.offloaded(("vae",)):
            return self.adapter.decode(latents)

    # ----------------------------------------------------------------- checkpoint state
    def state_dict(self, lora: bool, full_model: bool) -> dict:
        """Whole CPU tensors of the weights a checkpoint holds: ``trainable`` (by parameter
        name), ``lora`` (diffusers' layout, with ``lora``) and ``model`` (every weight, with
        ``full_model``: a sharded full fine-tuning). Under FSDP2 this is a collective."""
        model = unwrap(self.adapter.transformer)
        return {
            "trainable": dict(zip(self.trainable_names(),
                                  (engines.full_tensor(p) for p in self.params))),
            "lora": engines.full_tensors(lora_state_dict(self.adapter)) if lora else None,
            "model": engines.full_state_dict(model) if full_model else None,
        }

    def load_state_dict(self, trainable: dict[str, torch.Tensor]) -> None:
        """Restore the trainable weights by name (a sharded parameter keeps its own shard).

        Raises:
            ValueError: one line naming the first missing or mis-shaped weight.
        """
        names = self.trainable_names()
        missing = [n for n in names if n not in trainable]
        if missing:
            raise ValueError(f"it has no {missing[0]} ({len(missing)} trainable weights "
                             "missing)")
        for name, p in zip(names, self.params):
            if trainable[name].shape != p.shape:
                raise ValueError(f"{name} is {tuple(trainable[name].shape)} there and "
                                 f"{tuple(p.shape)} here")
        for name, p in zip(names, self.params):
            engines.copy_full_(p, trainable[name])

    def trainable_names(self) -> list[str]:
        model = unwrap(self.adapter.transformer)
        return [n for n, p in model.named_parameters() if p.requires_grad]
