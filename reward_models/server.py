"""Serve any reward over HTTP (JSON, base64 media, never pickle) on the standard library.

Protocol::

    GET  /health -> {"status": "ok", "groupwise": bool, "max_batch": int}
    POST /score  <- {"kind": "image" | "video" | "audio",
                     "media": [base64 PNG, ...] | [[base64 PNG per frame], ...] | [base64 WAV, ...],
                     "sample_rate": int (audio; the WAV header wins), "prompts": [...],
                     "metadata": [{...}, ...]}
                 -> {"scores": [B], "regions": [B][h][w] | null,
                     "components": {name: [B]} | null, "info": {...}}

Errors answer ``{"error": message}``:

===  ==========================================================================================
400  malformed JSON (or nested too deep), a body that is not an object, missing or mistyped
     fields, media that does not decode (bad base64, not a PNG/WAV, ragged shapes), a
     Content-Length that is not a number, a body shorter than announced, or a reward's own
     ``ValueError``/``TypeError`` (e.g. the wrong media kind)
401  missing or wrong bearer token (when the server has one)
404  unknown path
408  the request did not arrive within ``read_timeout`` seconds of connecting (a client that
     sends half a body and stalls, or trickles it); the connection is then closed. A request
     whose headers never finish is closed without an answer.
411  no Content-Length, or a ``Transfer-Encoding`` (chunked bodies are not accepted)
413  a Content-Length over ``max_bytes`` (refused before the body is read), or a batch over
     ``max_batch`` (the message names the limit)
415  a Content-Type other than ``application/json`` (parameters such as ``; charset=utf-8``
     are fine); a request without a Content-Type is read as JSON, since the body is parsed
     as JSON either way (the ``remote`` client always sends ``application/json``)
500  the reward failed otherwise (logged)
===  ==========================================================================================

The server keeps serving after every error. Requests are handled on threads, one request per
connection, so a stalled client holds only its own thread and for at most ``read_timeout``;
scoring is serialized by a lock because reward models are not assumed thread-safe.

Binds to 127.0.0.1 by default: a reward server executes models on request and has no rate limit,
so it binds beyond loopback only when told to (``--host``) and only with a token (``--token``);
keep it on a trusted network.
"""

from __future__ import annotations

import argparse
import hmac
import io
import json
import logging
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from .base import Reward, RewardOutput
from .media import Media, media_from_wire, media_to_wire

log = logging.getLogger(__name__)
DEFAULT_MAX_BYTES = 256 * 2**20
DRAIN_LIMIT = 16 * 2**20  # bytes of a refused body read and dropped before answering
DEFAULT_READ_TIMEOUT = 30.0  # seconds a client may take to send its request
TOKEN_ENV = "FLOWGRPO_REWARD_TOKEN"


