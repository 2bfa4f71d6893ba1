"""The test file ``flowgrpo new-family`` writes (see :mod:`flowgrpo.cli.new_family`).

Its tiny builder builds the components flowgrpo has small stand-ins for (those its own tests use,
``tests/helpers/tiny.py``) and names every other one with its constructor's arguments.
"""

from __future__ import annotations

import inspect
from string import Template
from typing import Any

from flowgrpo.cli.new_family_adapter import comment, docstring, literal
from flowgrpo.cli.new_family_facts import PipelineFacts, class_name, file_names

TINY_SIZES = {"height": 16, "width": 16, "num_frames": 5}
TOKENIZERS = ("CLIPTokenizer", "CLIPTokenizerFast", "T5Tokenizer", "T5TokenizerFast")
CLIP_ENCODERS = ("CLIPTextModel", "CLIPTextModelWithProjection")
T5_ENCODERS = ("T5EncoderModel", "UMT5EncoderModel")



def _signature_comment(obj: Any) -> str:
    """``Class(arg=default, ...)`` of a component's constructor, for the comment above it."""
    try:
        params = inspect.signature(obj.__init__).parameters.values()
    except (TypeError, ValueError, AttributeError):
        return f"{getattr(obj, '__name__', obj)}(...)"
    shown = [p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
             for p in params if p.name != "self" and p.kind not in (p.VAR_KEYWORD,
                                                                    p.VAR_POSITIONAL)]
    return f"{obj.__name__}({', '.join(shown)})"


def _tiny_builder(f: PipelineFacts) -> tuple[str, str, str, list[str]]:
    """(size constants, helpers, ``tiny_pipeline``'s source, the components left to build)."""
    lines, imports, left = [], {"diffusers": {f.name}, "transformers": set()}, []
    used: set[str] = set()
    for i, c in enumerate(f.components):
        if c.setting:
            lines.append(f"    {c.name} = {literal(c.default)}  # the pipeline's default")
        elif c.optional and c.name != f.denoiser:
            lines.append(f"    {c.name} = None  # optional")
        elif c.cls.endswith("Scheduler") and c.package == "diffusers":
            imports["diffusers"].add(c.cls)
            lines.append(f"    # {c.name}: its defaults; set the checkpoint's (shift, ...)")
            lines.append(f"    {c.name} = {c.cls}()")
        elif c.cls in TOKENIZERS:
            used.add("tokenizer")
            lines.append(f"    {c.name} = tiny_tokenizer()")
        elif c.cls in CLIP_ENCODERS:
            used.add("clip")
            imports["transformers"].add(c.cls)
            lines.append(f"    {c.name} = tiny_clip({c.cls}, seed + {i})")
        elif c.cls in T5_ENCODERS:
            used.add("t5")
            imports["transformers"].add(c.cls)
            lines.append(f"    {c.name} = tiny_t5({c.cls}, seed + {i})")
        elif c.cls == "AutoencoderKL":
            used.add("vae")
            lines.append(f"    {c.name} = tiny_autoencoder_kl(seed + {i})")
        else:
            left.append(c.name)
            shown = _signature_comment(c.obj) if c.obj is not None else (
                f"unannotated: see {f.name}.__init__")
            lines.append(comment(f"{c.name}: {shown}", 4))
            lines.append(f"    {c.name} = todo({literal(c.name)}, {literal(c.cls or '?')})")
    helpers = [HELPERS[k] for k in ("vae", "clip", "t5", "tokenizer") if k in used]
    sizes = [SIZES[k] for k in ("vae", "clip", "t5") if k in used]
    left_sizes = ", ".join(s.split("  # ")[1] for s in sizes) or "none"
    head = [f"    from {pkg} import {', '.join(sorted(names))}"
            for pkg, names in imports.items() if names]
    args = "".join(f"        {c.name}={c.name},\n" for c in f.components)
    doc = docstring(
        f"A random ``{f.name}`` a few layers deep, built in code (no download).",
        ["The components flowgrpo has small stand-ins for are built; each other one raises "
         "until written, with its constructor's arguments in the comment above it. Their "
         f"sizes must agree with the stand-ins' ({left_sizes}). flowgrpo's "
         "tests/helpers/tiny*.py builds the shipped families' tiny models."], 4)
    source = (f"def tiny_pipeline(seed: int = 0):\n{doc}\n" + "\n".join(head) + "\n\n"
              "    torch.manual_seed(seed)\n" + "\n".join(lines) +
              f"\n    pipe = {f.name}(\n{args}    )\n"
              "    pipe.set_progress_bar_config(disable=True)\n    return pipe\n")
    return "\n".join(sizes), "\n\n\n".join(helpers), source, left


