"""A token model that is not in flowgrpo plugs in from its own file, as a continuous one does:
``model.family: grid_tokens.py:GridTokens`` loads a :class:`~pipelines.DiscreteAdapter` written
here into a folder, which keeps the family contract and trains with the ``ctmc`` sampler and the
token objectives (``dflow_grpo``, ``udm_grpo``) through the unchanged trainer (docs/adapters.md,
"Discrete families")."""

from __future__ import annotations

import sys

import pytest
import torch

import pipelines
import samplers
from flowgrpo.testing import check_family_contract
from helpers.tiny_discrete import tiny_discrete_trainer
from helpers.toy import assert_ratio_one

# The plug-in's file: a per-position logits model over 4 gray levels on a 2x2 grid, with a
# masked path (the mask is state 4, S = 5) or a uniform one (S = 4), saved as a folder of
# config.json and safetensors weights, decoded to 2x2 gray images.
FAMILY_FILE = '''
import json
from pathlib import Path

import torch
from torch import nn

from pipelines import Cond, DiscreteAdapter
from pipelines.base import PeftLoraFiles, guided_call
from samplers import TokenPath

LEVELS, SIDE = 4, 2
NULL = 2  # the unconditional label of classifier-free guidance


class GridTokenModel(nn.Module):
    """(tokens [B, 4], sigma [B], label [B]) -> logits [B, 4, num_states], each position's from
    its own token, its position, the noise level and the label."""

    def __init__(self, num_states: int, dim: int = 8) -> None:
        super().__init__()
        self.num_states = num_states
        self.tokens = nn.Embedding(num_states, dim)
        self.position = nn.Parameter(torch.randn(1, SIDE * SIDE, dim))
        self.label = nn.Embedding(NULL + 1, dim)
        self.time = nn.Linear(1, dim)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, num_states)

    def forward(self, tokens, sigma, label):
        c = self.time(sigma.float()[:, None]) + self.label(label)
        h = self.tokens(tokens.long()) + self.position + c[:, None]
        return self.head(torch.tanh(self.proj(h)))


class GridPipeline:
    """The model and its path kind; save_pretrained writes the folder GridTokens loads."""

    def __init__(self, transformer, kind):
        self.transformer, self.kind = transformer, kind

    def to(self, device):
        self.transformer.to(device)
        return self

    def save_pretrained(self, directory):
        from safetensors.torch import save_file

        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps({"path": self.kind}))
        save_file(self.transformer.state_dict(), str(folder / "model.safetensors"))


def make_pipeline(kind="masked", seed=0):
    torch.manual_seed(seed)
    return GridPipeline(GridTokenModel(LEVELS + 1 if kind == "masked" else LEVELS), kind)


class GridTokens(PeftLoraFiles, DiscreteAdapter):
    """2x2 grids of gray levels: tokens [B, 4], images [B, 3, 2, 2] in [0, 1]."""

    token_shape = (SIDE, SIDE)
    default_lora_targets = ("proj", "head")
    text_encoder_names = ()

    def __init__(self, path_or_id, *, torch_dtype="float32"):
        from safetensors.torch import load_file

        folder = Path(path_or_id)
        kind = json.loads((folder / "config.json").read_text())["path"]
        if kind not in ("masked", "uniform"):
            raise ValueError(f"GridTokens path must be masked or uniform; got {kind!r}")
        self.path = (TokenPath("masked", LEVELS + 1, mask_id=LEVELS) if kind == "masked"
                     else TokenPath("uniform", LEVELS))
        model = GridTokenModel(self.path.num_states)
        model.load_state_dict(load_file(str(folder / "model.safetensors")))
        dtype = getattr(torch, torch_dtype) if isinstance(torch_dtype, str) else torch_dtype
        self.transformer = model.to(dtype).eval()
        self.pipeline = GridPipeline(self.transformer, kind)

    def encode(self, prompts):
        labels = torch.tensor([int(any(c in "13579" for c in p)) for p in prompts],
                              device=self.device)
        return Cond({"label": labels, "neg_label": torch.full_like(labels, NULL)})

    def logits(self, x, sigma, cond, guidance):
        return guided_call(lambda **inputs: self.transformer(**inputs).float(), guidance,
                           {"tokens": x, "sigma": sigma, "label": cond.tensors["label"]},
                           {"label": cond.tensors["neg_label"]})

    def decode(self, x):
        gray = x.long().clamp_max(LEVELS - 1).float() / (LEVELS - 1)
        return gray.reshape(-1, 1, SIDE, SIDE).expand(-1, 3, -1, -1)
'''

REFERENCE = "grid_tokens.py:GridTokens"


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The family file in ``tmp_path`` (the working folder, so the reference is relative, as a
    user writes it) and a maker of the tiny model folder of each path kind (the file's own
    ``make_pipeline``); what the registry resolves stays inside the test."""
    (tmp_path / "grid_tokens.py").write_text(FAMILY_FILE)
    monkeypatch.chdir(tmp_path)

    def folder(kind: str):
        out = tmp_path / f"model-{kind}"
        if not out.exists():
            module = sys.modules[pipelines.FAMILIES.get(REFERENCE).__module__]
            module.make_pipeline(kind).save_pretrained(str(out))
        return out

    with pipelines.FAMILIES.snapshot():
        yield folder


def test_the_reference_loads_a_discrete_family_from_its_file(plugin):
    adapter = pipelines.load(REFERENCE, str(plugin("masked")))
    assert isinstance(adapter, pipelines.DiscreteAdapter)
    assert adapter.state_space is samplers.TOKENS
    assert pipelines.FAMILIES.origin(REFERENCE).startswith("file ")
    assert REFERENCE not in pipelines.names()  # a reference is not a registered name
    x = adapter.noise(3)
    assert torch.equal(x, torch.full((3, 4), 4))  # all masks
    cond = adapter.encode(["a handwritten digit 3"] * 3)
    logits = adapter.logits(x, torch.ones(3), cond, 2.0)
    assert logits.shape == (3, 4, 5)
    assert adapter.decode(torch.tensor([[0, 1, 2, 3]])).shape == (1, 3, 2, 2)
    # the sampler steps along the file's path
    assert samplers.build("ctmc").bind(adapter).path is adapter.path


@pytest.mark.parametrize("kind", ["masked", "uniform"])
def test_the_family_from_a_file_keeps_the_contract(plugin, tmp_path, kind):
    check_family_contract(REFERENCE, plugin(kind), {}, tmp_path / f"run-{kind}", guidance=2.0)


@pytest.mark.parametrize("objective,kind", [
    ("dflow_grpo", "masked"), ("dflow_grpo", "uniform"),
    ("udm_grpo", "masked"), ("udm_grpo", "uniform"),
])
def test_the_family_from_a_file_trains_with_the_token_objectives(plugin, tmp_path, objective,
                                                                 kind, brightness_reward):
    t = tiny_discrete_trainer(tmp_path, objective, steps=6, family=REFERENCE,
                              folder=plugin(kind), reward=brightness_reward, beta=0.05)
    assert t.sampler.name == "ctmc" and t.sampler.path is t.adapter.path
    assert_ratio_one(t)
    before = {n: p.detach().clone() for n, p in t.adapter.transformer.named_parameters()}
    batch = t.sample(0)
    assert batch.traj.final.dtype == torch.long and batch.traj.final.shape == (4, 4)
    adv, _ = t.advantages(batch)
    t.update(batch, adv, 0)
    after = dict(t.adapter.transformer.named_parameters())
    changed = [n for n in before if not torch.equal(before[n], after[n].detach())]
    assert changed and all("lora_" in n for n in changed), changed
