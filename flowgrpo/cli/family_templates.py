"""The text of the two files ``flowgrpo new-family`` writes (see :mod:`flowgrpo.cli.new_family`).

Each stub's docstring quotes what the pipeline's ``__call__`` does at that point (file and line
of its source) and its ``NotImplementedError`` says in one line what to return; the test's tiny
builder builds the components flowgrpo has small stand-ins for (the ones its own tests use,
``tests/helpers/tiny.py``) and names every other one with its constructor's arguments.
"""

from __future__ import annotations

import inspect
import json
import textwrap
from string import Template
from typing import Any

from flowgrpo.cli.new_family import STUBS, PipelineFacts, class_name, file_names

WIDTH = 100
MEDIA = {"image": "images [B, 3, H, W] in [0, 1]", "video": "videos [B, F, 3, H, W] in [0, 1]",
         "audio": "audio [B, C, T] in [-1, 1] (and set sample_rate)"}
TINY_SIZES = {"height": 16, "width": 16, "num_frames": 5}
TOKENIZERS = ("CLIPTokenizer", "CLIPTokenizerFast", "T5Tokenizer", "T5TokenizerFast")
CLIP_ENCODERS = ("CLIPTextModel", "CLIPTextModelWithProjection")
T5_ENCODERS = ("T5EncoderModel", "UMT5EncoderModel")


def literal(value: Any) -> str:
    """Python source of a default value (strings in double quotes, as the project writes them)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def docstring(summary: str, paragraphs: list[str], indent: int) -> str:
    """A triple-quoted docstring at ``indent`` spaces, paragraphs wrapped to :data:`WIDTH`."""
    pad = " " * indent
    text = textwrap.wrap(f'"""{summary}', WIDTH - indent, initial_indent=pad,
                         subsequent_indent=pad, break_on_hyphens=False, break_long_words=False)
    for para in paragraphs:
        text.append("")
        text += textwrap.wrap(para.replace("\\", "\\\\"), WIDTH - indent, initial_indent=pad,
                              subsequent_indent=pad, break_on_hyphens=False,
                              break_long_words=False)
    text.append(f'{pad}"""' if paragraphs else "")
    return "\n".join(text) if paragraphs else "\n".join(text) + '"""'


def raise_stub(message: str, indent: int) -> str:
    """``raise NotImplementedError("...")`` with ``message`` cut into string pieces."""
    pad = " " * indent
    lines = textwrap.wrap(message, WIDTH - indent - 7, break_on_hyphens=False,
                          break_long_words=False)
    pieces = [json.dumps(line + (" " if i < len(lines) - 1 else "")) for i, line in
              enumerate(lines)]
    return f"{pad}raise NotImplementedError(\n" + "".join(
        f"{pad}    {p}\n" for p in pieces) + f"{pad})"


def comment(text: str, indent: int) -> str:
    pad = " " * indent
    return "\n".join(textwrap.wrap(text, WIDTH - indent, initial_indent=f"{pad}# ",
                                   subsequent_indent=f"{pad}# ", break_on_hyphens=False,
                                   break_long_words=False))


def _brief(location: str) -> str:
    """``diffusers/pipelines/x/pipeline_x.py:12`` -> ``pipeline_x.py:12``."""
    return location.rsplit("/", 1)[-1]


def _site(f: PipelineFacts, label: str, what: str) -> str | None:
    site = f.sites.get(label)
    if site is None:
        return None
    return f"{f.name}.__call__ {what} at {f.where(site.line)}: ``{site.code}``."


