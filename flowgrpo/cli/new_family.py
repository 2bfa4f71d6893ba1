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
from pathlib import Path

from flowgrpo.cli.new_family_adapter import adapter_text
from flowgrpo.cli.new_family_facts import (
    STUBS,
    PipelineFacts,
    ScaffoldError,
    check_name,
    class_name,
    describe,
    file_names,
    pipeline_class,
)
from flowgrpo.cli.new_family_tests import tests_text, tiny_components_left


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


def new_family(name: str, pipeline: str, out: str | Path = ".", *,
               force: bool = False) -> tuple[Path, Path, PipelineFacts]:
    """Write the adapter and the test of family ``name`` over diffusers' ``pipeline`` into
    ``out``; returns both paths and what was read from the pipeline.

    Raises:
        ScaffoldError: a bad or taken name, a class diffusers does not have (with the close
            matches) or that is no pipeline, a file that exists without ``force``.
    """
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


