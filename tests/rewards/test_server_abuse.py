"""The reward server under abuse and load, on loopback: every bad request is a 4xx and the
next good request still gets the in-process scores; a body-size limit is enforced before the
body is read, a client that sends half a request and stalls is dropped after the read timeout
while others are served, 20 concurrent clients all get their own correct scores, and the
server binds beyond loopback only when told to, with a token."""

from __future__ import annotations

import base64
import io
import json
import select
import socket
import struct
import threading
import zlib

import pytest
import torch

import reward_models
from flowgrpo.cli.main import main as flowgrpo
from flowgrpo.errors import ConfigError
from reward_models import Media, RewardOutput
from reward_models.media import media_from_wire, media_to_wire
from reward_models.server import TOKEN_ENV, encode_request, serve


def brightness(media, prompts, metadata):
    """Mean pixel value times the prompt's length (depends on both inputs)."""
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.float32)
    return RewardOutput(media.data.float().mean(dim=(1, 2, 3)) * lengths)


def images(n: int, seed: int = 0) -> torch.Tensor:
    """Random images as the wire carries them (8 bits), so in-process scores are the same."""
    data = torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
    return media_from_wire("image", media_to_wire(Media("image", data))).data


def raw(url: str, request: bytes, timeout: float = 30) -> tuple[int, dict]:
    """Send ``request`` bytes as they are; the status and JSON body of the answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body or b"{}")


def http(body: bytes, headers: dict[str, str] | None = None, path: str = "/score") -> bytes:
    fields = {"Host": "x", "Content-Type": "application/json",
              "Content-Length": str(len(body)), "Connection": "close", **(headers or {})}
    lines = [f"POST {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in fields.items() if v is not None]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def good_body(n: int = 3, seed: int = 0) -> tuple[bytes, torch.Tensor]:
    media = Media("image", images(n, seed))
    prompts = [f"prompt {i}" * (i + 1) for i in range(n)]
    expected = brightness(media, prompts, [{}] * n).scores
    return encode_request(media, prompts, [{}] * n), expected


def assert_still_serves(url: str) -> None:
    body, expected = good_body()
    code, answer = raw(url, http(body))
    assert code == 200
    assert torch.allclose(torch.tensor(answer["scores"]), expected, atol=1e-5)


def png(width: int, height: int) -> str:
    """A black PNG of that size, base64."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height)).save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


