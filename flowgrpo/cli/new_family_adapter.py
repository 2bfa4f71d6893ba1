"""The adapter file ``flowgrpo new-family`` writes (see :mod:`flowgrpo.cli.new_family`), and the
helpers that write Python source within 100 columns.

Each stub's docstring quotes what the pipeline's ``__call__`` does at that point (file and line
of its source) and its ``NotImplementedError`` says in one line what to return.
"""

from __future__ import annotations

import json
import textwrap
from string import Template
from typing import Any

from flowgrpo.cli.new_family_facts import OPTION_TYPES, STUBS, PipelineFacts, class_name, file_names

WIDTH = 100
MEDIA = {"image": "images [B, 3, H, W] in [0, 1]", "video": "videos [B, F, 3, H, W] in [0, 1]",
         "audio": "audio [B, C, T] in [-1, 1] (and set sample_rate)"}


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
    params = [f"{k}: {OPTION_TYPES[k]} = {literal(v)}" for k, v in f.options.items()]
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


def adapter_text(name: str, f: PipelineFacts) -> str:
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
