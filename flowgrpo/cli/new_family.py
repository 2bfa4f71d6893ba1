"""``flowgrpo new-family NAME --pipeline CLASS``: the two files a new model family starts from.

Adding a family is writing one adapter (docs/adapters.md, "Writing a new adapter") and proving
it on a tiny model. This command writes both halves so that the work starts from a test that
runs and fails, each failure naming what to write next:

- ``<out>/<name>_family.py``: the adapter, a :class:`pipelines.FlowAdapter` that loads through
  the diffusers pipeline ``CLASS`` and registers itself as ``NAME`` when imported. Its
  constructor is written (loading, the denoiser, the run options ``CLASS.__call__`` takes);
  each method the contract needs raises ``NotImplementedError`` saying what to return and where
  the pipeline does it (file and line of its source, read here with :mod:`inspect` and
  :mod:`ast`).
- ``<out>/test_<name>_family.py``: the family contract
  (:func:`flowgrpo.testing.check_family_contract`) and the parity of the adapter's Euler rollout
  with ``CLASS(..., output_type="latent")`` on a tiny random pipeline. Its builder
  ``tiny_pipeline`` is pre-filled for the components flowgrpo has small stand-ins for (CLIP and
  T5 encoders and tokenizers, ``AutoencoderKL``, any scheduler); the others, the denoiser first,
  raise ``NotImplementedError`` with their constructor's arguments listed above them.

Both are plug-in files, not package modules: a config uses the family as
``model.family: <out>/<name>_family.py:<Class>``, so nothing in flowgrpo changes until the family
is ready to ship (then it moves to ``pipelines/<name>.py``; docs/adapters.md says how). Nothing
here imports diffusers until the command runs, so ``flowgrpo --help`` stays fast.
"""

from __future__ import annotations

import argparse
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME",
                   help="the family's name (lowercase letters, digits and _), e.g. my_model")
    p.add_argument("--pipeline", required=True, metavar="CLASS",
                   help="the diffusers pipeline class it loads through, e.g. "
                   "StableDiffusion3Pipeline")
    p.add_argument("--out", default=".", metavar="DIR",
                   help="folder of the two files NAME_family.py and test_NAME_family.py "
                   "(default: the current folder; made if missing)")
    p.add_argument("--force", action="store_true", help="overwrite those files if they exist")


def cmd_new_family(args: argparse.Namespace) -> int:
    from flowgrpo import console
    from flowgrpo.cli.new_family_tests import tiny_components_left

    console.apply_to_libraries()  # diffusers is imported to read the pipeline
    adapter, test, facts = new_family(args.name, args.pipeline, args.out, force=args.force)
    console.result(f"wrote {adapter} (family {args.name!r}, class {class_name(args.name)}, "
                   f"loading {facts.name}; to write: {', '.join(STUBS)})")
    left = ", ".join(tiny_components_left(facts)) or "nothing"
    console.result(f"wrote {test} (the family contract and the parity with "
                   f"{facts.name}(..., output_type='latent') on tiny_pipeline(); "
                   f"tiny_pipeline's components to write: {left})")
    console.result(f"next: python -m pytest {test} -q --tb=line  (each failure says what to "
                   "write)")
    scheduler = facts.component("scheduler")
    if scheduler and scheduler.cls and not scheduler.cls.startswith("FlowMatch"):
        console.warn(f"{facts.name}'s scheduler is {scheduler.cls}, not a flow-matching one: "
                     "the adapter must still give sigmas in [0, 1] with x_s = (1 - s) x0 + "
                     "s eps and a velocity (docs/design.md, 'Conventions'); a token model "
                     "subclasses pipelines.DiscreteAdapter instead (docs/adapters.md, 'Discrete "
                     "families')")
    return 0


STUBS = ("encode", "noise", "schedule", "velocity", "decode")
"""The methods of :class:`pipelines.FlowAdapter` a family writes (its abstract methods)."""


def class_name(name: str) -> str:
    """``my_model`` -> ``MyModelAdapter``."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_")) + "Adapter"


def file_names(name: str) -> tuple[str, str]:
    """The adapter's file and its test's, as written into ``--out``."""
    return f"{name}_family.py", f"test_{name}_family.py"


def new_family(name: str, pipeline: str, out: str | Path = ".", *,
               force: bool = False) -> tuple[Path, Path, PipelineFacts]:
    """Write the adapter and the test of family ``name`` over diffusers' ``pipeline`` into
    ``out``; returns both paths and what was read from the pipeline.

    Raises:
        ScaffoldError: a bad or taken name, a class diffusers does not have (with the close
            matches) or that is no pipeline, a file that exists without ``force``.
    """
    from flowgrpo.cli.new_family_adapter import adapter_text
    from flowgrpo.cli.new_family_tests import tests_text

    check_name(name)
    facts = describe(pipeline_class(pipeline))
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise ScaffoldError(f"new-family: --out {folder} is a file; give a folder")
    paths = [folder / n for n in file_names(name)]
    taken = [p for p in paths if p.exists()]
    if taken and not force:
        raise ScaffoldError(f"new-family: {taken[0]} exists; pass --force to overwrite it")
    folder.mkdir(parents=True, exist_ok=True)
    paths[0].write_text(adapter_text(name, facts))
    paths[1].write_text(tests_text(name, facts))
    return paths[0], paths[1], facts


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
