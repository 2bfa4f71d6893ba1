"""The tiny pipeline of every family built in code, wrapped in its adapter, and the two
references the family tests compare an adapter with: an Euler rollout over the adapter's own
schedule and the diffusers pipeline's ``output_type="latent"`` result.

:data:`CASES` holds one case per family (the family tests, the family contract, the recipes);
:data:`VARIANT_CASES` holds other variants of a family's tiny model (Wan2.2 TI2V-5B and A14B,
HunyuanVideo, Qwen-Image at their own sizes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

import pipelines
from helpers.tiny import tiny_sd3_pipeline
from helpers.tiny_amused import tiny_amused_pipeline
from helpers.tiny_discrete import tiny_digits_discrete_pipeline
from helpers.tiny_editing import tiny_flux_kontext_pipeline
from helpers.tiny_families import (
    tiny_ace_step_pipeline,
    tiny_flux_pipeline,
    tiny_longcat_tts_pipeline,
    tiny_wan_pipeline,
)
from helpers.tiny_ltx import tiny_ltx_pipeline
from helpers.tiny_ltx2 import LTX2_CALL, LTX2_SIZE, tiny_ltx2_pipeline
from helpers.tiny_qwen_image_edit import QWEN_EDIT, QWEN_EDIT_PLUS, tiny_qwen_image_edit_pipeline
from helpers.tiny_video import (
    HUNYUAN_TEMPLATE,
    tiny_hunyuan_video_pipeline,
    tiny_qwen_image_pipeline,
    tiny_wan22_a14b_pipeline,
    tiny_wan22_ti2v_pipeline,
)
from helpers.tiny_vq_diffusion import tiny_vq_diffusion_pipeline
from helpers.tiny_wan_i2v import WAN_I2V, WAN_I2V_CALL, tiny_wan_i2v_pipeline
from helpers.tiny_z_image import Z_IMAGE, tiny_z_image_pipeline
from pipelines import (
    AceStepAdapter,
    FluxAdapter,
    HunyuanVideoAdapter,
    LongCatTTSAdapter,
    QwenImageAdapter,
    WanAdapter,
)
from pipelines.amused import AmusedAdapter
from pipelines.digits_discrete import DigitsDiscreteAdapter
from pipelines.flux_kontext import FluxKontextAdapter
from pipelines.ltx import LTXAdapter
from pipelines.ltx2 import LTX2Adapter
from pipelines.qwen_image_edit import QwenImageEditAdapter, QwenImageEditPlusAdapter
from pipelines.sd3 import SD3Adapter
from pipelines.vq_diffusion import VQDiffusionAdapter
from pipelines.wan_i2v import WanI2VAdapter
from pipelines.z_image import ZImageAdapter

PROMPTS = ["a red cube on a table", "two dogs"]
STEPS = 5


@dataclass
class Case:
    """One family on its tiny pipeline: how to build the adapter and call the pipeline alike."""

    build: Callable[..., Any]
    adapter: Callable[..., pipelines.FlowAdapter]
    options: dict[str, Any] = field(default_factory=dict)  # adapter options
    call: dict[str, Any] = field(default_factory=dict)  # matching pipeline __call__ arguments
    output: str = "images"  # the pipeline output's field

    def make(self, build: dict | None = None, **options: Any) -> pipelines.FlowAdapter:
        """A fresh tiny pipeline (same weights every call) wrapped in the adapter."""
        pipe = self.build(seed=0, **(build or {}))
        pipe.set_progress_bar_config(disable=True)
        return self.adapter(pipeline=pipe, **{**self.options, **options})


CASES = {
    "sd3": Case(tiny_sd3_pipeline, SD3Adapter, call=dict(height=16, width=16)),
    "flux": Case(
        tiny_flux_pipeline, FluxAdapter, dict(height=16, width=16, max_sequence_length=16),
        dict(height=16, width=16, max_sequence_length=16),
    ),
    "wan": Case(
        tiny_wan_pipeline, WanAdapter,
        dict(height=16, width=16, num_frames=5, max_sequence_length=16),
        dict(height=16, width=16, num_frames=5, max_sequence_length=16), output="frames",
    ),
    "ace_step": Case(
        tiny_ace_step_pipeline, AceStepAdapter, dict(audio_duration=4.0, shift=3.0),
        dict(audio_duration=4.0, shift=3.0, lyrics=[""] * len(PROMPTS)), output="audios",
    ),
    "longcat_tts": Case(  # 0.1 s at 1 kHz -> 12 latent frames; latents set the pipeline's length
        tiny_longcat_tts_pipeline, LongCatTTSAdapter, dict(audio_duration=0.1), output="audios",
    ),
    "hunyuan_video": Case(
        tiny_hunyuan_video_pipeline, HunyuanVideoAdapter,
        dict(height=16, width=16, num_frames=5, max_sequence_length=24,
             prompt_template=HUNYUAN_TEMPLATE),
        dict(height=16, width=16, num_frames=5, max_sequence_length=24,
             prompt_template=HUNYUAN_TEMPLATE),
        output="frames",
    ),
    "flux_kontext": Case(  # its text-to-image path; edits: tests/families/test_families_editing.py
        tiny_flux_kontext_pipeline, FluxKontextAdapter,
        dict(height=16, width=16, max_sequence_length=16),
        dict(height=16, width=16, max_sequence_length=16, max_area=256),
    ),
    "qwen_image": Case(tiny_qwen_image_pipeline, QwenImageAdapter, dict(height=32, width=32),
                       dict(height=32, width=32)),
    # a discrete family: tokens, rolled out by the contract with the discrete samplers
    "digits_discrete": Case(tiny_digits_discrete_pipeline, DigitsDiscreteAdapter),
    # rolled out with its own sampler; parity with its pipeline: tests/families/test_vq_diffusion.py
    "vq_diffusion": Case(tiny_vq_diffusion_pipeline, VQDiffusionAdapter),
    # masked tokens rolled out with ctmc; parity with its pipeline: tests/families/test_amused.py
    "amused": Case(tiny_amused_pipeline, AmusedAdapter),
    # Wan2.1 I2V animating one shipped first frame; Wan2.2 variants: tests/families/test_wan_i2v.py
    "wan_i2v": Case(tiny_wan_i2v_pipeline, WanI2VAdapter, WAN_I2V, WAN_I2V_CALL, output="frames"),
    # LTX-Video; parity with and without CFG and guidance rescale: tests/families/test_ltx.py
    "ltx": Case(tiny_ltx_pipeline, LTXAdapter,
                dict(height=32, width=64, num_frames=5, max_sequence_length=16),
                dict(height=32, width=64, num_frames=5, max_sequence_length=16), output="frames"),
    # every sample edits one shipped source; parity with its pipelines: test_qwen_image_edit.py
    "qwen_image_edit": Case(tiny_qwen_image_edit_pipeline, QwenImageEditAdapter, QWEN_EDIT,
                            dict(height=32, width=32)),
    "qwen_image_edit_plus": Case(partial(tiny_qwen_image_edit_pipeline, plus=True),
                                 QwenImageEditPlusAdapter, QWEN_EDIT_PLUS,
                                 dict(height=32, width=32)),
    # its guidance is the pipeline's guidance_scale + 1; parity: tests/families/test_z_image.py
    "z_image": Case(tiny_z_image_pipeline, ZImageAdapter, Z_IMAGE, Z_IMAGE),
    # LTX-2 video + audio in one flat latent; parity of both parts: tests/families/test_ltx2.py
    "ltx2": Case(tiny_ltx2_pipeline, LTX2Adapter, LTX2_SIZE, LTX2_CALL, output="frames"),
}


def euler_rollout(adapter: pipelines.FlowAdapter, x: torch.Tensor, guidance: float,
                  steps: int = STEPS, prompts: list[str] = PROMPTS) -> torch.Tensor:
    """The Euler ODE ``x <- x + (s' - s) v`` over the adapter's schedule, in float32."""
    cond = adapter.encode(prompts)
    sigmas = adapter.schedule(steps)
    y = x.clone()
    with torch.no_grad():
        for k in range(steps):
            v = adapter.velocity(y, sigmas[k].expand(y.shape[0]), cond, guidance).float()
            y = y + (sigmas[k + 1] - sigmas[k]) * v
    return y


def pipeline_latents(case: Case, adapter: pipelines.FlowAdapter, x: torch.Tensor,
                     guidance: float, **extra: Any) -> torch.Tensor:
    """The pipeline's own denoising loop from the latents ``x``, as latents."""
    out = adapter.pipeline(
        prompt=list(PROMPTS), num_inference_steps=STEPS, guidance_scale=guidance,
        latents=x.clone(), output_type="latent", **case.call, **extra,
    )
    return getattr(out, case.output)


WAN22_TI2V = dict(height=32, width=64, num_frames=5, max_sequence_length=16)
WAN22_A14B = dict(height=16, width=16, num_frames=5, max_sequence_length=16)
HUNYUAN = dict(height=16, width=16, num_frames=5, max_sequence_length=24,
               prompt_template=HUNYUAN_TEMPLATE)
QWEN = dict(height=32, width=32)

VARIANT_CASES = {  # name: (family, case)
    "wan22_ti2v": ("wan", Case(tiny_wan22_ti2v_pipeline, WanAdapter, WAN22_TI2V, WAN22_TI2V,
                               output="frames")),
    "wan22_a14b": ("wan", Case(tiny_wan22_a14b_pipeline, WanAdapter, WAN22_A14B, WAN22_A14B,
                               output="frames")),
    "hunyuan_video": ("hunyuan_video", Case(tiny_hunyuan_video_pipeline, HunyuanVideoAdapter,
                                            HUNYUAN, HUNYUAN, output="frames")),
    "qwen_image": ("qwen_image", Case(tiny_qwen_image_pipeline, QwenImageAdapter, QWEN, QWEN)),
}
