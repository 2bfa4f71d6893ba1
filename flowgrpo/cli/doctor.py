"""``flowgrpo doctor``: the facts a bug report needs, short enough to paste.

Versions (Python, torch, diffusers, transformers, accelerate, peft), the device with its threads
and memory, the optional extras installed, the Hugging Face cache and whether the hub can be
reached (and, given a config, whether its model is cached), and the plug-ins with their origins.
Nothing is downloaded; the hub probe is one TCP connection with a short timeout, skipped when
``HF_HUB_OFFLINE`` is set.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import sys
from pathlib import Path

LIBRARIES = ("torch", "diffusers", "transformers", "accelerate", "peft")

EXTRAS = {
    # extra: [(what, distribution or module, how to check)]
    "ocr": [("rapidocr-onnxruntime", "rapidocr_onnxruntime")],
    "wandb": [("wandb", "wandb")],
    "speech": [("pocketsphinx", "pocketsphinx"), ("resemblyzer weights", "resemblyzer")],
    "f5_tts": [("f5-tts", "f5_tts")],
}
"""The optional extras (``pip install flowgrpo[<extra>]``; f5_tts: ``scripts/install_f5_tts.sh``)
and the packages each needs."""


def version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or ``None``."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _installed(label: str, module: str) -> str | None:
    """``"<label> <version>"`` when ``module`` can be imported (found, not imported), else None.
    The speaker encoder's weights count only when the file is there."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    if label == "resemblyzer weights":
        folder = Path(next(iter(spec.submodule_search_locations or []), ""))
        return label if (folder / "pretrained.pt").is_file() else None
    found = version(label) or version(module)
    return f"{label} {found}" if found else label


def extras() -> dict[str, tuple[bool, list[str]]]:
    """``{extra: (complete, [what is installed])}``."""
    out = {}
    for extra, needs in EXTRAS.items():
        have = [_installed(label, module) for label, module in needs]
        out[extra] = (all(have), [h for h in have if h])
    return out


def device_lines() -> list[str]:
    """The device torch will use, its memory, and the CPU threads."""
    import torch

    lines = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            lines.append(f"device: cuda:{i} {props.name}, {props.total_memory / 2**30:.1f} GiB, "
                         f"bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}")
    else:
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
        mps = getattr(torch.backends, "mps", None)
        extra = ", MPS available" if mps is not None and mps.is_available() else ""
        lines.append(f"device: cpu (no GPU visible; torch is a {build}{extra})")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    omp = os.environ.get("OMP_NUM_THREADS")
    lines.append(f"threads: torch {torch.get_num_threads()}, cores usable {cores} of "
                 f"{os.cpu_count()}" + (f", OMP_NUM_THREADS={omp}" if omp else ""))
    lines.append(f"memory: {_memory()}")
    return lines


def _memory() -> str:
    try:
        import psutil

        mem = psutil.virtual_memory()
        return f"{mem.total / 2**30:.1f} GiB, {mem.available / 2**30:.1f} GiB available"
    except ImportError:
        pass
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        total, free = (int(fields[k].split()[0]) / 2**20 for k in ("MemTotal", "MemAvailable"))
        return f"{total:.1f} GiB, {free:.1f} GiB available"
    except (OSError, KeyError, ValueError):
        return "unknown"


def hub_lines(probe: bool = True, model: str | None = None) -> list[str]:
    """The cache folder, whether the hub can be reached, and whether ``model`` (a hub id) is
    cached."""
    from huggingface_hub import constants

    from flowgrpo.training.hub import hub_offline, hub_reachable, looks_local

    cache = Path(constants.HF_HUB_CACHE)
    cached = sorted(p.name.removeprefix("models--").replace("--", "/")
                    for p in cache.glob("models--*")) if cache.is_dir() else []
    lines = [f"hub cache: {cache} ({len(cached)} model{'s' if len(cached) != 1 else ''})"]
    if hub_offline():
        access = "off (HF_HUB_OFFLINE is set)"
    elif not probe:
        access = "not checked"
    else:
        access = (f"reachable ({constants.ENDPOINT})" if hub_reachable()
                  else f"unreachable ({constants.ENDPOINT}): only cached models and local "
                       "folders load")
    lines.append(f"hub access: {access}")
    if model and not looks_local(model):
        from huggingface_hub import try_to_load_from_cache

        try:
            hit = isinstance(try_to_load_from_cache(model, "model_index.json"), str)
        except ValueError:
            hit = False
        lines.append(f"model {model}: {'cached' if hit else 'not cached'}")
    elif model:
        lines.append(f"model {model}: local folder")
    return lines


def report(probe: bool = True, model: str | None = None) -> str:
    """Everything ``flowgrpo doctor`` prints (``model``: a config's ``model.path``, whose cache
    state is reported)."""
    from flowgrpo.cli.catalogue import plugged_in
    from flowgrpo.data.files import SHIPPED

    package = Path(__file__).resolve().parents[1]  # flowgrpo/
    checkout = (package.parent / "pyproject.toml").is_file()
    lines = [
        f"flowgrpo {version('flowgrpo') or 'unknown version'} ({package}; "
        f"{'source checkout' if checkout else 'installed'})",
        f"python {platform.python_version()} ({sys.executable}; {platform.system()} "
        f"{platform.machine()})",
        "libraries: " + ", ".join(f"{name} {version(name) or 'missing'}" for name in LIBRARIES),
        *device_lines(),
    ]
    shown = []
    for extra, (complete, have) in extras().items():
        state = "yes" if complete else ("partly" if have else "no")
        shown.append(f"{extra} {state}" + (f" ({', '.join(have)})" if have else ""))
    espeak = "espeak-ng yes" if shutil.which("espeak-ng") else "espeak-ng no"
    lines.append("extras: " + "; ".join(shown) + f"; {espeak}")
    lines += hub_lines(probe, model)
    lines.append(f"configs: {SHIPPED}")
    plugins = plugged_in()
    if plugins:
        lines.append("plug-ins:")
        lines += [f"  {title}: {name} <- {origin}" for title, name, origin in plugins]
    else:
        lines.append("plug-ins: none")
    return "\n".join(lines)
