"""What ``flowgrpo new-family`` reads from a diffusers pipeline class (its components, the
run options its ``__call__`` takes, where it does each thing the adapter must write), and the
names it gives the files and the class; :mod:`flowgrpo.cli.new_family` writes them out through
the templates of :mod:`flowgrpo.cli.new_family_adapter` and :mod:`flowgrpo.cli.new_family_tests`.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import inspect
import keyword
import re
import textwrap
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowgrpo.errors import FlowgrpoError

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")

# ``__call__`` arguments that are a run's settings, not a prompt's: the adapter takes them as
# options (with the pipeline's defaults) and every rollout uses them.
RUN_OPTIONS = ("height", "width", "num_frames", "audio_duration", "audio_length_in_s",
               "negative_prompt", "max_sequence_length")
OPTION_TYPES = {"height": "int | None", "width": "int | None", "num_frames": "int | None",
                "audio_duration": "float | None", "audio_length_in_s": "float | None",
                "negative_prompt": "str", "max_sequence_length": "int"}
# The calls of ``__call__`` a stub points to: label -> the function names that make them.
SITES = {
    "encode": ("self.encode_prompt",),
    "latents": ("self.prepare_latents",),
    "timesteps": ("retrieve_timesteps", "self.scheduler.set_timesteps"),
    "shift": ("calculate_shift", "compute_empirical_mu"),
    "decode": ("self.vae.decode", "self.vae.tiled_decode"),
    "unpack": ("self._unpack_latents",),
    "step": ("self.scheduler.step",),
}


class ScaffoldError(FlowgrpoError, ValueError):
    """A ``new-family`` argument that cannot be used (one line: the value and the fix)."""

    exit_code = 2


@dataclass
class Component:
    """One argument of the pipeline's constructor."""

    name: str
    cls: str  # the annotated class's name ("" when unannotated)
    package: str  # its top-level package: diffusers, transformers, ...
    optional: bool  # in ``_optional_components`` or defaulting to None
    obj: Any = None  # the annotated class itself
    default: Any = inspect.Parameter.empty

    @property
    def setting(self) -> bool:
        """A config value with a default (Wan's ``expand_timesteps``), not a module."""
        return self.default is not inspect.Parameter.empty and self.default is not None


@dataclass
class Site:
    """A call of the pipeline's ``__call__``: where it is and how it reads."""

    line: int
    code: str


@dataclass
class PipelineFacts:
    """What the scaffold can know about a diffusers pipeline class without building it."""

    cls: type
    source: str  # its file, relative to site-packages (diffusers/pipelines/...)
    version: str
    components: list[Component]
    denoiser: str
    options: dict[str, Any]  # RUN_OPTIONS that ``__call__`` takes, with its defaults
    guidance_arg: str | None
    modality: str
    lora_loader: bool
    call_line: int
    sites: dict[str, Site] = field(default_factory=dict)
    call_text: str = ""

    @property
    def name(self) -> str:
        return self.cls.__name__

    def where(self, line: int) -> str:
        return f"{self.source}:{line}"

    def defined(self, method: str) -> str | None:
        """``file:line`` of the pipeline's ``method`` (``None`` when it has none)."""
        obj = getattr(self.cls, method, None)
        if obj is None:
            return None
        try:
            return f"{_relative(inspect.getsourcefile(obj))}:{inspect.getsourcelines(obj)[1]}"
        except (OSError, TypeError):
            return None

    def component(self, name: str) -> Component | None:
        return next((c for c in self.components if c.name == name), None)


STUBS = ("encode", "noise", "schedule", "velocity", "decode")
"""The methods of :class:`pipelines.FlowAdapter` a family writes (its abstract methods)."""


def class_name(name: str) -> str:
    """``my_model`` -> ``MyModelAdapter``."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_")) + "Adapter"


def file_names(name: str) -> tuple[str, str]:
    """The adapter's file and its test's, as written into ``--out``."""
    return f"{name}_family.py", f"test_{name}_family.py"



def check_name(name: str) -> None:
    """A family name is a lowercase identifier (it names files and a class) that no family
    holds yet (built in, registered, or an installed entry point)."""
    from pipelines import FAMILIES

    if not NAME_PATTERN.fullmatch(name) or keyword.iskeyword(name):
        raise ScaffoldError(f"new-family: NAME {name!r} must be lowercase letters, digits and _ "
                            "starting with a letter (it names the files and the class), e.g. "
                            "my_model")
    if name in FAMILIES:
        raise ScaffoldError(f"new-family: {name!r} is already a pipeline family "
                            f"({FAMILIES.origin(name)}); pick another NAME")


def pipeline_class(name: str) -> type:
    """diffusers' pipeline class ``name``; a one-line error with the close matches otherwise."""
    import diffusers
    from diffusers import DiffusionPipeline
    from diffusers.utils import DummyObject

    pipelines = sorted(n for n in dir(diffusers) if n.endswith("Pipeline"))
    obj = getattr(diffusers, name, None) if name.isidentifier() else None
    if isinstance(obj, type) and issubclass(obj, DiffusionPipeline):
        return obj
    if isinstance(obj, DummyObject):
        missing = [b for b in getattr(obj, "_backends", []) if importlib.util.find_spec(b) is None]
        raise ScaffoldError(f"new-family: diffusers' {name} needs "
                            f"{', '.join(missing) or 'an optional dependency'}, not installed "
                            "here; install it and run again")
    lowered = {n.lower(): n for n in pipelines}
    close = [lowered[n] for n in difflib.get_close_matches(name.lower(), list(lowered), n=3,
                                                           cutoff=0.6)]
    hint = f"; close matches: {', '.join(close)}" if close else (
        "; the pipelines are the names of `diffusers` ending in Pipeline, such as "
        "StableDiffusion3Pipeline")
    what = "is not a pipeline class" if obj is not None else "has no pipeline"
    subject = f"diffusers' {name}" if obj is not None else f"diffusers {diffusers.__version__}"
    suffix = "" if obj is not None else f" {name!r}"
    raise ScaffoldError(f"new-family: {subject} {what}{suffix}{hint}")


