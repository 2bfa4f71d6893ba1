"""Model setup: check the path, load the adapter, make the transformer trainable (LoRA or full),
the reference.

Before any weight loads, :func:`check_model_path` checks ``model.path`` against what
``model.family`` loads (its adapter's ``pipeline_classes``): a local folder must exist and hold a
``model_index.json`` naming one of them; a hub id must be in the Hugging Face cache or the hub
must be reachable (a probe of a few seconds instead of diffusers' retries).

The reference policy for the KL term is the base model: with LoRA, the same transformer with the
adapter disabled (no extra memory); with full fine-tuning, a frozen copy made before training.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import threading
import urllib.parse
import urllib.request
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

import pipelines
from pipelines import FlowAdapter

from . import console
from .config import ConfigError, ModelConfig
from .config_io import read_utf8

ADAPTER_NAME = "default"
HUB_PROBE_SECONDS = 3.0
"""How long :func:`hub_reachable` waits for a connection to the hub (or its proxy)."""


def resolve_path(path: str) -> str:
    """``"digits"`` / ``"digit_edits"`` -> the shipped toy model folders; ``~/...`` -> the home
    folder's; anything else unchanged."""
    if path in ("digits", "digit_edits"):
        from pipelines.toy import DIGIT_EDITS_MODEL, DIGITS_MODEL

        return DIGITS_MODEL if path == "digits" else DIGIT_EDITS_MODEL
    return os.path.expanduser(path) if path.startswith("~") else path


def check_model_path(cfg: ModelConfig) -> None:
    """Raise :class:`ConfigError` when ``model.path`` cannot hold what ``model.family`` loads:
    a local path that is missing, a file, an empty folder or a folder without
    ``model_index.json``; a pipeline class the family does not load; a hub id neither cached nor
    reachable. A family without ``pipeline_classes`` (a custom adapter) is not checked."""
    accepted = tuple(getattr(pipelines.FAMILIES.get(cfg.family), "pipeline_classes", ()))
    if not accepted:
        return
    path = resolve_path(cfg.path)
    shown = path if path == cfg.path else f"{cfg.path} ({path})"
    if not path.strip():
        raise ConfigError("model.path: empty; give a hub id (org/name) or a local diffusers folder")
    index = _local_index(path, shown) if looks_local(path) else _hub_index(path, cfg.options)
    name = (index or {}).get("_class_name")
    if isinstance(name, str) and name not in accepted:
        owner = next((f for f in pipelines.names()
                      if name in getattr(pipelines.FAMILIES.get(f), "pipeline_classes", ())), None)
        fix = (f"use model.family: {owner}" if owner
               else f"{cfg.family} loads {' or '.join(accepted)}")
        raise ConfigError(f"model.path: {shown} holds a {name}, but model.family is {cfg.family} "
                          f"({fix})")


def looks_local(path: str) -> bool:
    """Whether ``path`` means a local folder rather than a hub id (``org/name``): it exists,
    starts with ``.``, ``/`` or ``~``, or has a backslash or more than one ``/``."""
    return (Path(path).exists() or path.startswith((".", "/", "~")) or "\\" in path
            or path.count("/") > 1)


def _local_index(path: str, shown: str) -> dict:
    """The parsed ``model_index.json`` of the local pipeline folder ``path``."""
    folder = Path(path)
    want = "a diffusers pipeline folder (with model_index.json) or a hub id (org/name)"
    if not folder.exists():
        raise ConfigError(f"model.path: {shown} does not exist; give {want}")
    if not folder.is_dir():
        raise ConfigError(f"model.path: {shown} is a file; give {want}")
    if not any(folder.iterdir()):
        raise ConfigError(f"model.path: {shown} is an empty folder; give {want}")
    if not (folder / "model_index.json").is_file():
        raise ConfigError(f"model.path: {shown} has no model_index.json, so it is not a diffusers "
                          "pipeline folder (write one with pipeline.save_pretrained)")
    return _read_index(folder / "model_index.json")


def _read_index(file: Path) -> dict:
    """A ``model_index.json`` as a dict."""
    try:
        index = json.loads(read_utf8(file, "model.path"))
    except json.JSONDecodeError as err:
        raise ConfigError(f"model.path: {file}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(index, dict):
        raise ConfigError(f"model.path: {file} is not a JSON object")
    return index


def _hub_index(repo_id: str, options: dict) -> dict | None:
    """The cached ``model_index.json`` of hub repo ``repo_id``; ``None`` when it is not cached but
    the hub is reachable (diffusers downloads it). Unreachable and not cached: ConfigError."""
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(repo_id, "model_index.json",
                                        cache_dir=options.get("cache_dir"),
                                        revision=options.get("revision"))
    except ValueError as err:  # huggingface_hub's HFValidationError: not a valid repo id
        raise ConfigError(f"model.path: {repo_id!r} is neither a local folder nor a valid hub id "
                          f"({str(err).splitlines()[0]})") from None
    if isinstance(cached, str):
        return _read_index(Path(cached))
    why = "HF_HUB_OFFLINE is set" if hub_offline() else None
    if why is None and not hub_reachable():
        why = "no network"
    if why:
        raise ConfigError(f"model.path: {repo_id} is not a local folder, not in the Hugging Face "
                          f"cache, and the hub is unreachable ({why})")
    return None


def hub_offline() -> bool:
    """Whether Hugging Face offline mode is on (``HF_HUB_OFFLINE``, now or at import)."""
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")
    return flag or bool(constants.HF_HUB_OFFLINE)


def hub_reachable(timeout: float = HUB_PROBE_SECONDS) -> bool:
    """Whether a TCP connection to the hub endpoint (``HF_ENDPOINT``), or to the proxy that
    serves it, opens within ``timeout`` seconds (name resolution included)."""
    from huggingface_hub import constants

    url = urllib.parse.urlsplit(constants.ENDPOINT)
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(url.hostname or ""):
        url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    address = (url.hostname or "", url.port or (443 if url.scheme == "https" else 80))
    opened: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection(address, timeout=timeout).close()
            opened.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)  # bounds a hanging DNS lookup too
    thread.start()
    thread.join(timeout)
    return bool(opened)


