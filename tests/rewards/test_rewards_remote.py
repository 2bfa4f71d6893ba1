"""The reward server and the ``remote`` client on loopback, and the async reward pool."""

from __future__ import annotations

import inspect
import json
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest
import torch

import reward_models
from helpers.http_stub import StubHandler, serving
from reward_models import Media, RewardFault, RewardOutput
from reward_models import remote as remote_module
from reward_models.async_pool import AsyncReward
from reward_models.remote import RemoteRejected, RemoteReward
from reward_models.server import _parse_params, build_parser, serve

try:  # the shipped digit classifier, when its module is present
    from reward_models.digits import digit_reward
except ImportError:  # pragma: no cover - only while the module is missing
    digit_reward = None


class Loudness:
    """RMS per audio clip (a deterministic audio reward)."""

    def __call__(self, media, prompts, metadata):
        if media.kind != "audio":
            raise ValueError(f"loudness scores audio media, got {media.kind} media")
        return RewardOutput(media.data.float().pow(2).mean(dim=(1, 2)).sqrt())


def served_reward():
    """``digit`` when it exists, else a deterministic brightness-times-prompt-length reward."""
    if digit_reward is not None:
        return digit_reward()

    def reward(media, prompts, metadata):
        lengths = torch.tensor([len(p) for p in prompts], dtype=torch.float32)
        return RewardOutput(media.data.float().mean(dim=(1, 2, 3)) * lengths)

    return reward


