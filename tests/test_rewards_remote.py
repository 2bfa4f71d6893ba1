"""The reward server and the ``remote`` client on loopback, and the async reward pool."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
import torch

import reward_models
from reward_models import Media, RewardOutput
from reward_models import remote as remote_module
from reward_models.async_pool import AsyncReward
from reward_models.server import _parse_params, serve

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
    remote = reward_models.get("remote", url=url, retries=2, backoff=0.25, timeout=2)
    with pytest.raises(ConnectionError, match=f"{url}/score.*3 attempts"):
        remote(Media("image", images()), PROMPTS, META)
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
        with pytest.raises(ValueError, match="audio"):  # the reward's own error, relayed
            remote(Media("audio", torch.zeros(1, 1, 100), 8000), ["the digit 1"], [{}])
        media = Media("image", images())
        assert torch.equal(remote(media, PROMPTS, META).scores,
                           served_reward()(media, PROMPTS, META).scores)


def test_bearer_token():
    with serve(served_reward(), token="s3cret") as server:
        media = Media("image", images())
        for token in (None, "wrong"):
            with pytest.raises(PermissionError, match="token"):
                reward_models.get("remote", url=server.url, token=token)(media, PROMPTS, META)
        code, body = post(server.url, b"{}", {"Authorization": "Bearer wrong"})
        assert code == 401
        good = reward_models.get("remote", url=server.url, token="s3cret")
        assert good(media, PROMPTS, META).scores.shape == (4,)


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