def jsonable(value: Any) -> Any:
    """Tensors / arrays / tuples -> plain lists and numbers for ``json.dumps``."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def encode_request(media: Media, prompts: list[str], metadata: list[dict]) -> bytes:
    """The ``/score`` request body for a batch."""
    body = {
        "kind": media.kind, "media": media_to_wire(media), "sample_rate": media.sample_rate,
        "prompts": list(prompts), "metadata": jsonable(list(metadata)),
    }
    return json.dumps(body).encode()


def decode_request(body: dict, max_batch: int) -> tuple[Media, list[str], list[dict]]:
    """Validate a parsed ``/score`` body; ``ValueError`` names the problem."""
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    missing = [k for k in ("kind", "media", "prompts") if k not in body]
    if missing:
        raise ValueError(f"missing fields: {', '.join(missing)}")
    items, prompts = body["media"], body["prompts"]
    if not isinstance(items, list) or not isinstance(prompts, list):
        raise ValueError("'media' and 'prompts' must be lists")
    if len(items) > max_batch:
        raise OverflowError(f"batch of {len(items)} exceeds this server's max_batch={max_batch}")
    metadata = body.get("metadata") or [{} for _ in items]
    if len(prompts) != len(items) or len(metadata) != len(items):
        raise ValueError(
            f"{len(items)} media items but {len(prompts)} prompts and {len(metadata)} metadata"
        )
    if not all(isinstance(p, str) for p in prompts) or not all(
        isinstance(m, dict) for m in metadata
    ):
        raise ValueError("prompts must be strings and metadata entries objects")
    return media_from_wire(body["kind"], items, body.get("sample_rate")), prompts, metadata


def encode_output(out: RewardOutput) -> dict:
    """A :class:`RewardOutput` as a JSON-ready dict."""
    return {
        "scores": jsonable(out.scores.float()),
        "regions": None if out.regions is None else jsonable(out.regions.float()),
        "components": None if out.components is None else jsonable(out.components),
        "info": jsonable(out.info),
    }


def decode_output(body: dict) -> RewardOutput:
    """Inverse of :func:`encode_output` (float32 tensors)."""

    def tensor(value: Any) -> torch.Tensor | None:
        return None if value is None else torch.tensor(value, dtype=torch.float32)

    components = body.get("components")
    return RewardOutput(
        scores=tensor(body["scores"]),
        regions=tensor(body.get("regions")),
        components=None if components is None else {k: tensor(v) for k, v in components.items()},
        info=body.get("info") or {},
    )


class _Reply(Exception):
    """An answer that ends the handling of a request: ``code`` and its JSON ``payload``."""

    def __init__(self, code: int, payload: dict) -> None:
        super().__init__(code)
        self.code, self.payload = code, payload


class _DeadlineReader(io.RawIOBase):
    """The socket's bytes, until ``seconds`` after construction: each read waits only for the
    time left, then raises ``TimeoutError``. One deadline for the whole request, so a client
    that trickles a byte now and then is dropped as surely as one that stalls."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        super().__init__()
        self.sock, self.deadline = sock, time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request's read deadline passed")
        self.sock.settimeout(remaining)
        return self.sock.recv_into(buffer)


