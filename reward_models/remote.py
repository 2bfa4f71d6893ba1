"""A reward scored by a reward server (:mod:`reward_models.server`) over HTTP.

The same callable as a local reward: the batch travels as JSON with base64 PNG frames / float32
WAV clips (images are rounded to 8 bits on the way, as any image file would be), the answer comes
back as a :class:`RewardOutput`. Standard library only (``urllib``).

Failures of :class:`RemoteReward` raise :class:`~reward_models.checks.RewardFault` with one line
that names the ``/score`` URL, e.g. ``remote reward http://127.0.0.1:8000/score: HTTP 500 'boom'``:

- at construction, ``GET /health`` (at most 5 s) must answer ``{"status": "ok"}``, else
  ``...: server unreachable (connection refused)`` (or ``(no answer within 5 s)``, ...);
- ``HTTP <code> '<start of the server's message>'`` for an error answer (401/403: a bad token;
  other 4xx raise :class:`RemoteRejected`, also a ``ValueError`` like the reward's own refusal of
  a batch in process; 500: the reward failed on the server);
- ``no answer within <timeout> s`` when the server took the batch and did not answer in time;
  ``connection refused``, ``connection reset``, ... when it could not be reached;
- ``reply is not JSON ('<start of the reply>')``, ``reply is not a reward output (...)``, and
  the size checks of :func:`~reward_models.checks.check_output` (``remote reward
  http://127.0.0.1:8000/score returned 15 scores for 16 samples``). NaN/inf scores are returned
  as they came: the caller's ``check_output`` marks those samples, as for a local reward.

Retries: connection failures (refused, reset, a connect timeout) and 408/429/502/503/504 answers
are retried with exponential backoff (``backoff * 2**k`` seconds before retry ``k+1``); when every
attempt fails the last failure is raised with `` (after N attempts)``. Not retried: a request the
server accepted but did not answer within ``timeout`` (the server scores one batch at a time, so
a resent batch would queue behind the one it is still scoring; a hung server is thus reported
after ``timeout`` seconds, not ``retries + 1`` times that) and every other error answer.

:func:`post_with_retries` is the generic client the remote enhancer uses; it keeps its own
exceptions (``ConnectionError``, ``PermissionError``, ``ValueError``, ``RuntimeError``) and also
retries read timeouts.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request

from flowgrpo.errors import one_line

from .base import RewardOutput, register
from .checks import RewardFault, check_output
from .media import Media, check_batch
from .server import decode_output, encode_request

RETRY_CODES = (408, 429, 502, 503, 504)
CHECK_TIMEOUT = 5.0  # seconds the health probe at construction waits, at most
SNIPPET_CHARS = 200  # characters of a server's message quoted in an error
ERROR_BODY_BYTES = 64 * 2**10  # bytes of an error answer read to find its message


class RemoteRejected(RewardFault, ValueError):
    """The server refused the batch with a 4xx (not 401/403, not a retried code): a malformed
    request, a batch over the server's limits, or the reward's own ``ValueError``/``TypeError``
    (e.g. the wrong media kind). Also a ``ValueError``, as the same refusal is in process."""


def snippet(data: bytes | str, limit: int = SNIPPET_CHARS) -> str:
    """The start of a reply, quoted on one line: runs of whitespace become one space and at most
    ``limit`` characters are kept (``...`` marks the cut)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = " ".join(text.split())
    return repr(text[:limit] + "..." if len(text) > limit else text)


def _read_error(err: urllib.error.HTTPError) -> tuple[str | None, bytes]:
    """An error answer's ``{"error": message}`` (``None`` when it has none) and its first bytes."""
    try:
        data = err.read(ERROR_BODY_BYTES) or b""
    except (OSError, AttributeError, http.client.HTTPException):
        data = b""
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = None
    message = str(parsed["error"]) if isinstance(parsed, dict) and "error" in parsed else None
    return message, data


def _http_failure(err: urllib.error.HTTPError) -> str:
    """``HTTP 500 'boom'``: the code and the start of the server's message (its ``error`` field
    when the answer is ``{"error": ...}``, else the body, else the reason phrase)."""
    error, data = _read_error(err)
    return f"HTTP {err.code} {snippet(error if error is not None else data or str(err.reason))}"


