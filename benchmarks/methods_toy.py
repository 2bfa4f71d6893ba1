"""Every credit / step-selection method on the shipped toy, from the CLI, and a results table.

    python benchmarks/methods_toy.py --seeds 0 1 2 --jobs 2
    python benchmarks/methods_toy.py --methods flow_grpo nft awm elbo --seeds 0 1 2 --jobs 2
    python benchmarks/methods_toy.py --summary runs/methods      # table of finished runs only

Each method is the default job (``configs/digits.yaml``: 300 epochs of 64 samples) with one
switch. The table gives the eval reward (80 fixed-seed Euler images) at epochs 100, 200 and 300
(mean and spread over seeds), the transformer calls per sample per epoch without and with
gradient (``calls/*``; CFG would count twice), their totals over the run, the total calls at
the first eval that reaches Flow-GRPO's final eval reward (sample efficiency), and wall time, also
as a ratio to Flow-GRPO's (the machine is shared: compare ratios, not seconds). With ``--jobs 2``
two runs share the 2 cores, one thread each. The likelihood-free objectives roll out with the
deterministic ODE (``sampler.name: ode``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

METHODS = {
    "flow_grpo": [],
    "window": ["train.step_selection=window", "train.step_selection_params={size: 3}"],
    "flash": ["train.step_selection=flash"],
    "turning_point": ["train.credit=turning_point"],
    "mv_grpo": ["train.views=2"],
    "elbo": ["train.objective=elbo", "sampler.name=ode", "sampler.params={}"],
    "nft": ["train.objective=nft", "sampler.name=ode", "sampler.params={}"],
    "awm": ["train.objective=awm", "sampler.name=ode", "sampler.params={}"],
}
EPOCHS = (100, 200, 300)


def run(method: str, seed: int, out: Path, epochs: int, threads: int) -> None:
    folder = out / f"{method}-s{seed}"
    if (folder / "wall_s.txt").is_file():
        return
    overrides = [f"run.output_dir={folder}", f"run.seed={seed}", f"run.epochs={epochs}",
                 "run.progress=false", "run.tensorboard=false", *METHODS[method]]
    cmd = [sys.executable, "-m", "flowgrpo.cli", "train"]
    for item in overrides:
        cmd += ["--set", item]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.log", "w") as log:
        subprocess.run(cmd, check=True, env=env, stdout=log, stderr=subprocess.STDOUT)
    (folder / "wall_s.txt").write_text(f"{time.perf_counter() - started:.1f}\n")


def summary(out: Path) -> str:
    rows = ["| method | seeds | eval 0 | eval 100 | eval 200 | eval 300 | calls/epoch no-grad | "
            "calls/epoch grad | total calls no-grad / grad | calls to target | wall min | "
            "wall x |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    base_wall, target = None, None
    for method in METHODS:
        runs = sorted(out.glob(f"{method}-s*/metrics.jsonl"))
        runs = [p for p in runs if (p.parent / "wall_s.txt").is_file()]
        if not runs:
            continue
        evals = {e: [] for e in (0, *EPOCHS)}
        walls, last, reach, history = [], None, [], []
        for path in runs:
            metrics = [json.loads(line) for line in path.read_text().splitlines()]
            for r in metrics:
                if r["step"] in evals and "eval/reward" in r:
                    evals[r["step"]].append(r["eval/reward"])
            history.append(metrics)
            last = metrics[-1]
            walls.append(float((path.parent / "wall_s.txt").read_text()))
        if target is None and evals[EPOCHS[-1]]:
            target = statistics.mean(evals[EPOCHS[-1]])  # the first method's final reward
        for metrics in history:
            hits = [r["calls/nograd_total"] + r["calls/grad_total"] for r in metrics
                    if r["step"] > 0 and r.get("eval/reward", -1) >= (target or 2)]
            reach.append(f"{hits[0] / 1e3:.0f}k" if hits else "not reached")
        per_sample = 64  # the default job's samples per epoch (per process)

        def cell(values: list[float]) -> str:
            if not values:
                return "-"
            if len(values) == 1:
                return f"{values[0]:.3f}"
            return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"

        wall = statistics.mean(walls)
        base_wall = base_wall or wall
        rows.append(
            f"| {method} | {len(runs)} | {cell(evals[0])} | "
            + " | ".join(cell(evals[e]) for e in EPOCHS)
            + f" | {last['calls/nograd'] / per_sample:.1f} | {last['calls/grad'] / per_sample:.1f}"
            f" | {last['calls/nograd_total']:.0f} / {last['calls/grad_total']:.0f}"
            f" | {', '.join(reach)} | {wall / 60:.1f} | {wall / base_wall:.2f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", nargs="*", type=int, default=[0])
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (1 thread each if > 1)")
    parser.add_argument("--out", default="runs/methods")
    parser.add_argument("--summary", default=None, metavar="DIR", help="only print the table")
    args = parser.parse_args()
    if args.summary:
        print(summary(Path(args.summary)))
        return
    out = Path(args.out)
    jobs = [(m, s) for s in args.seeds for m in args.methods]
    threads = 1 if args.jobs > 1 else 2
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda job: run(job[0], job[1], out, args.epochs, threads), jobs))
    print(summary(out))


if __name__ == "__main__":
    main()