def load_adapter(cfg: ModelConfig, device: torch.device | str = "cpu") -> FlowAdapter:
    """Check ``model.path`` (:func:`check_model_path`), load the configured family and move it to
    ``device``; every weight starts frozen."""
    check_model_path(cfg)
    options = dict(cfg.options)
    if cfg.height:
        options["height"] = cfg.height
    if cfg.width:
        options["width"] = cfg.width
    if cfg.negative_prompt:  # else each family's own default (sd3: "")
        options.setdefault("negative_prompt", cfg.negative_prompt)
    console.apply_to_libraries()  # the command's --quiet / --verbose, before the loading bars
    adapter = pipelines.load(cfg.family, resolve_path(cfg.path), torch_dtype=cfg.dtype, **options)
    adapter.to(device)
    for name in ("transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae"):
        module = getattr(adapter.pipeline, name, None)
        if isinstance(module, torch.nn.Module):
            module.requires_grad_(False)
            module.eval()
    return adapter


def lora_config(cfg: ModelConfig, adapter: FlowAdapter):
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        init_lora_weights="gaussian",
        target_modules=list(cfg.lora_targets or adapter.default_lora_targets),
    )


def make_trainable(cfg: ModelConfig, adapter: FlowAdapter) -> list[torch.nn.Parameter]:
    """Add a LoRA (or unfreeze everything) and return the trainable parameters (fp32)."""
    transformer = adapter.transformer
    if cfg.lora:
        adapter.add_lora(lora_config(cfg, adapter), ADAPTER_NAME)
        params = [p for n, p in transformer.named_parameters() if "lora_" in n]
    else:
        adapter.reference_copy = copy.deepcopy(transformer).requires_grad_(False).eval()
        params = list(transformer.parameters())
    for p in params:
        p.requires_grad_(True)
        p.data = p.data.float()  # trainable weights live in fp32; autocast handles compute
    if cfg.gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    transformer.train()
    return params


def compile_forward(module: torch.nn.Module, mode: str) -> None:
    """``torch.compile`` the forward of ``module`` (the model inside any wrapper) in place.

    Only ``forward`` is compiled, so the module's hooks (the call counter) still run eagerly
    around it, and wrappers (DDP, FSDP) and ``unwrap`` see the same module as before. The LoRA
    switch of a reference call and grad / no-grad each get their own graph on first use."""
    inner = unwrap(module)
    inner.forward = torch.compile(inner.forward, mode=mode)


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP/compile wrapper."""
    while hasattr(module, "module"):
        module = module.module
    return getattr(module, "_orig_mod", module)


_LORA_LAYERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The peft LoRA layers of ``model``, found once per model and cached (weakly).

    diffusers' ``disable_adapters``/``enable_adapters`` walk every module and re-read peft's
    installed version on each use: 2.8 ms per reference call on the toy, ~3% of an iteration
    (``benchmarks/lora_toggle.py``). Switching the cached layers with peft's own per-layer
    ``enable_adapters`` does the same thing (the flag, and the LoRA weights' ``requires_grad``)
    in a quarter of the time."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = _LORA_LAYERS.get(model)
    if layers is None:
        layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
        _LORA_LAYERS[model] = layers
    return layers


@contextmanager
def reference(adapter: FlowAdapter) -> Iterator[None]:
    """Within the block, ``adapter.velocity`` is the reference (base) model's."""
    ref = getattr(adapter, "reference_copy", None)
    if ref is not None:
        trained, adapter.transformer = adapter.transformer, ref
        try:
            yield
        finally:
            adapter.transformer = trained
        return
    model = unwrap(adapter.transformer)
    layers = lora_layers(model)
    if not layers:
        model.disable_adapters()  # diffusers' own error: the model has no adapter
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def lora_state_dict(adapter: FlowAdapter) -> dict[str, torch.Tensor]:
    """The transformer's LoRA weights in the layout diffusers' ``load_lora_weights`` expects."""
    from peft.utils import get_peft_model_state_dict

    return get_peft_model_state_dict(unwrap(adapter.transformer), adapter_name=ADAPTER_NAME)
