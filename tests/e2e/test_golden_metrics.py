"""The default job and three other methods give the metrics rows recorded before the core was
restructured, key by key (``time/*`` aside).

The recorded rows live in ``tests/assets/golden_metrics.json``. A change that is meant to alter a
method's numbers re-records them on purpose, with ``python tests/e2e/test_golden_metrics.py``, and
says so in its commit message.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parents[1] / "assets" / "golden_metrics.json"
"""Not ``helpers.ASSETS``: this file also runs as a script, where ``tests/`` is not on the path."""

_COMMON = ["run.epochs=4", "run.eval_every=4", "run.save_every=0", "run.progress=false",
           "run.tensorboard=false", "data.eval_images_per_prompt=2"]
# Each job: the default config plus these overrides (the method presets of
# configs/presets/methods.yaml, written out so that the recorded job cannot drift with them).
JOBS = {
    "default": [],
    "nft_ode": ["train.objective=nft", "sampler.name=ode", "sampler.params={}"],
    "cps_mixgrpo": ["sampler.name=cps", "sampler.params={noise_level: 0.7}",
                    "train.step_selection=window", "train.step_selection_params={size: 3}"],
    "turning_point": ["train.credit=turning_point", "train.batch_size=32"],
}


def run_job(name: str, folder: Path) -> list[dict]:
    """Train job ``name`` in ``folder``; its metrics rows without the timing keys."""
    from flowgrpo.cli.main import main
    from flowgrpo.run.tracking import read_metrics

    out = folder / name
    args = ["train", "-q"]
    for item in [*_COMMON, f"run.output_dir={out}", *JOBS[name]]:
        args += ["--set", item]
    assert main(args) == 0
    return [{k: v for k, v in row.items() if not k.startswith("time/")}
            for row in read_metrics(out)]


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        # identical on the machine that recorded them; the tolerance only absorbs another
        # CPU's last-bit differences in BLAS kernels. The loss and the old gap are sums of O(1)
        # float32 terms that cancel to about 1e-6, so on another CPU they move by up to ~1e-6
        # in absolute terms (measured 1.1e-6 at most); every other metric holds within 1e-5.
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=2e-6)
    return a == b


@pytest.mark.slow
@pytest.mark.parametrize("name", list(JOBS))
def test_metrics_rows_match_the_recorded_ones(name, tmp_path):
    want = json.loads(GOLDEN.read_text())[name]
    got = run_job(name, tmp_path)
    assert len(got) == len(want)
    for row_got, row_want in zip(got, want):
        assert sorted(row_got) == sorted(row_want), row_got["step"]
        bad = {k: (row_got[k], row_want[k]) for k in row_want if not _same(row_got[k], row_want[k])}
        assert not bad, (row_got["step"], bad)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rows = {name: run_job(name, Path(tmp)) for name in (sys.argv[1:] or JOBS)}
    GOLDEN.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
