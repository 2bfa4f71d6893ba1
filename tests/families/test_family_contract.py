"""The contract every registered family passes with the unchanged trainer
(:func:`flowgrpo.testing.check_family_contract`): load from a folder, encode, roll out with each
stochastic sampler (ratio 1 before any update), decode, reward, one LoRA training step that
changes only the LoRA weights, and a checkpoint whose LoRA loads back into a fresh pipeline."""

from __future__ import annotations

import pytest
import torch

import pipelines
from flowgrpo.testing import check_family_contract
from helpers.family_cases import CASES

# Optional extras run the same contract in their own test file, which skips without the extra.
# A family whose tiny pipeline does not fit the shared parity tests runs the contract there too.
OWN_CONTRACT = {"f5_tts": "tests/families/test_f5_tts.py::test_family_contract",
                "flux2_klein": "tests/families/test_families_editing.py::test_family_contract"}


def test_every_registered_family_has_a_contract_case():
    missing = set(pipelines.names()) - set(CASES) - set(OWN_CONTRACT)
    assert not missing, missing


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(CASES))
def test_family_contract(family, tmp_path):
    case = CASES[family]
    folder = tmp_path / "model"
    case.make().pipeline.save_pretrained(str(folder))
    check_family_contract(family, folder, case.options, tmp_path)


@pytest.mark.parametrize("family", sorted(CASES))
def test_per_prompt_encodings_concatenate_to_the_batchs(family):
    """A family that declares ``per_prompt_encoding`` lets the session encode each prompt alone
    and concatenate the encodings (and cache them): that must equal encoding the batch."""
    adapter = CASES[family].make()
    if not adapter.per_prompt_encoding:
        pytest.skip(f"{family} encodes a batch at once (per_prompt_encoding is False)")
    prompts = ["a photo of a cat", "two dogs playing in the snow at night"]
    together = adapter.encode(prompts)
    apart = pipelines.Cond.cat([adapter.encode([p]) for p in prompts])
    assert together.tensors.keys() == apart.tensors.keys()
    for k, v in together.tensors.items():
        torch.testing.assert_close(apart.tensors[k], v, rtol=0, atol=1e-6)
