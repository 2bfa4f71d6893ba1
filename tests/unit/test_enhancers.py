"""Condition enhancers: the template enhancer, user callables, and the remote client on loopback."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest

from flowgrpo.registry import UnknownNameError
from flowgrpo.rl import enhancers
from helpers.http_stub import StubHandler, serving

PROMPTS = ["a red dog on a beach", "two cats", "a red car near a dog"]


# --- registry -------------------------------------------------------------------------------


def test_names_and_unknown_name():
    assert {"callable", "remote", "template"} <= set(enhancers.names())
    with pytest.raises(UnknownNameError, match="valid names: .*template"):
        enhancers.get("tempalte")


def test_unknown_parameter_names_it_and_the_valid_ones():
    with pytest.raises(ValueError) as info:
        enhancers.get("template", templates=["{prompt}!"], synonym={"a": ["b"]})
    message = str(info.value)
    assert "\n" not in message
    assert "synonym" in message and "valid parameters: templates, synonyms" in message


def test_missing_parameter_is_named():
    with pytest.raises(ValueError, match="missing parameter.*url"):
        enhancers.get("remote", timeout=1.0)


# --- template -------------------------------------------------------------------------------


def test_template_exact_count_and_deterministic_per_seed():
    enhancer = enhancers.get("template")
    for num_views in (0, 1, 3, 8, 20):
        views = enhancer(PROMPTS, num_views, seed=5)
        assert len(views) == len(PROMPTS)
        assert all(len(row) == num_views and all(isinstance(v, str) for v in row) for row in views)
    assert enhancer(PROMPTS, 4, seed=5) == enhancers.get("template")(PROMPTS, 4, seed=5)


def test_template_views_vary_across_seeds():
    enhancer = enhancers.get("template")
    outputs = {json.dumps(enhancer(PROMPTS, 3, seed=s)) for s in range(10)}
    assert len(outputs) > 1


def test_template_views_are_distinct_and_exclude_the_prompt():
    enhancer = enhancers.get("template")
    for prompt, row in zip(PROMPTS, enhancer(PROMPTS, 5, seed=0)):
        assert len(set(row)) == 5
        assert prompt not in row
        assert all(prompt in view for view in row)  # neutral templates keep the prompt intact


def test_templates_and_synonyms_are_applied():
    enhancer = enhancers.get(
        "template",
        templates=["{prompt}, high quality", "a picture of {prompt}"],
        synonyms={"dog": ["puppy"], "Red": ["crimson"], "cat": ["kitten"]},
    )
    expected = {
        "a red dog on a beach, high quality",
        "a picture of a red dog on a beach",
        "a red puppy on a beach, high quality",
        "a picture of a red puppy on a beach",
        "a crimson dog on a beach, high quality",
        "a picture of a crimson dog on a beach",
    }
    assert set(enhancer.candidates("a red dog on a beach")) == expected
    assert set(enhancer(["a red dog on a beach"], 6, seed=3)[0]) == expected
    # Whole words only: "cat" must not touch "cats" or "scatter".
    assert all("kitten" not in c for c in enhancer.candidates("two cats scatter"))


def test_template_cycles_when_views_outnumber_captions():
    enhancer = enhancers.get("template", templates=["a picture of {prompt}", "{prompt}, 4k"])
    row = enhancer(["a boat"], 5, seed=1)[0]
    assert len(row) == 5 and set(row) == {"a picture of a boat", "a boat, 4k"}
    assert row[2:4] == row[0:2] and row[4] == row[0]


def test_template_with_no_candidate_repeats_the_prompt():
    enhancer = enhancers.get("template", templates=["{prompt}"])
    assert enhancer(["a boat"], 2, seed=0) == [["a boat", "a boat"]]


def test_template_rejects_bad_parameters_and_requests():
    with pytest.raises(ValueError, match="must contain"):
        enhancers.get("template", templates=["no placeholder"])
    with pytest.raises(ValueError, match="must be a list of strings"):
        enhancers.get("template", synonyms={"dog": "puppy"})
    enhancer = enhancers.get("template")
    with pytest.raises(ValueError, match="num_views"):
        enhancer(PROMPTS, -1, seed=0)
    with pytest.raises(ValueError, match="prompts"):
        enhancer("a dog", 1, seed=0)


# --- callable -------------------------------------------------------------------------------

USER_MODULE = """
def shout(prompts, num_views, seed):
    return [[f"{p.upper()} #{seed}.{k}" for k in range(num_views)] for p in prompts]