SIZES = {
    "vae": "LATENT_CHANNELS = 4  # VAE latent channels 4 (2 blocks: 2x downsampling)",
    "clip": "CLIP_DIM = 16  # CLIP width and projection 16 each",
    "t5": "T5_DIM = 32  # T5 width 32",
}

HELPERS = {
    "vae": '''def tiny_autoencoder_kl(seed: int):
    """A 2-block ``AutoencoderKL`` (2x downsampling) with LATENT_CHANNELS channels."""
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    return AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 8), layers_per_block=1, norm_num_groups=4, sample_size=16,
        scaling_factor=1.5, shift_factor=0.1,
    ).eval()''',
    "clip": '''def tiny_clip(cls, seed: int):
    """A 1-layer CLIP text encoder of class ``cls`` over tiny_tokenizer's ids."""
    from transformers import CLIPTextConfig

    torch.manual_seed(seed)
    return cls(CLIPTextConfig(
        vocab_size=200, hidden_size=CLIP_DIM, intermediate_size=2 * CLIP_DIM,
        num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=32,
        projection_dim=CLIP_DIM, bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )).eval()''',
    "t5": '''def tiny_t5(cls, seed: int):
    """A 1-layer T5 (or UMT5) encoder of class ``cls`` over tiny_tokenizer's ids."""
    from transformers import T5Config, UMT5Config

    torch.manual_seed(seed)
    config = UMT5Config if cls.__name__.startswith("UMT5") else T5Config
    return cls(config(
        vocab_size=200, d_model=T5_DIM, d_kv=8, d_ff=2 * T5_DIM, num_layers=1, num_heads=2,
        relative_attention_num_buckets=8, pad_token_id=1, eos_token_id=1,
    )).eval()''',
    "tokenizer": '''def tiny_tokenizer():
    """A character-level CLIP tokenizer built offline (printable ASCII); flowgrpo's own tests
    use it in a pipeline's CLIP and T5 tokenizer slots alike."""
    from transformers import CLIPTokenizer

    chars = [chr(c) for c in range(33, 127)]
    tokens = ["<|startoftext|>", "<|endoftext|>"] + chars + [c + "</w>" for c in chars]
    vocab = {t: i for i, t in enumerate(tokens)}
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=16)''',
}


def tiny_components_left(f: PipelineFacts) -> list[str]:
    """The components of ``f``'s pipeline the tiny builder leaves to write."""
    return _tiny_builder(f)[3]