def _stub_texts(name: str, f: PipelineFacts) -> dict[str, tuple[str, list[str], str]]:
    """method -> (docstring summary, paragraphs, NotImplementedError message)."""
    full = f.where(f.call_line) if f.call_line else f.source
    # messages cite the file's name (the docstrings hold its path)
    call = _brief(f.where(f.call_line) if f.call_line else f.source)
    at = {label: _brief(f.where(s.line)) for label, s in f.sites.items()}
    scheduler = f.component("scheduler")
    sched = scheduler.cls if scheduler and scheduler.cls else "its scheduler"
    flow = sched.startswith("FlowMatch")
    encode_def = f.defined("encode_prompt")
    latents_def = f.defined("prepare_latents")
    cfg = "do_classifier_free_guidance" in f.call_text
    out: dict[str, tuple[str, list[str], str]] = {}

    encode = [_site(f, "encode", "encodes the prompt")
              or f"Find where {f.name}.__call__ ({full}) turns the prompt into embeddings."]
    if encode_def:
        encode.append(f"``encode_prompt`` is defined at {encode_def}.")
    encode.append("Make the same call under no_grad (``device=self.device``; with "
                  "``negative_prompt=[self.negative_prompt] * len(prompts)`` when the family "
                  "does CFG) and keep every tensor it returns, batch first; the negatives go "
                  "under ``neg_*`` keys so that ``Cond.index`` cuts out any sub-batch. Set "
                  "``per_prompt_encoding = False`` on the class if a prompt's encoding depends on "
                  "the other prompts of its call (padding to the longest, attended to).")
    out["encode"] = (
        "Text (and negative) embeddings of ``prompts``: every tensor batch first.", encode,
        f"{name}.encode is not written: return a Cond of the embeddings {f.name} computes "
        f"({'encode_prompt, ' + _brief(encode_def) if encode_def else call}"
        f"{'; __call__ runs it at ' + at['encode'] if 'encode' in at else ''}), batch first, "
        "the negatives as neg_* keys")

    noise = [_site(f, "latents", "draws its initial latents")
             or f"Find where {f.name}.__call__ ({full}) draws its initial latents."]
    if latents_def:
        noise.append(f"``prepare_latents`` is defined at {latents_def}.")
    noise.append("Draw them the same way (``diffusers.utils.torch_utils.randn_tensor``, the "
                 "shape in the same order, the generator given), float32 on ``self.device``: "
                 "then one generator gives the adapter and the pipeline the same start.")
    if hasattr(f.cls, "_pack_latents"):
        noise.append(f"The pipeline packs its latents ({f.defined('_pack_latents')}): draw the "
                     "unpacked grid and pack it as ``prepare_latents`` does; the adapter's "
                     "latents are what the pipeline's ``latents`` argument takes.")
    out["noise"] = (
        "Initial latents at sigma = 1, float32 on :attr:`device`.", noise,
        f"{name}.noise is not written: return float32 latents [n, ...] at sigma = 1 on "
        f"self.device, drawn as {f.name} draws them "
        f"({'prepare_latents, ' + _brief(latents_def) if latents_def else call})")

    schedule = [f"The scheduler is ``{sched}``" + (
        ": its ``sigmas`` after ``set_timesteps`` are flowgrpo's sigmas." if flow else
        ", not a flow-matching one: the adapter must still give sigmas in [0, 1] with "
        "``x_s = (1 - s) x0 + s eps`` (docs/design.md, Conventions).")]
    shift = _site(f, "shift", "computes a dynamic shift (when its scheduler uses one)")
    schedule += [s for s in (_site(f, "timesteps", "sets its steps"), shift) if s]
    schedule.append("Make the same call on ``self.pipeline.scheduler`` (``set_timesteps("
                    "num_steps, device=\"cpu\", ...)`` with the same ``sigmas``/``mu`` the "
                    "pipeline passes) and return ``scheduler.sigmas`` as float32 on the CPU: "
                    "``num_steps + 1`` values falling to exactly 0.")
    out["schedule"] = (
        "Descending float32 sigmas ``[num_steps + 1]`` with the model's shift, last = 0.",
        schedule,
        f"{name}.schedule is not written: return the float32 sigmas [num_steps + 1], last 0, "
        f"that {f.name} steps through, from self.pipeline.scheduler as __call__ sets it "
        f"({at.get('timesteps', call)})")

    velocity = [_site(f, "model", "calls the model")
                or f"Find where {f.name}.__call__ ({full}) calls ``{f.denoiser}``."]
    timestep = _site(f, "timestep", "makes its timestep")
    if timestep:
        velocity.append(timestep + (" FlowMatch schedulers' timesteps are "
                                    "``sigma * num_train_timesteps``." if flow else ""))
    if cfg:
        velocity.append(f"CFG: the pipeline runs the model on the doubled batch when "
                        f"``{f.guidance_arg or 'guidance'} > 1`` and mixes "
                        "``uncond + g (cond - uncond)``: do it in one call with "
                        "``pipelines.base.guided_call(self._model, guidance, inputs, "
                        "negatives)`` (``self._model`` calls ``self.transformer`` and returns "
                        "its first output).")
    if "guidance_embeds" in f.call_text:
        velocity.append("The model may take a guidance embedding (``guidance_embeds``): pass "
                        "``guidance`` through it as the pipeline does.")
    velocity.append("Convert ``sigma`` [B] to the model's units exactly as the pipeline does "
                    "(any dtype cast included), call ``self.transformer`` (the attribute: "
                    "training swaps in the reference model there) and return ``v ~ eps - x0`` "
                    "shaped like ``x`` (negate it for a model that predicts ``x0 - eps``). "
                    "Nothing may carry over between calls.")
    out["velocity"] = (
        "The model's velocity ``v ~ eps - x0`` at ``(x, sigma)``, shaped like ``x``.", velocity,
        f"{name}.velocity is not written: return v ~ eps - x0 from one self.transformer call "
        f"as {f.name}.__call__ makes it ({at.get('model', call)}), sigma [B] converted to its "
        "timestep units, CFG as one batched call (pipelines.base.guided_call)")

    decode = [_site(f, "decode", "decodes") or f"Find where {f.name}.__call__ ({full}) decodes."]
    decode.append("Undo the latent scaling first as the lines before it do "
                  "(``vae.config.scaling_factor``, ``shift_factor``)"
                  + (f" and unpack ({at['unpack']})" if "unpack" in at else "")
                  + f"; return {MEDIA[f.modality]}, float32.")
    out["decode"] = (
        "Latents at sigma = 0 to media.", decode,
        f"{name}.decode is not written: return {MEDIA[f.modality]} from latents at sigma = 0 as "
        f"{f.name}.__call__ decodes them ({at.get('decode', call)})")
    return out