def images(n: int = 4, size: int = 16, seed: int = 0) -> torch.Tensor:
    """8-bit-exact images (PNG transport is lossless on them)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), generator=gen).float() / 255


PROMPTS = ["the digit 3", "the digit 7", "a 1", "number 0"]
META = [{"group": 0}, {"group": 0}, {"group": 1}, {"group": 1}]


def post(url: str, data: bytes, headers: dict | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(url + "/score", data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_remote_equals_in_process_for_images_regions_and_audio():
    local = served_reward()
    with serve(local) as server:
        remote = reward_models.get("remote", url=server.url)
        media = Media("image", images())
        assert torch.equal(remote(media, PROMPTS, META).scores, local(media, PROMPTS, META).scores)
        health = json.loads(urllib.request.urlopen(server.url + "/health", timeout=10).read())
        assert health["status"] == "ok"
    region = reward_models.get("mix", components=[
        {"name": reward_models.get("region", inner=local, grid=(2, 2)), "key": "r"}])
    meta = [dict(m, boxes=[[0, 0, 0.5, 1]]) for m in META]
    with serve(region) as server:
        got = reward_models.get("remote", url=server.url)(media, PROMPTS, meta)
    want = region(media, PROMPTS, meta)
    assert torch.equal(got.regions, want.regions) and torch.equal(got.scores, want.scores)
    assert torch.equal(got.components["r"], want.components["r"])
    audio = Media("audio", torch.rand(2, 2, 500) - 0.5, sample_rate=16000)
    with serve(Loudness()) as server:
        got = reward_models.get("remote", url=server.url)(audio, ["a", "b"], [{}, {}])
    assert torch.equal(got.scores, Loudness()(audio, ["a", "b"], [{}, {}]).scores)


def test_remote_retries_then_names_the_url(monkeypatch):
    server = serve(served_reward())
    url = server.url
    server.close()
    sleeps = []
    monkeypatch.setattr(remote_module.time, "sleep", sleeps.append)
    remote = reward_models.get("remote", url=url, retries=2, backoff=0.25, timeout=2, check=False)
    with pytest.raises(RewardFault) as info:
        remote(Media("image", images()), PROMPTS, META)
    assert str(info.value) == (
        f"remote reward {url}/score: connection refused (after 3 attempts)")
    assert sleeps == [0.25, 0.5]


def test_server_refuses_bad_requests_and_keeps_serving():
    with serve(served_reward(), max_batch=4, max_bytes=20_000) as server:
        code, body = post(server.url, b"{not json")
        assert code == 400 and "malformed" in body["error"]
        code, body = post(server.url, json.dumps({"kind": "image"}).encode())
        assert code == 400 and "missing fields" in body["error"]
        code, body = post(server.url, b" " * 30_000)
        assert code == 413 and "max_bytes" in body["error"]
        code, body = post(server.url, json.dumps(
            {"kind": "image", "media": ["x"] * 5, "prompts": ["p"] * 5}).encode())
        assert code == 413 and "max_batch" in body["error"]
        code, body = post(server.url, json.dumps(
            {"kind": "image", "media": ["%%%"], "prompts": ["the digit 1"]}).encode())
        assert code == 400
        remote = reward_models.get("remote", url=server.url, retries=0)
        with pytest.raises(RemoteRejected, match="HTTP 400 .*audio") as info:
            remote(Media("audio", torch.zeros(1, 1, 100), 8000), ["the digit 1"], [{}])
        assert isinstance(info.value, ValueError)  # as the reward's own error is in process
        media = Media("image", images())
        assert torch.equal(remote(media, PROMPTS, META).scores,
                           served_reward()(media, PROMPTS, META).scores)


def test_bearer_token():
    with serve(served_reward(), token="s3cret") as server:
        media = Media("image", images())
        for token in (None, "wrong"):
            with pytest.raises(RewardFault) as info:
                reward_models.get("remote", url=server.url, token=token)(media, PROMPTS, META)
            assert str(info.value) == (
                f"remote reward {server.url}/score: HTTP 401 'missing or wrong bearer token'")
        code, body = post(server.url, b"{}", {"Authorization": "Bearer wrong"})
        assert code == 401
        good = reward_models.get("remote", url=server.url, token="s3cret")
        assert good(media, PROMPTS, META).scores.shape == (4,)


def test_server_binds_loopback_by_default():
    assert inspect.signature(serve).parameters["host"].default == "127.0.0.1"
    assert build_parser().parse_args(["--reward", "digit"]).host == "127.0.0.1"
    with serve(served_reward()) as server:
        assert server.httpd.server_address[0] == "127.0.0.1"
        assert server.url.startswith("http://127.0.0.1:")


def test_serve_reward_command_prints_url_and_serves():
    assert _parse_params(["a=1", "b=x", "c=[1, 2]"], '{"d": true}') == {
        "d": True, "a": 1, "b": "x", "c": [1, 2]}
    code = "from reward_models.server import main; main(['--reward', 'ocr', '--param=threads=1'])"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        health = json.loads(urllib.request.urlopen(url + "/health", timeout=10).read())
        assert health["status"] == "ok"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_async_reward_matches_sync_and_copies_inputs():
    reward = served_reward()
    media = Media("image", images(seed=1))
    expected = reward(media, PROMPTS, META).scores
    release = threading.Event()

    def slow(m, p, md):
        release.wait(5)
        return reward(m, p, md)

    with AsyncReward(slow, workers=1) as pool:
        first = pool.submit(media, PROMPTS, META)
        second = pool.submit(Media("image", images(seed=2)), PROMPTS, META)
        media.data.zero_()  # the trainer reuses its buffer before the reward has run
        release.set()
        assert torch.equal(first.result().scores, expected)
        assert torch.equal(second.result().scores,
                           reward(Media("image", images(seed=2)), PROMPTS, META).scores)

    def broken(m, p, md):
        raise RuntimeError("reward exploded")

    with AsyncReward(broken) as pool, pytest.raises(RuntimeError, match="exploded"):
        pool.submit(Media("image", images()), PROMPTS, META).result()


# --- failures of the remote reward, against a misbehaving server -------------------------------


class _Misbehaving(StubHandler):
    """A reward server that answers ``server.health`` to GET /health and ``server.mode`` to POST
    /score; ``server.busy`` 503s come first. "hang" waits until the test ends."""

    def do_GET(self):  # noqa: N802 - the name http.server dispatches to
        if self.server.health == "hang":
            self.server.release.wait(10)
        elif self.server.health == "missing":
            self.send(404, b'{"error": "no /health here"}')
        else:
            self.send(200, b'{"status": "ok", "groupwise": false, "max_batch": 64}')

    def do_POST(self):  # noqa: N802
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.posts += 1
        n, mode = len(body["prompts"]), server.mode
        if server.busy > 0:
            server.busy -= 1
            self.send(503, b'{"error": "warming up"}')
        elif mode == "hang":
            server.release.wait(10)
        elif mode == "boom":
            self.send(500, b"boom", "text/plain")
        elif mode == "long":
            self.send(500, ("line one\nline two " + "x" * 500).encode(), "text/plain")
        elif mode == "garbage":
            self.send(200, b"<html>garbage</html>", "text/html")
        elif mode == "no scores":
            self.send(200, b'{"score": [1, 2]}')
        elif mode == "short":
            self.send(200, json.dumps({"scores": [0.5] * (n - 1)}).encode())
        elif mode == "nan":
            self.send(200, json.dumps({"scores": [float("nan")] + [0.5] * (n - 1)}).encode())
        else:
            self.send(200, json.dumps({"scores": [0.5] * n}).encode())


@pytest.fixture
def bad_server() -> Iterator[ThreadingHTTPServer]:
    with serving(_Misbehaving, lambda httpd: httpd.release.set(), health="ok", mode="ok",
                 busy=0, posts=0, release=threading.Event()) as httpd:
        yield httpd


def _base(httpd: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}"


def _fault(reward, n: int = 4) -> RewardFault:
    with pytest.raises(RewardFault) as info:
        reward(Media("image", images(n)), PROMPTS[:n], META[:n])
    return info.value


def test_remote_failures_are_one_line_naming_the_url(bad_server, monkeypatch):
    monkeypatch.setattr(remote_module.time, "sleep", lambda s: None)
    url = _base(bad_server) + "/score"
    remote = reward_models.get("remote", url=_base(bad_server), retries=3)
    bad_server.mode = "boom"
    assert str(_fault(remote)) == f"remote reward {url}: HTTP 500 'boom'"
    bad_server.mode = "garbage"
    assert str(_fault(remote)) == f"remote reward {url}: reply is not JSON ('<html>garbage</html>')"
    bad_server.mode = "no scores"
    assert str(_fault(remote)) == (
        f"remote reward {url}: reply is not a reward output ('{{\"score\": [1, 2]}}')")
    bad_server.mode = "short"
    err = _fault(remote)
    assert str(err) == f"remote reward {url} returned 3 scores for 4 samples"
    assert err.reward == f"remote reward {url}" and err.bad is None
    assert bad_server.posts == 4  # none of these is retried
    bad_server.mode = "nan"  # passed on as it came, for the caller's check_output to mark
    out = remote(Media("image", images()), PROMPTS, META)
    with pytest.raises(RewardFault) as info:
        reward_models.check_output(remote.name, out, 4)
    assert str(info.value) == f"remote reward {url} returned 1 NaN of 4"
    assert info.value.bad.tolist() == [True, False, False, False]

    bad_server.mode = "long"
    message = str(_fault(remote))
    prefix = f"remote reward {url}: HTTP 500 'line one line two xxx"
    assert message.startswith(prefix) and message.endswith("...'") and "\n" not in message
    assert len(message) == len(f"remote reward {url}: HTTP 500 ''") + 200 + 3


def test_remote_retries_busy_answers_then_scores(bad_server, monkeypatch):
    sleeps = []
    monkeypatch.setattr(remote_module.time, "sleep", sleeps.append)
    remote = reward_models.get("remote", url=_base(bad_server), retries=2, backoff=0.1)
    bad_server.busy = 2
    assert remote(Media("image", images()), PROMPTS, META).scores.tolist() == [0.5] * 4
    assert bad_server.posts == 3 and sleeps == [0.1, 0.2]
    bad_server.busy = 3
    assert str(_fault(remote)) == (
        f"remote reward {_base(bad_server)}/score: HTTP 503 'warming up' (after 3 attempts)")


def test_remote_reports_a_hung_server_after_one_timeout(bad_server, monkeypatch):
    assert inspect.signature(RemoteReward).parameters["timeout"].default == 30.0
    sleeps = []
    monkeypatch.setattr(remote_module.time, "sleep", sleeps.append)
    remote = reward_models.get("remote", url=_base(bad_server), timeout=0.2, retries=3)
    bad_server.mode = "hang"
    assert str(_fault(remote)) == (
        f"remote reward {_base(bad_server)}/score: no answer within 0.2 s")
    assert bad_server.posts == 1 and sleeps == []  # a hung server is not asked again


def test_remote_refused_connection(monkeypatch):
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(RewardFault) as info:
        reward_models.get("remote", url=url)
    assert str(info.value) == f"remote reward {url}/score: server unreachable (connection refused)"
    remote = reward_models.get("remote", url=url, retries=0, check=False)
    assert str(_fault(remote)) == f"remote reward {url}/score: connection refused"


def test_remote_checks_the_server_at_construction(bad_server):
    url = _base(bad_server)
    bad_server.health = "hang"
    with pytest.raises(RewardFault) as info:
        RemoteReward(url, timeout=0.2)
    assert str(info.value) == (
        f"remote reward {url}/score: server unreachable (no answer within 0.2 s)")
    bad_server.health = "missing"
    with pytest.raises(RewardFault) as info:
        RemoteReward(url + "/score/")
    assert str(info.value) == (
        f"remote reward {url}/score: health check got HTTP 404 'no /health here'")
    RemoteReward(url, check=False)  # no probe: nothing is sent
    assert bad_server.posts == 0
    with pytest.raises(ValueError, match="http://"):
        RemoteReward("127.0.0.1:8000", check=False)
