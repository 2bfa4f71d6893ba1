"""Condition enhancers: extra captions ("views") per prompt for Multi-View GRPO.

MV-GRPO (Bu et al., "From Sparse to Dense: Multi-View GRPO for Flow Models via Augmented
Condition Space", arXiv:2603.12648) re-scores one prompt group's samples under captions that are
semantically adjacent to the prompt, giving one advantage per view, and trains the log-prob of the
original trajectory under each view's condition. Where the captions come from is pluggable; the
paper uses an LLM (rewriting the prompt) or a VLM (describing the samples).

Every enhancer is a callable with the same signature::

    enhancer(prompts: list[str], num_views: int, seed: int) -> list[list[str]]

- the result has one list per prompt, in order, each holding exactly ``num_views`` strings;
- the views are *extra* captions: the trainer keeps the original prompt as its own view;
- the result is a pure function of ``(prompts, num_views, seed)``: the same on every process and
  after a resume (the trainer passes a seed derived from the run seed and the step).

Registered enhancers (build one with :func:`build`):

- ``template``: rephrasing templates and whole-word synonyms; needs no model.
- ``callable``: a user function named by a dotted path (``"package.module:function"``).
- ``remote``: an enhancer served over HTTP (typically an LLM); JSON contract in
  :class:`RemoteEnhancer`.

Parameters come from config as keyword arguments; an unknown or missing one is a ``ValueError``
(:class:`~flowgrpo.registry.ParameterError`) naming it and the valid ones.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from flowgrpo import seeding
from flowgrpo.errors import one_line
from flowgrpo.registry import Registry
from flowgrpo.validation import integer
from reward_models.remote import post_with_retries

__all__ = [
    "ENHANCERS",
    "CallableEnhancer",
    "Enhancer",
    "RemoteEnhancer",
    "TemplateEnhancer",
    "check_views",
    "get",
    "names",
    "register",
]


class Enhancer(Protocol):
    """Any callable with this signature is a condition enhancer (see the module docstring)."""

    def __call__(self, prompts: list[str], num_views: int, seed: int) -> list[list[str]]: ...


ENHANCERS: Registry[Callable[..., Enhancer]] = Registry("condition enhancer")
register = ENHANCERS.register


def build(name: str, **params: Any) -> Enhancer:
    """Build the condition enhancer registered as ``name`` with ``params``.

    Raises:
        UnknownNameError: naming the valid enhancers.
        flowgrpo.registry.ParameterError: an unknown or missing parameter (a ValueError naming
            it and the valid ones).
    """
    return ENHANCERS.build(name, **params)


get = build
"""The name code written before :func:`build` uses; it builds too."""


def names() -> list[str]:
    """Registered condition enhancer names, sorted."""
    return ENHANCERS.names()


def _check_request(prompts: Sequence[str], num_views: int) -> None:
    if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
        raise ValueError("prompts must be a list of strings")
    integer("num_views", num_views, 0)


def check_views(views: Any, prompts: Sequence[str], num_views: int, source: str) -> list[list[str]]:
    """Check an enhancer's output; return it as a list of lists of ``str``.

    Args:
        views: what the enhancer returned.
        prompts: the prompts it was asked about.
        num_views: the number of views asked for, per prompt.
        source: who produced ``views``, for the error message.

    Raises:
        ValueError: one line saying what is wrong, when ``views`` is not ``len(prompts)`` lists of
            exactly ``num_views`` strings.
    """
    if not isinstance(views, (list, tuple)) or len(views) != len(prompts):
        got = f"{len(views)} items" if isinstance(views, (list, tuple)) else type(views).__name__
        raise ValueError(
            f"{source} must return one list of captions per prompt ({len(prompts)}), got {got}"
        )
    checked = []
    for i, row in enumerate(views):
        if not isinstance(row, (list, tuple)) or not all(isinstance(v, str) for v in row):
            raise ValueError(f"{source}: views for prompt {i} must be a list of strings")
        if len(row) != num_views:
            raise ValueError(
                f"{source}: prompt {i} got {len(row)} views, expected exactly {num_views}"
            )
        checked.append(list(row))
    return checked


DEFAULT_TEMPLATES = (
    "{prompt}, high quality",
    "a picture of {prompt}",
    "a photo of {prompt}",
    "an image showing {prompt}",
    "{prompt}, detailed",
    "a high-resolution image of {prompt}",
    "a well-composed picture of {prompt}",
    "{prompt}, sharp focus",
)


@register("template")
class TemplateEnhancer:
    """Views from rephrasing templates and whole-word synonyms; needs no model.

    The candidate captions of a prompt are every template applied to the prompt and to each
    single-synonym variant of it (one matched word or phrase replaced by one of its synonyms, all
    occurrences), deduplicated, minus the prompt itself. Views are a seeded shuffle of the
    candidates, so they are distinct while there are enough of them; with fewer candidates than
    views the shuffled list repeats. A prompt with no candidate gets itself as every view.

    Args:
        templates: strings containing ``{prompt}``, which is replaced literally (other braces are
            kept as they are).
        synonyms: word or phrase -> replacements, matched whole-word and case-insensitively,
            e.g. ``{"dog": ["puppy", "hound"]}``.
    """

    def __init__(
        self,
        templates: Sequence[str] = DEFAULT_TEMPLATES,
        synonyms: dict[str, list[str]] | None = None,
    ) -> None:
        if isinstance(templates, str) or not templates:
            raise ValueError("templates must be a non-empty list of strings with '{prompt}'")
        for template in templates:
            if not isinstance(template, str) or "{prompt}" not in template:
                raise ValueError(f"every template must contain '{{prompt}}', got {template!r}")
        self.templates = list(templates)
        self.synonyms: list[tuple[re.Pattern[str], list[str]]] = []
        for word, replacements in (synonyms or {}).items():
            if isinstance(replacements, str) or not all(isinstance(r, str) for r in replacements):
                raise ValueError(f"synonyms[{word!r}] must be a list of strings")
            # Look-arounds instead of \b so keys that start or end with punctuation still match.
            pattern = re.compile(rf"(?<!\w){re.escape(word)}(?!\w)", re.IGNORECASE)
            self.synonyms.append((pattern, list(replacements)))

    def candidates(self, prompt: str) -> list[str]:
        """The distinct captions this enhancer can give ``prompt``, in a fixed order."""
        variants = [prompt]
        for pattern, replacements in self.synonyms:
            if pattern.search(prompt):
                # A function replacement, so backslashes in a synonym are not read as escapes.
                variants += [pattern.sub(lambda _m, r=r: r, prompt) for r in replacements]
        captions = (t.replace("{prompt}", v) for v in variants for t in self.templates)
        return [c for c in dict.fromkeys(captions) if c != prompt]

    def __call__(self, prompts: list[str], num_views: int, seed: int) -> list[list[str]]:
        _check_request(prompts, num_views)
        views = []
        for prompt in prompts:
            pool = self.candidates(prompt) or [prompt]
            seeding.python_random("enhancer_shuffle", seed, prompt).shuffle(pool)
            views.append([pool[i % len(pool)] for i in range(num_views)])
        return views


def _resolve(target: str) -> Callable[..., Any]:
    """Import ``"package.module:attr"`` or ``"package.module.attr"`` and return the attribute."""
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise ValueError(
            f"enhancer target must look like 'package.module:function', got {target!r}"
        )
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(
            f"enhancer target {target!r}: cannot import {module_name!r} ({one_line(err)})"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"enhancer target {target!r}: {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"enhancer target {target!r} is a {type(obj).__name__}, not callable")
    return obj


@register("callable")
class CallableEnhancer:
    """A user function with the enhancer signature, named by a dotted path.

    Args:
        target: ``"package.module:function"`` (or ``"package.module.function"``); imported when
            the enhancer is built, so a typo fails at config load. The function must itself be
            deterministic in ``seed``; its output is checked with :func:`check_views`.
    """

    def __init__(self, target: str) -> None:
        self.target = target
        self.fn = _resolve(target)

    def __call__(self, prompts: list[str], num_views: int, seed: int) -> list[list[str]]:
        _check_request(prompts, num_views)
        views = self.fn(list(prompts), num_views, seed)
        return check_views(views, prompts, num_views, f"enhancer {self.target!r}")


@register("remote")
class RemoteEnhancer:
    """Views from an enhancer served over HTTP (the hook for an LLM served elsewhere).

    Contract: one ``POST`` to ``url`` (exactly as given) with ``Content-Type: application/json``
    and, when ``token`` is set, ``Authorization: Bearer <token>``; the body is
    ``{"prompts": [str, ...], "num_views": int, "seed": int}`` and a ``200`` answer is
    ``{"views": [[str, ...], ...]}``: one list per prompt, in order, exactly ``num_views`` strings
    each. The server must answer the same request with the same views (for an LLM: greedy
    decoding, or sampling with a generator seeded from ``seed`` and the prompt), so that every
    process and every resumed run trains on the same captions. An error answer may carry
    ``{"error": "message"}``.

    Failures: connection errors, timeouts and 408/429/502/503/504 answers are retried with
    exponential backoff (``backoff * 2**k`` seconds before retry ``k+1``); when every attempt
    fails, a ``ConnectionError`` names the URL. 401/403 raise ``PermissionError``, other 4xx and
    malformed answers ``ValueError``, 500 ``RuntimeError``; those are not retried.

    Args:
        url: the endpoint, e.g. ``http://127.0.0.1:8001/enhance``.
        timeout: seconds to wait for one answer (an LLM writing captions for a batch is slow).
        retries: attempts after the first one (``retries + 1`` in all).
        token: bearer token, if the server wants one.
        backoff: seconds before the first retry, doubling each time.
    """

    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        retries: int = 2,
        token: str = "",
        backoff: float = 0.5,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if retries < 0 or timeout <= 0 or backoff < 0:
            raise ValueError("remote enhancer needs timeout > 0, retries >= 0 and backoff >= 0")
        self.url, self.token = url, token
        self.timeout, self.retries, self.backoff = float(timeout), int(retries), float(backoff)

    def __call__(self, prompts: list[str], num_views: int, seed: int) -> list[list[str]]:
        _check_request(prompts, num_views)
        body = json.dumps({"prompts": list(prompts), "num_views": num_views, "seed": int(seed)})
        where = f"enhancer server at {self.url}"
        raw = post_with_retries(self.url, body.encode(), timeout=self.timeout,
                                retries=self.retries, backoff=self.backoff, token=self.token,
                                what="enhancer server")
        try:
            answer = json.loads(raw)
        except ValueError:
            raise ValueError(f"{where} answered with non-JSON") from None
        if not isinstance(answer, dict) or "views" not in answer:
            raise ValueError(f"{where} answered without a 'views' key")
        return check_views(answer["views"], prompts, num_views, where)