SIGNATURES = {
    "encode": ("@torch.no_grad()", "def encode(self, prompts: list[str]) -> Cond:"),
    "noise": ("", "def noise(self, n: int, generator: torch.Generator | None = None) "
              "-> torch.Tensor:"),
    "schedule": ("", "def schedule(self, num_steps: int) -> torch.Tensor:"),
    "velocity": ("", "def velocity(\n        self, x: torch.Tensor, sigma: torch.Tensor, "
                 "cond: Cond, guidance: float\n    ) -> torch.Tensor:"),
    "decode": ("@torch.no_grad()", "def decode(self, x: torch.Tensor) -> torch.Tensor:"),
}


def _init(name: str, f: PipelineFacts) -> str:
    params = [f"{k}: {_option_type(k)} = {literal(v)}" for k, v in f.options.items()]
    params += ['torch_dtype: str | torch.dtype = "float32"', "pipeline: Any = None",
               "**from_pretrained_kwargs: Any"]
    head = "    def __init__(\n        self,\n        path_or_id: str | None = None,\n        *,\n"
    head += "".join(f"        {p},\n" for p in params) + "    ) -> None:\n"
    body = [f"        from diffusers import {f.name}", "",
            "        pipeline = load_pipeline(",
            f"            {f.name}, {literal(name)}, path_or_id, torch_dtype, pipeline,",
            "            **from_pretrained_kwargs,",
            "        )",
            "        self.pipeline = pipeline",
            f"        self.transformer = pipeline.{f.denoiser}  # what LoRA wraps and training "
            "updates"]
    if f.options:
        body.append(comment(f"The run's settings, as {f.name}.__call__ takes them: validate "
                            "them here (sizes the VAE and the patching divide, ...) with a "
                            "one-line ValueError naming the option and the fix.", 8))
        body += [f"        self.{k} = {k}" for k in f.options]
    return head + "\n".join(body) + "\n"


def _option_type(option: str) -> str:
    from flowgrpo.cli.new_family import OPTION_TYPES

    return OPTION_TYPES[option]