def png_header(width: int, height: int) -> str:
    """A PNG that only claims its size (no pixels): a few bytes, a decompression bomb's header."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")
    return base64.b64encode(data).decode()


def wav(fmt: bytes) -> str:
    """A WAV with this fmt chunk and four bytes of data, base64."""
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack(
        "<I", 4) + b"\0" * 4
    return base64.b64encode(b"RIFF" + struct.pack("<I", len(body)) + body).decode()


def score(kind: str, media: list, n: int = 1) -> bytes:
    return http(json.dumps({"kind": kind, "media": media, "prompts": ["p"] * n}).encode())


WIRE = media_to_wire(Media("image", images(1)))
ABUSE = [
    ("malformed_json", http(b"{not json"), 400, "malformed"),
    ("json_not_an_object", http(b"[1, 2]"), 400, "malformed"),
    ("missing_fields", http(json.dumps({"kind": "image"}).encode()), 400, "missing fields"),
    ("wrong_field_type", http(json.dumps({"kind": "image", "media": 5, "prompts": "p"})
                              .encode()), 400, ""),
    ("bad_base64", http(json.dumps({"kind": "image", "media": ["%%%"], "prompts": ["p"]})
                        .encode()), 400, ""),
    ("wrong_content_type", http(b"kind=image", {"Content-Type": "text/plain"}), 415,
     "application/json"),
    ("form_content_type", http(b"{}", {"Content-Type": "application/x-www-form-urlencoded"}),
     415, "application/json"),
    ("no_content_length", http(b"{}", {"Content-Length": None}), 411, "Content-Length"),
    ("oversized_body", http(b" " * 20000), 413, "max_bytes"),
    ("announced_oversized", http(b"", {"Content-Length": str(10**12)}), 413, "max_bytes"),
    ("huge_batch", http(json.dumps({"kind": "image", "media": WIRE * 9,
                                    "prompts": ["p"] * 9}).encode()), 413, "max_batch"),
    ("unknown_path", http(b"{}", path="/admin"), 404, "/score"),
    ("deeply_nested_json", http(b"[" * 5000 + b"]" * 5000), 400, "nested too deep"),
    ("ragged_video_frames", score("video", [[png(8, 8), png(9, 9)]]), 400, "one shape"),
    ("ragged_images", score("image", [png(8, 8), png(9, 9)], 2), 400, "one shape"),
    ("png_bomb_header", score("image", [png_header(20000, 20000)]), 400, "decompression bomb"),
    ("wav_short_fmt", score("audio", [wav(b"\x01\x00")]), 400, "fmt chunk"),
    ("wav_zero_channels", score("audio", [wav(struct.pack("<HHIIHH", 3, 0, 8000, 0, 0, 32))]),
     400, "0 channels"),
    ("chunked", http(b"2\r\n{}\r\n0\r\n\r\n",
                     {"Content-Length": None, "Transfer-Encoding": "chunked"}), 411,
     "Transfer-Encoding"),
    ("chunked_with_length", http(b"2\r\n{}\r\n0\r\n\r\n", {"Transfer-Encoding": "chunked"}),
     411, "Transfer-Encoding"),
    ("negative_length", http(b"", {"Content-Length": "-5"}), 400, "Content-Length"),
    ("length_not_a_number", http(b"{}", {"Content-Length": "two"}), 400, "Content-Length"),
    ("length_with_underscore", http(b"{}", {"Content-Length": "0_2"}), 400, "Content-Length"),
    ("two_lengths", http(b"{}", {"Content-Length": "2\r\nContent-Length: 1"}), 400,
     "Content-Length"),
]


@pytest.fixture(scope="module")
def server():
    with serve(brightness, max_batch=8, max_bytes=4096 * 4, read_timeout=0.5) as running:
        yield running


@pytest.mark.parametrize("request_bytes,code,needle", [a[1:] for a in ABUSE],
                         ids=[a[0] for a in ABUSE])
def test_a_bad_request_is_a_4xx_and_the_server_keeps_serving(server, request_bytes, code,
                                                             needle):
    got, answer = raw(server.url, request_bytes)
    assert got == code, answer
    assert needle in answer.get("error", ""), answer
    assert_still_serves(server.url)


def test_charset_parameters_are_json_too(server):
    body, expected = good_body()
    code, answer = raw(server.url, http(body, {"Content-Type": "application/json; charset=utf-8"}))
    assert code == 200 and torch.allclose(torch.tensor(answer["scores"]), expected, atol=1e-5)


def test_a_stalled_half_request_is_dropped_while_others_are_served(server):
    host, port = server.url.removeprefix("http://").split(":")
    stalled = socket.create_connection((host, int(port)), timeout=30)
    try:
        stalled.sendall(http(b"", {"Content-Length": "1000"}) + b'{"kind": "im')  # then nothing
        assert_still_serves(server.url)  # another client, while the stalled one is open
        data = b""
        while chunk := stalled.recv(65536):  # the server answers 408 and closes
            data += chunk
        assert data.split()[1] == b"408", data
    finally:
        stalled.close()
    # headers that never finish: the connection is closed too
    stalled = socket.create_connection((host, int(port)), timeout=30)
    try:
        stalled.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")
        assert_still_serves(server.url)
        assert stalled.recv(65536) == b""  # closed by the server
    finally:
        stalled.close()


def test_a_trickled_request_is_dropped_at_one_deadline(server):
    """A byte now and then, each well within the read timeout: the whole request still has to
    arrive within it, so the server answers 408 long before the body is complete."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(http(b"", {"Content-Length": "400"}))
        for _ in range(400):  # stop as soon as the server answers
            if select.select([sock], [], [], 0.02)[0]:
                break
            sock.sendall(b" ")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.split()[1] == b"408", data
    assert_still_serves(server.url)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /score HTTP/1.1\r\nX-Slow: ")  # headers that trickle, never end
        for _ in range(400):
            if select.select([sock], [], [], 0.02)[0]:
                break
            sock.sendall(b"x")
        assert sock.recv(65536) == b""  # closed by the server, without an answer


def test_twenty_concurrent_clients_each_get_their_own_scores(server):
    remote = reward_models.get("remote", url=server.url, retries=0)
    results: dict[int, bool] = {}

    def client(i: int) -> None:
        media = Media("image", images(4, seed=i))
        prompts = [f"client {i} sample {j}" for j in range(4)]
        got = remote(media, prompts, [{}] * 4).scores
        results[i] = torch.allclose(got, brightness(media, prompts, [{}] * 4).scores, atol=1e-5)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == {i: True for i in range(20)}


def test_beyond_loopback_only_when_told_and_with_a_token():
    with pytest.raises(ConfigError, match="--host 0.0.0.0 serves beyond this machine"):
        serve(brightness, host="0.0.0.0")
    with serve(brightness, host="0.0.0.0", token="s3cret") as running:
        assert running.httpd.server_address[0] == "0.0.0.0"
    with serve(brightness, host="127.0.0.2") as running:
        assert running.url


def test_serve_reward_refuses_a_remote_host_without_a_token_in_one_line(monkeypatch, capsys):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    for args, needle in ((["--host", "0.0.0.0"], "--host 0.0.0.0 serves beyond this machine"),
                         (["--host", "192.168.1.7"], "set a token"),
                         (["--read-timeout", "0"], "--read-timeout")):
        assert flowgrpo(["serve-reward", "--reward", "nope", *args]) == 2  # before the reward
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err
