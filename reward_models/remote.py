"""A reward scored by a reward server (:mod:`reward_models.server`) over HTTP.

The same callable as a local reward: the batch travels as JSON with base64 PNG frames / float32
WAV clips (images are rounded to 8 bits on the way, as any image file would be), the answer comes
back as a :class:`RewardOutput`. Standard library only (``urllib``).

Failures: connection errors, timeouts and 408/429/502/503/504 answers are retried with
exponential backoff (``backoff * 2**k`` seconds before retry ``k+1``); when every attempt fails a
``ConnectionError`` names the URL and the number of attempts. The server's own refusals are not
retried: 401/403 raise ``PermissionError``, other 4xx ``ValueError`` (with the server's message),
500 ``RuntimeError``.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request

from .base import RewardOutput, register
from .media import Media, check_batch
from .server import decode_output, encode_request

RETRY_CODES = (408, 429, 502, 503, 504)


def _error_message(err: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(err.read()).get("error", err.reason))
    except (ValueError, AttributeError, OSError):
        return str(err.reason)


def post_with_retries(url: str, body: bytes, *, timeout: float, retries: int, backoff: float,
                      token: str | None = None, what: str = "server") -> bytes:
    """POST a JSON ``body`` to ``url`` and return the answer's bytes, with the failure rules of
    this module's docstring (``what`` names the server in the messages)."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    where = f"{what} at {url}"
    attempts, last = retries + 1, "no attempt made"
    for attempt in range(attempts):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read()
        except urllib.error.HTTPError as err:
            message = _error_message(err)
            if err.code in RETRY_CODES:
                last = f"HTTP {err.code}: {message}"
                continue
            if err.code in (401, 403):
                raise PermissionError(f"{where} refused the token (HTTP {err.code})") from None
            if err.code < 500:
                msg = f"{where} rejected the request (HTTP {err.code}): {message}"
                raise ValueError(msg) from None
            raise RuntimeError(f"{where} failed (HTTP {err.code}): {message}") from None
        except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
            last = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
    raise ConnectionError(f"{where} is unreachable after {attempts} attempts "
                          f"(timeout {timeout:g}s each); last error: {last}")


@register("remote")
class RemoteReward:
    """Score with a reward served at ``url``.

    Args:
        url: the server's base URL (``http://127.0.0.1:8000``) or its ``/score`` endpoint.
        timeout: seconds to wait for one answer (connect + score + read); rewards on big batches
            take a while, so keep it generous.
        retries: attempts after the first one (``retries + 1`` in all).
        backoff: seconds before the first retry, doubling each time.
        token: bearer token the server was started with.
        groupwise: declare that the served reward is group-wise (it then needs whole groups).
    """

    def __init__(
        self,
        url: str,
        timeout: float = 120.0,
        retries: int = 3,
        backoff: float = 0.5,
        token: str | None = None,
        groupwise: bool = False,
    ) -> None:
        url = url.rstrip("/")
        self.url = url if url.endswith("/score") else url + "/score"
        self.timeout, self.retries, self.backoff = float(timeout), int(retries), float(backoff)
        self.token = token
        self.groupwise = bool(groupwise)

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        check_batch(media, prompts, metadata, reward="remote")
        body = encode_request(media, prompts, metadata)
        raw = post_with_retries(self.url, body, timeout=self.timeout, retries=self.retries,
                                backoff=self.backoff, token=self.token, what="reward server")
        return decode_output(json.loads(raw))