def _request(url: str, body: bytes | None, *, timeout: float, token: str | None) -> bytes:
    """One POST of a JSON ``body`` (``None``: one GET) to ``url``; urllib's exceptions pass."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    method = "GET" if body is None else "POST"
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def _network_failure(err: BaseException, timeout: float) -> str:
    """One line for a request that got no HTTP answer."""
    reason = getattr(err, "reason", err)  # URLError wraps the socket's exception
    if isinstance(reason, str):
        return reason
    if isinstance(reason, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, http.client.RemoteDisconnected):
        return "the server closed the connection without answering"
    if isinstance(reason, ConnectionResetError):
        return "connection reset"
    return one_line(reason, with_type=True)


def post_with_retries(url: str, body: bytes, *, timeout: float, retries: int, backoff: float,
                      token: str | None = None, what: str = "server") -> bytes:
    """POST a JSON ``body`` to ``url`` and return the answer's bytes (``what`` names the server in
    the messages). Connection errors, timeouts and 408/429/502/503/504 answers are retried with
    exponential backoff, then ``ConnectionError`` names the URL and the number of attempts; 401/403
    raise ``PermissionError``, other 4xx ``ValueError`` and 5xx ``RuntimeError`` at once."""
    where = f"{what} at {url}"
    attempts, last = retries + 1, "no attempt made"
    for attempt in range(attempts):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            return _request(url, body, timeout=timeout, token=token)
        except urllib.error.HTTPError as err:
            error, _ = _read_error(err)
            message = error if error is not None else str(err.reason)
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
        timeout: seconds to wait for the connection, then for the answer (urllib applies it to
            each blocking socket operation); a server that takes longer to score a batch is
            reported as hung (``no answer within 30 s``), so raise it for slow rewards.
        retries: attempts after the first one (``retries + 1`` in all) for the failures that are
            retried (see the module docstring).
        backoff: seconds before the first retry, doubling each time.
        token: bearer token the server was started with.
        groupwise: declare that the served reward is group-wise (it then needs whole groups).
        check: probe the server's ``GET /health`` now (``min(timeout, 5)`` seconds), so that a
            wrong URL or a server that is down fails at start (:meth:`check`).

    Raises:
        RewardFault: on every failure, one line naming the ``/score`` URL (module docstring).
    """

    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        token: str | None = None,
        groupwise: bool = False,
        check: bool = True,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"remote reward url must start with http:// or https://, got {url!r}")
        if timeout <= 0 or retries < 0 or backoff < 0:
            raise ValueError("remote reward needs timeout > 0, retries >= 0 and backoff >= 0")
        url = url.rstrip("/")
        self.url = url if url.endswith("/score") else url + "/score"
        self.name = f"remote reward {self.url}"
        self.timeout, self.retries, self.backoff = float(timeout), int(retries), float(backoff)
        self.token = token
        self.groupwise = bool(groupwise)
        if check:
            self.check()

    def _fault(self, detail: str) -> RewardFault:
        return RewardFault(self.name, f"{self.name}: {detail}")

    def check(self) -> None:
        """Probe ``GET /health`` next to ``/score``; :class:`RewardFault` when the server cannot
        be reached (``server unreachable (...)``) or does not answer ``{"status": "ok"}``."""
        url = self.url[: -len("/score")] + "/health"
        timeout = min(self.timeout, CHECK_TIMEOUT)
        try:
            raw = _request(url, None, timeout=timeout, token=self.token)
        except urllib.error.HTTPError as err:
            raise self._fault(f"health check got {_http_failure(err)}") from err
        except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
            raise self._fault(f"server unreachable ({_network_failure(err, timeout)})") from err
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or answer.get("status") != "ok":
            raise self._fault(f"health check reply is not a reward server's ({snippet(raw)})")

    def _post(self, body: bytes) -> bytes:
        """POST the batch with the retry rules of the module docstring."""
        attempts, last = self.retries + 1, "no attempt made"
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                return _request(self.url, body, timeout=self.timeout, token=self.token)
            except urllib.error.HTTPError as err:
                detail = _http_failure(err)
                if err.code in RETRY_CODES:
                    last = detail
                    continue
                if 400 <= err.code < 500 and err.code not in (401, 403):
                    raise RemoteRejected(self.name, f"{self.name}: {detail}") from err
                raise self._fault(detail) from err
            except TimeoutError as err:  # sent, then no answer: not retried (module docstring)
                raise self._fault(f"no answer within {self.timeout:g} s") from err
            except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
                last = _network_failure(err, self.timeout)
        raise self._fault(last + (f" (after {attempts} attempts)" if attempts > 1 else ""))

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        check_batch(media, prompts, metadata, reward="remote")
        raw = self._post(encode_request(media, prompts, metadata))
        try:
            answer = json.loads(raw)
        except ValueError:
            raise self._fault(f"reply is not JSON ({snippet(raw)})") from None
        try:
            out = decode_output(answer)
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError):
            raise self._fault(f"reply is not a reward output ({snippet(raw)})") from None
        return check_output(self.name, out, len(prompts), finite=False)