def adapter_source(name: str, f: PipelineFacts) -> str:
    """The adapter file ``<name>_family.py``."""
    cls = class_name(name)
    adapter_file, test_file = file_names(name)
    parts = ", ".join(f"{c.name} ({c.cls or '?'}{', optional' if c.optional else ''})"
                      for c in f.components if not c.setting)
    base = "FlowAdapter" if f.lora_loader else "PeftLoraFiles, FlowAdapter"
    base_import = "load_pipeline" if f.lora_loader else "PeftLoraFiles, load_pipeline"
    encoders = tuple(c.name for c in f.components if c.name.startswith("text_encoder"))
    attrs = [f'    modality = "{f.modality}"',
             f'    pipeline_classes = ("{f.name}",)',
             comment(f"peft module-name suffixes of the layers LoRA trains: check them "
                     f"against print(pipeline.{f.denoiser})", 4),
             '    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")']
    if encoders and encoders != ("text_encoder", "text_encoder_2", "text_encoder_3"):
        attrs.append(f"    text_encoder_names = {encoders!r}".replace("'", '"'))
    if f.modality == "audio":
        attrs.append("    sample_rate: int | None = None  # samples per second of decode's output")
    lora = ("LoRA files: inherited (the pipeline's save_lora_weights / load_lora_weights)."
            if f.lora_loader else "LoRA files: the pipeline has no LoRA loader, so they are "
            "peft's (PeftLoraFiles).")
    doc = docstring(
        f"The ``{name}`` family: diffusers' ``{f.name}`` in flowgrpo's conventions.",
        [f"Written by ``flowgrpo new-family {name} --pipeline {f.name}`` from diffusers "
         f"{f.version} ({f.source}). Each method that raises NotImplementedError is yours to "
         "write; its docstring says what the pipeline does there, file and line. The recipe is "
         "docs/adapters.md, \"Writing a new adapter\"; " + test_file + " beside this file runs "
         "the family contract and the parity with the pipeline on a tiny model.",
         f"A config uses it as ``model.family: path/to/{adapter_file}:{cls}`` (or as "
         f"``{name}`` once this file is imported: it registers itself). To ship it with "
         f"flowgrpo, move it to ``pipelines/{name}.py``, replace the FAMILIES.add line with "
         f"``@register(\"{name}\")`` and import it in ``pipelines/__init__.py``.",
         f"Pipeline components: {parts}.", lora], 0)
    options = ", ".join(f.options) or "none"
    cls_doc = docstring(
        f"Adapter for a diffusers ``{f.name}`` folder or hub id.",
        [f"Options: {options}, ``torch_dtype``, and ``pipeline`` (an already built "
         f"``{f.name}``); the rest goes to ``from_pretrained``."], 4)
    stubs = _stub_texts(name, f)
    methods = []
    for method in STUBS:
        summary, paragraphs, message = stubs[method]
        decorator, signature = SIGNATURES[method]
        text = (f"    {decorator}\n" if decorator else "") + f"    {signature}\n"
        text += docstring(summary, [p for p in paragraphs if p], 8) + "\n"
        methods.append(text + raise_stub(message, 8) + "\n")
    return Template(ADAPTER).substitute(
        doc=doc, cls=cls, base=base, base_import=base_import, cls_doc=cls_doc,
        attrs="\n".join(attrs), init=_init(name, f), methods="\n".join(methods),
        name=literal(name))


ADAPTER = '''$doc

from __future__ import annotations

from typing import Any

import torch

from pipelines import FAMILIES, Cond, FlowAdapter
from pipelines.base import $base_import


class $cls($base):
$cls_doc

$attrs

$init
$methods

# the family's name once this file is imported
FAMILIES.add($cls, $name)
'''


# ----------------------------------------------------------------------- the test file


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


def test_source(name: str, f: PipelineFacts) -> str:
    """The test file ``test_<name>_family.py``."""
    adapter_file, test_file = file_names(name)
    sizes, helpers, builder, _ = _tiny_builder(f)
    options = {k: v for k, v in TINY_SIZES.items() if k in f.options}
    guidance = f"\n            {f.guidance_arg}=guidance," if f.guidance_arg else ""
    doc = docstring(
        f"Tests of the ``{name}`` family ({adapter_file} beside this file).",
        [f"Written by ``flowgrpo new-family {name} --pipeline {f.name}``; ``python -m pytest "
         f"{test_file} -q`` runs them. Until ``tiny_pipeline`` below and the adapter's methods "
         "are written they fail, each saying what to write and where.",
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
        f"tiny_pipeline ({Path(__file__).name}) does not build {component!r} yet: write it, "
        f"a {cls} with a few layers and small widths that takes the other components' sizes "
        "(its arguments are in the comment above that line)"
    )


$helpers$builder

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