def describe(cls: type) -> PipelineFacts:
    """Read ``cls``'s constructor, ``__call__`` and source for what the stubs can tell."""
    import diffusers

    params = inspect.signature(cls.__init__).parameters
    optional = set(getattr(cls, "_optional_components", []) or [])
    components = []
    for pname, param in params.items():
        if pname == "self" or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
            continue
        obj = _annotated_class(param.annotation)
        components.append(Component(pname, _name(obj, param.annotation), _package(obj),
                                    pname in optional or param.default is None, obj,
                                    param.default))
    call = inspect.signature(cls.__call__).parameters
    options = {k: call[k].default for k in RUN_OPTIONS if k in call}
    if options.get("negative_prompt", "") is None:
        options["negative_prompt"] = ""  # what the pipelines encode for None
    guidance = next((g for g in ("guidance_scale", "true_cfg_scale") if g in call), None)
    audio = "audio" in cls.__name__.lower() or any("audio" in k for k in call)
    modality = "video" if "num_frames" in call else "audio" if audio else "image"
    facts = PipelineFacts(
        cls=cls, source=_relative(inspect.getsourcefile(cls)), version=diffusers.__version__,
        components=components, denoiser=_denoiser(components), options=options,
        guidance_arg=guidance, modality=modality,
        lora_loader=hasattr(cls, "save_lora_weights") and hasattr(cls, "load_lora_weights"),
        call_line=0)
    _read_call(facts)
    return facts


def _denoiser(components: list[Component]) -> str:
    """The component LoRA trains: ``transformer`` or ``unet``, else the first diffusers model
    that is neither a VAE nor an encoder."""
    names = [c.name for c in components]
    for name in ("transformer", "unet", "dit", "prior"):
        if name in names:
            return name
    for c in components:
        if c.package == "diffusers" and not re.search(r"vae|encoder|vocoder|scheduler", c.name):
            return c.name
    return "transformer"


def _read_call(facts: PipelineFacts) -> None:
    """The line of ``__call__`` and of the calls of :data:`SITES` and of the denoiser in it."""
    try:
        lines, start = inspect.getsourcelines(facts.cls.__call__)
    except (OSError, TypeError):
        return
    facts.call_line = start
    text = "".join(lines)
    facts.call_text = text
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    wanted = {**SITES, "model": (f"self.{facts.denoiser}",), "timestep": ()}
    found: dict[str, Site] = {}
    for node in sorted(ast.walk(tree), key=lambda n: getattr(n, "lineno", 0)):
        if isinstance(node, ast.Assign) and "timestep" not in found and any(
                isinstance(t, ast.Name) and t.id == "timestep" for t in node.targets):
            code = " ".join(ast.unparse(node).split())
            found["timestep"] = Site(start + node.lineno - 1,
                                     code if len(code) <= 160 else code[:155] + " ...")
        if not isinstance(node, ast.Call):
            continue
        func = _dotted(node.func)
        for label, names in wanted.items():
            if label not in found and func in names:
                parent = parents.get(node)
                code = _call_text(node)
                if isinstance(parent, ast.Assign) and parent.value is node:
                    code = f"{', '.join(ast.unparse(t) for t in parent.targets)} = {code}"
                found[label] = Site(start + node.lineno - 1, code)
    facts.sites = found


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _call_text(node: ast.Call, limit: int = 32) -> str:
    """``func(arg, key=value)`` with each argument over ``limit`` characters shown as ``...``
    (the names of what a call passes are what a stub needs)."""
    def short(arg: ast.AST) -> str:
        text = " ".join(ast.unparse(arg).split())
        return text if len(text) <= limit else "..."

    args = [short(a) for a in node.args]
    args += [f"{k.arg}={short(k.value)}" if k.arg else f"**{short(k.value)}"
             for k in node.keywords]
    return f"{_dotted(node.func)}({', '.join(args)})"


def _annotated_class(annotation: Any) -> type | None:
    """The class of a constructor annotation (a class, or an ``Optional``/``Union`` of them)."""
    if isinstance(annotation, type):
        return annotation
    return next((a for a in typing.get_args(annotation)
                 if isinstance(a, type) and a is not type(None)), None)


def _name(obj: type | None, annotation: Any) -> str:
    """The annotated class's name; a string annotation's last dotted part; "" when none."""
    if obj is not None:
        return obj.__name__
    if isinstance(annotation, str):
        return annotation.replace("Optional[", "").strip("]'\" ").split("|")[0].rsplit(".")[-1]
    return ""


def _package(obj: type | None) -> str:
    return obj.__module__.split(".")[0] if obj is not None else ""


def _relative(path: str | None) -> str:
    """``path`` from its ``site-packages`` (``diffusers/pipelines/...``), else as given."""
    if not path:
        return "?"
    parts = Path(path).parts
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1:])
    return str(path)