def tests_text(name: str, f: PipelineFacts) -> str:
    """The test file ``test_<name>_family.py``."""
    adapter_file, test_file = file_names(name)
    sizes, helpers, builder, _ = _tiny_builder(f)
    options = {k: v for k, v in TINY_SIZES.items() if k in f.options}
    guidance = f"\n            {f.guidance_arg}=guidance," if f.guidance_arg else ""
    doc = docstring(
        f"Tests of the ``{name}`` family ({adapter_file} beside this file).",
        [f"Written by ``flowgrpo new-family {name} --pipeline {f.name}``; ``python -m pytest "
         f"{test_file} -q --tb=line`` runs them. Until ``tiny_pipeline`` below and the "
         "adapter's methods are written they fail, each saying what to write and where.",
         "test_family_contract: flowgrpo.testing.check_family_contract (rollouts with the "
         "stochastic samplers, every trained step replayed with ratio 1, one LoRA step, the "
         "checkpoint's LoRA loaded back).",
         "test_euler_rollout_matches_pipeline: with the same noise, steps and guidance, the "
         f"adapter's Euler rollout equals ``{f.name}(..., latents=x, output_type=\"latent\")`` "
         "within TOL."], 0)
    return Template(TEST).substitute(
        doc=doc, family=literal(name), file=adapter_file, cls=class_name(name),
        options=literal(options).replace("'", '"'), pipeline=f.name,
        guidances="[1.0, 4.0]" if f.guidance_arg else "[1.0]", guidance=guidance,
        sizes=sizes + "\n" if sizes else "", helpers=helpers + "\n\n\n" if helpers else "",
        builder=builder)


TEST = '''$doc

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flowgrpo.testing import check_family_contract
from pipelines import FAMILIES

HERE = Path(__file__).resolve().parent
FAMILY = $family
# the family as a config's model.family names it
REFERENCE = f"{HERE / '$file'}:$cls"
OPTIONS = $options  # adapter options on the tiny model
CALL = OPTIONS  # the same settings as $pipeline.__call__ arguments
GUIDANCES = $guidances  # 1: no guidance
PROMPTS = ["a red cube on a table", "two dogs"]
STEPS = 4
TOL = 1e-4  # float32 on the same weights: differences come from summation order only
$sizes

def todo(component: str, cls: str):
    """A component of the tiny pipeline that is still to be built."""
    raise NotImplementedError(
        f"tiny_pipeline ({Path(__file__).name}) does not build {component!r} yet: write it "
        f"({cls}) with a few layers and small widths that take the other components' sizes "
        "(its arguments are in the comment above that line)"
    )


$helpers$builder

@pytest.fixture(scope="module", autouse=True)
def no_loading_bars():
    """Failure reports without the libraries' loading bars in them."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()
    yield
    diffusers_logging.enable_progress_bar()
    transformers_logging.enable_progress_bar()


@pytest.fixture(scope="module")
def family():
    """The adapter class, loaded from its file as a config's ``model.family`` loads it."""
    return FAMILIES.get(REFERENCE)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny pipeline saved as a diffusers folder (safetensors)."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tiny_pipeline().save_pretrained(str(folder))
    return folder


def test_the_file_registers_the_family(family):
    assert FAMILIES.get(FAMILY) is family


def test_family_contract(family, model_dir, tmp_path):
    check_family_contract(FAMILY, model_dir, OPTIONS, tmp_path)


@pytest.mark.parametrize("guidance", GUIDANCES)
def test_euler_rollout_matches_pipeline(family, model_dir, guidance):
    adapter = family(str(model_dir), **OPTIONS)
    adapter.pipeline.set_progress_bar_config(disable=True)
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(1))
    cond = adapter.encode(PROMPTS)
    sigmas = adapter.schedule(STEPS)
    y = x.clone()
    with torch.no_grad():
        for k in range(STEPS):
            v = adapter.velocity(y, sigmas[k].expand(len(PROMPTS)), cond, guidance).float()
            y = y + (sigmas[k + 1] - sigmas[k]) * v
        ref = adapter.pipeline(
            prompt=list(PROMPTS), num_inference_steps=STEPS, latents=x.clone(),$guidance
            output_type="latent", return_dict=False, **CALL,
        )[0].float()
    assert y.shape == ref.shape
    diff = (y - ref).abs().max().item()
    print(f"parity {FAMILY} guidance={guidance}: max abs difference {diff:.3g}")
    assert diff <= TOL, f"guidance {guidance}: max abs difference {diff:.3g} > {TOL}"
    assert (y - x).abs().max() > 1e-2  # the rollout moved
'''
