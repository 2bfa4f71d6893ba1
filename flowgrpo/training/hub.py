"""Checks of ``model.path`` before any weight loads: the shipped toy names, local folders and
hub ids (cached, or the hub reachable within a few seconds instead of diffusers' retries).

:func:`check_model_path` checks ``model.path`` against what ``model.family`` loads (its
adapter's ``pipeline_classes``): a local folder must exist and hold a ``model_index.json``
naming one of them; a hub id must be in the Hugging Face cache or the hub must be reachable.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import pipelines
from flowgrpo.config.schema import ModelConfig
from flowgrpo.data.files import read_utf8
from flowgrpo.errors import ConfigError, one_line

HUB_PROBE_SECONDS = 3.0
"""How long :func:`hub_reachable` waits for a connection to the hub (or its proxy)."""


def resolve_path(path: str) -> str:
    """A shipped toy name (``digits``, ``digit_edits``, ``digits_video``, ``digits_discrete``,
    ``digits_discrete_uniform``, ``digits_discrete_metric``: :data:`pipelines.toy.TOY_NAMES`)
    -> its folder; ``~/...`` -> the home folder's; anything else unchanged."""
    from pipelines.toy import TOY_NAMES

    if path in TOY_NAMES:
        return TOY_NAMES[path]
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
                          f"({one_line(err)})") from None
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