class RewardHandler(BaseHTTPRequestHandler):
    """``GET /health`` and ``POST /score`` for one reward; :func:`_handler` binds the reward and
    the limits as class attributes (``http.server`` builds one handler per request)."""

    timeout = DEFAULT_READ_TIMEOUT  # seconds a stalled client may hold a connection
    reward: Reward
    max_batch: int
    max_bytes: int
    token: str | None
    lock: threading.Lock

    def setup(self) -> None:
        super().setup()  # one request per connection (HTTP/1.0): one deadline covers it
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self.timeout))

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.connection.settimeout(self.timeout)  # the reply gets its own time to be written
        self.send_response(code)
        if code == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _discard(self, length: int) -> None:
        """Drop a refused body. Reading it (up to a bound) lets the client receive the error
        instead of a connection reset; beyond the bound the connection is closed."""
        self.close_connection = True
        remaining = max(length, 0) if length <= DRAIN_LIMIT else 0  # a larger one: answer now
        while remaining > 0:
            try:
                chunk = self.rfile.read(min(remaining, 2**16))
            except OSError:  # the client stalled (read deadline) or left: answer what we can
                break
            if not chunk:
                break
            remaining -= len(chunk)

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/health":
            groupwise = bool(getattr(self.reward, "groupwise", False))
            self._send(200, {"status": "ok", "groupwise": groupwise,
                             "max_batch": self.max_batch})
        else:
            self._send(404, {"error": f"unknown path {self.path!r}; use /health or /score"})

    def do_POST(self) -> None:
        try:
            length = self._admit()
            media, prompts, metadata = self._read(length)
            reply = _Reply(200, self._encode(self._score(media, prompts, metadata)))
        except _Reply as refused:
            reply = refused
        try:
            self._send(reply.code, reply.payload)
        except OSError:  # the client is gone: nobody to answer
            self.close_connection = True

    def _admit(self) -> int:
        """The body length of an acceptable request; raises :class:`_Reply` for a wrong path, a
        missing length, a wrong token or a body over ``max_bytes`` (drained first)."""
        if self.path.rstrip("/") != "/score":
            raise _Reply(404, {"error": f"unknown path {self.path!r}; POST to /score"})
        self.close_connection = True
        if self.headers.get("Transfer-Encoding") is not None:
            raise _Reply(411, {"error": "Transfer-Encoding is not accepted: send the body with "
                                        "a Content-Length header"})
        lengths = {v.strip() for v in self.headers.get_all("Content-Length") or []}
        if not lengths:
            raise _Reply(411, {"error": "a Content-Length header is required"})
        value = next(iter(lengths))
        if len(lengths) > 1 or not (value.isascii() and value.isdigit()):
            raise _Reply(400, {"error": f"Content-Length {', '.join(sorted(lengths))!r} is not "
                                        "one number of bytes"})
        length = int(value)
        if self.token is not None:
            given = self.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                self._discard(length)
                raise _Reply(401, {"error": "missing or wrong bearer token"})
        if length > self.max_bytes:
            self._discard(length)
            raise _Reply(413, {"error": f"body of {length} bytes exceeds "
                                        f"max_bytes={self.max_bytes}"})
        kind = self.headers.get("Content-Type", "application/json").split(";")[0].strip()
        if kind.lower() != "application/json":
            self._discard(length)
            raise _Reply(415, {"error": f"Content-Type {kind!r}: send application/json"})
        return length

    def _read(self, length: int) -> tuple[Media, list[str], list[dict]]:
        """The request's media, prompts and metadata; a malformed body is a 400, a batch over
        ``max_batch`` a 413."""
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            raise _Reply(408, {"error": f"the request did not arrive within {self.timeout:g} s"}
                         ) from None
        except OSError as e:  # reset by the client: the answer will most likely not arrive
            raise _Reply(400, {"error": f"the body could not be read: {e}"}) from None
        if len(body) < length:  # the client closed before sending all it announced
            raise _Reply(400, {"error": f"body of {len(body)} bytes, {length} announced"})
        try:
            return decode_request(json.loads(body), self.max_batch)
        except OverflowError as e:
            raise _Reply(413, {"error": str(e)}) from None
        except RecursionError:
            raise _Reply(400, {"error": "malformed request: JSON nested too deep"}) from None
        except (ValueError, TypeError, KeyError, OSError) as e:
            raise _Reply(400, {"error": f"malformed request: {e}"}) from None
        except Exception as e:  # whatever else the decoders raise on a client's bytes
            raise _Reply(400, {"error": f"malformed request: {type(e).__name__}: {e}"}) from None

    def _score(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        """The reward's output, one request at a time; a bad input is a 400, any other reward
        failure a 500 (logged) and the server keeps serving."""
        try:
            with self.lock:
                return self.reward(media, prompts, metadata)
        except (ValueError, TypeError) as e:
            raise _Reply(400, {"error": f"{type(e).__name__}: {e}"}) from None
        except Exception as e:  # any reward failure: report it, keep serving
            log.exception("reward failed")
            raise _Reply(500, {"error": f"{type(e).__name__}: {e}"}) from None

    def _encode(self, out: RewardOutput) -> dict:
        """The reply to a scored batch; an output that cannot be encoded is a 500."""
        try:
            return encode_output(out)
        except Exception as e:
            log.exception("reward output could not be encoded")
            raise _Reply(500, {"error": f"reward output: {type(e).__name__}: {e}"}) from None


def _handler(reward: Reward, max_batch: int, max_bytes: int, token: str | None,
             read_timeout: float = DEFAULT_READ_TIMEOUT) -> type:
    """A :class:`RewardHandler` subclass bound to ``reward`` and the limits."""
    return type("Handler", (RewardHandler,), {
        "reward": staticmethod(reward), "max_batch": max_batch, "max_bytes": max_bytes,
        "token": token, "lock": threading.Lock(), "timeout": read_timeout})


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RewardServer:
    """A running reward server: ``url``, :meth:`close`, usable as a context manager."""

    def __init__(self, httpd: ThreadingHTTPServer, thread: threading.Thread | None) -> None:
        self.httpd, self.thread = httpd, thread
        host, port = httpd.server_address[:2]
        self.url = f"http://{host}:{port}"

    def close(self) -> None:
        """Stop serving and release the port."""
        if self.thread is not None:
            self.httpd.shutdown()
            self.thread.join()
        self.httpd.server_close()

    def __enter__(self) -> RewardServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def check_settings(host: str, token: str | None, read_timeout: float, max_batch: int,
                   max_bytes: int) -> None:
    """Refuse a bind beyond loopback without a token, and limits that are not positive, with a
    ``ConfigError`` (one line): checked before a reward is built, so nothing loads in vain."""
    from flowgrpo.errors import ConfigError

    if not is_loopback(host) and not token:
        raise ConfigError(f"--host {host} serves beyond this machine: set a token (--token or "
                          f"${TOKEN_ENV}) so only your clients can score")
    if not read_timeout > 0 or max_batch < 1 or max_bytes < 1:
        raise ConfigError("--read-timeout, --max-batch and --max-bytes must be > 0")


def serve(
    reward: Reward,
    host: str = "127.0.0.1",
    port: int = 0,
    max_batch: int = 64,
    max_bytes: int = DEFAULT_MAX_BYTES,
    token: str | None = None,
    background: bool = True,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
) -> RewardServer:
    """Serve ``reward`` on ``host:port`` (port 0: a free one); returns the server (``.url``).

    With ``background`` (default) requests are served on a daemon thread and this returns at
    once; otherwise the caller runs ``server.httpd.serve_forever()``. A ``host`` beyond loopback
    needs a ``token``; ``read_timeout``: seconds a client may take to send its request.
    """
    check_settings(host, token, read_timeout, max_batch, max_bytes)
    httpd = ThreadingHTTPServer((host, port), _handler(reward, max_batch, max_bytes, token,
                                                       read_timeout))
    httpd.daemon_threads = True
    thread = None
    if background:
        thread = threading.Thread(target=httpd.serve_forever, name="reward-server", daemon=True)
        thread.start()
    return RewardServer(httpd, thread)


def _parse_params(pairs: list[str], params_json: str | None) -> dict:
    from flowgrpo.errors import ConfigError

    try:
        params = json.loads(params_json) if params_json else {}
    except json.JSONDecodeError as err:
        raise ConfigError(f"--params is not valid JSON ({err.msg} at column {err.colno}): "
                          f"{params_json!r}") from None
    if not isinstance(params, dict):
        raise ConfigError(f"--params must be a JSON object of the reward's parameters, got "
                          f"{params_json!r}")
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--param expects key=value, got {pair!r}")
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value  # a bare string
    return params


def build_parser() -> argparse.ArgumentParser:
    """The ``flowgrpo serve-reward`` arguments (``--host`` defaults to loopback)."""
    parser = argparse.ArgumentParser(
        prog="flowgrpo serve-reward", description="Serve a registered reward over HTTP."
    )
    parser.add_argument("--reward", required=True, help="registered reward name (e.g. pickscore)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="reward parameter; VALUE is parsed as JSON when it is valid JSON")
    parser.add_argument("--params", help="reward parameters as one JSON object")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    parser.add_argument("--port", type=int, default=0, help="port (0: pick a free one)")
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                        help=f"require 'Authorization: Bearer TOKEN' (default ${TOKEN_ENV})")
    parser.add_argument("--max-batch", type=int, default=64, help="largest batch accepted")
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES,
                        help="largest request body accepted, in bytes")
    parser.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT,
                        help="seconds a client may take to send its request (default "
                        f"{DEFAULT_READ_TIMEOUT:g})")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``flowgrpo serve-reward``: build a registered reward and serve it until interrupted."""
    from .mix import build_reward

    args = build_parser().parse_args(argv)
    check_settings(args.host, args.token, args.read_timeout, args.max_batch, args.max_bytes)
    reward = build_reward(args.reward, _parse_params(args.param, args.params))
    server = serve(reward, args.host, args.port, args.max_batch, args.max_bytes, args.token,
                   background=False, read_timeout=args.read_timeout)
    print(server.url, flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0