def too_few(prompts, num_views, seed):
    return [["only one"] for p in prompts]

def not_strings(prompts, num_views, seed):
    return [[k for k in range(num_views)] for p in prompts]

NOT_CALLABLE = 3
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "user_views.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_views"


@pytest.mark.parametrize("sep", [":", "."])
def test_callable_runs_a_user_function(user_module, sep):
    enhancer = enhancers.get("callable", target=f"{user_module}{sep}shout")
    assert enhancer(["a dog", "a cat"], 2, seed=7) == [
        ["A DOG #7.0", "A DOG #7.1"],
        ["A CAT #7.0", "A CAT #7.1"],
    ]


@pytest.mark.parametrize(
    ("target", "match"),
    [
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        ("user_views:missing", "has no 'missing'"),
        ("user_views:NOT_CALLABLE", "not callable"),
        ("justaname", "must look like"),
    ],
)
def test_callable_bad_target_is_one_line(user_module, target, match):
    with pytest.raises(ValueError, match=match) as info:
        enhancers.get("callable", target=target)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("function", "match"),
    [("too_few", "got 1 views, expected exactly 3"), ("not_strings", "must be a list of strings")],
)
def test_callable_bad_output_is_one_line(user_module, function, match):
    enhancer = enhancers.get("callable", target=f"{user_module}:{function}")
    with pytest.raises(ValueError, match=match) as info:
        enhancer(["a dog"], 3, seed=0)
    assert "\n" not in str(info.value) and function in str(info.value)


def test_check_views_wrong_number_of_prompts():
    with pytest.raises(ValueError, match=r"one list of captions per prompt \(2\), got 1 items"):
        enhancers.check_views([["x"]], ["a", "b"], 1, "test")


# --- remote ---------------------------------------------------------------------------------


class _Handler(StubHandler):
    """Answers like an LLM enhancer would; ``server.fail_first`` 503s to exercise the retry."""

    def do_POST(self):  # noqa: N802 - the name http.server dispatches to
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.requests.append((body, self.headers.get("Authorization")))
        if server.fail_first > 0:
            server.fail_first -= 1
            self.send(503, {"error": "warming up"})
        elif body["prompts"] == ["bad"]:
            self.send(200, {"views": [["only one"]]})
        elif body["prompts"] == ["refuse"]:
            self.send(400, {"error": "prompt too long"})
        else:
            n, seed = body["num_views"], body["seed"]
            self.send(
                200, {"views": [[f"{p} v{k} s{seed}" for k in range(n)] for p in body["prompts"]]}
            )


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    with serving(_Handler, requests=[], fail_first=0) as httpd:
        yield httpd


def _url(httpd: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}/enhance"


def test_remote_round_trip_sends_the_contract(server):
    enhancer = enhancers.get("remote", url=_url(server), timeout=5, token="sesame")
    views = enhancer(["a dog", "a cat"], 2, seed=11)
    assert views == [["a dog v0 s11", "a dog v1 s11"], ["a cat v0 s11", "a cat v1 s11"]]
    body, auth = server.requests[-1]
    assert body == {"prompts": ["a dog", "a cat"], "num_views": 2, "seed": 11}
    assert auth == "Bearer sesame"


def test_remote_retries_a_busy_server(server):
    server.fail_first = 2
    enhancer = enhancers.get("remote", url=_url(server), timeout=5, retries=2, backoff=0.01)
    assert enhancer(["a dog"], 1, seed=0) == [["a dog v0 s0"]]
    assert len(server.requests) == 3


def test_remote_bad_answer_and_refusal_are_not_retried(server):
    enhancer = enhancers.get("remote", url=_url(server), timeout=5, retries=3, backoff=0.01)
    with pytest.raises(ValueError, match="got 1 views, expected exactly 2"):
        enhancer(["bad"], 2, seed=0)
    with pytest.raises(ValueError, match="HTTP 400.*prompt too long"):
        enhancer(["refuse"], 2, seed=0)
    assert len(server.requests) == 2


def test_remote_unreachable_raises_connection_error_naming_the_url():
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/enhance"
    enhancer = enhancers.get("remote", url=url, timeout=0.5, retries=2, backoff=0.01)
    with pytest.raises(ConnectionError, match="after 3 attempts") as info:
        enhancer(["a dog"], 1, seed=0)
    assert url in str(info.value) and "\n" not in str(info.value)
