"""The contract every registered family passes with the unchanged trainer
(:func:`flowgrpo.testing.check_family_contract`): load from a folder, encode, roll out with each
stochastic sampler (ratio 1 before any update), decode, reward, one LoRA training step that
changes only the LoRA weights, and a checkpoint whose LoRA loads back into a fresh pipeline."""

from __future__ import annotations

import pytest

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
