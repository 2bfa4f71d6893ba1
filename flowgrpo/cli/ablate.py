"""``flowgrpo ablate``: a grid of runs in one command, with a results table and plots.

    flowgrpo ablate [CONFIG] --grid KEY=V1,V2,... [--grid ...] [--seeds N] [--set ...]
                    [--parallel P] [--target R] [--out DIR] [--presets FILE]

- Every cell of the cross product of the ``--grid`` axes, for each seed ``0..N-1``, is one
  training run in ``OUT/<cell>/s<seed>/``, started from a resolved config file written next to
  it (``OUT/<cell>/s<seed>.yaml``): the base config, then ``--set``, then the cell's values.
- The axis ``method`` takes named presets (``configs/presets/methods.yaml`` and the authors'
  settings ``configs/presets/paper.yaml``, named ``paper:<method>``; or ``--presets FILE``):
  each a mapping of config keys, so methods that differ in several keys compare on one axis.
- Every cell and value is checked before anything runs: an unknown key, preset or bad value
  fails at once with the valid names.
- Resumable: a cell that finished (``done.json``) is not run again; one with a checkpoint
  continues with ``--resume auto`` (exactly, see :mod:`flowgrpo.run.resume`); one killed before its
  first checkpoint starts over. A cell whose run folder is locked by a live run (an earlier
  ablation of the same folder still going, :mod:`flowgrpo.run.lock`) is left to that run and
  reported.
- Cells run one after another, or ``--parallel P`` at a time (each with ``cores / P`` threads).
- A killed ablation leaves nothing that a re-run trips over: a cell's ``flowgrpo train`` gets
  SIGTERM when the ablation dies (Linux; it checkpoints after its epoch and exits 143, see
  :func:`die_with_parent`), ``attempts.jsonl`` skips a line cut short, ``done.json`` and the
  results are replaced whole.
- Results: ``ablation.csv`` (one row per cell and seed), ``ablation.md`` (mean ± std over seeds
  per cell) and ``eval_vs_step.png``, ``eval_vs_calls.png``, ``eval_vs_time.png`` (one line per
  cell, a band over seeds).
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from tqdm.auto import tqdm

from flowgrpo import console
from flowgrpo.config.io import (
    DEFAULT_CONFIG,
    apply_overrides,
    from_dict,
    parse_yaml,
    read_config,
    switch_pieces,
    to_yaml,
    written_keys,
)
from flowgrpo.data.files import SHIPPED, read_utf8
from flowgrpo.errors import ConfigError, RunError

PRESETS = SHIPPED / "presets" / "methods.yaml"
PAPER_PRESETS = SHIPPED / "presets" / "paper.yaml"
"""The authors' published settings, every name ``paper:<method>`` (docs/methods.md, "The authors'
settings")."""
PAPER = "paper:"
METHOD = "method"
PARENT = "FLOWGRPO_ABLATE_PARENT"
"""The environment variable that tells a cell's ``flowgrpo train`` the ablation's process id
(:func:`die_with_parent`)."""
PER_CELL = {"run.output_dir": "--out", "run.seed": "--seeds"}
"""Keys ablate sets for each cell, and the flag that chooses them: ``--set``, ``--grid`` or a
preset giving one is refused rather than overwritten."""


@dataclass
class Cell:
    """One run of the grid: its name, its values per axis, its seed and its folder."""

    name: str
    values: dict[str, Any]
    seed: int
    folder: Path

    @property
    def config_file(self) -> Path:
        return self.folder.with_suffix(".yaml")

    @property
    def done(self) -> bool:
        return read_done(self.folder) is not None


def split_values(text: str) -> list[str]:
    """``"1e-4,{size: 2, strategy: random},[1, 2]"`` -> its three values: commas inside
    brackets, braces or quotes do not split."""
    parts, depth, quote, current = [], 0, "", ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        current += char
    parts.append(current.strip())
    return [p for p in parts if p]


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``["train.lr=1e-4,3e-4", "method=flow_grpo,nft"]`` -> ``{key: [values]}`` (values parsed
    as YAML; preset names stay strings)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or not raw.strip():
            raise ConfigError(f"--grid {item!r} must look like KEY=V1,V2,...")
        if key in grid:
            raise ConfigError(f"--grid {key} is given twice")
        values = [parse_yaml(v, f"--grid {key}", lines=False) for v in split_values(raw)]
        if len(values) != len({json.dumps(v, sort_keys=True, default=str) for v in values}):
            raise ConfigError(f"--grid {key}: a value is repeated")
        grid[key] = values
    if not grid:
        raise ConfigError("flowgrpo ablate needs at least one --grid KEY=V1,V2,...")
    return grid


def load_presets(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Named presets: ``{name: {dotted key: value}}``: those of ``path``, or the shipped ones
    (:data:`PRESETS` and :data:`PAPER_PRESETS`, whose names all begin with ``paper:``)."""
    if path:
        return _read_presets(Path(path))
    shipped = _read_presets(PRESETS)
    paper = _read_presets(PAPER_PRESETS)
    bad = [n for n in paper if not str(n).startswith(PAPER)] + [
        n for n in shipped if str(n).startswith(PAPER)]
    if bad:
        raise ConfigError(f"preset {bad[0]!r}: the names of {PAPER_PRESETS.name} and only they "
                          f"begin with {PAPER!r}")
    return {**shipped, **paper}


def _read_presets(path: Path) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        raise ConfigError(f"presets file not found: {path}")
    data = parse_yaml(read_utf8(path), str(path)) or {}
    bad = [name for name, value in data.items() if not isinstance(value, dict)]
    if not isinstance(data, dict) or bad:
        raise ConfigError(f"{path}: each preset must be a mapping of config keys ({bad[:1]})")
    return data


def _set(data: dict, key: str, value: Any, where: str) -> None:
    """``data[a][b] = value`` for ``key = "a.b"`` (the value replaces the old one whole)."""
    parts = key.split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"{where}: key {key!r} must look like section.key")
    section = data.setdefault(parts[0], {})
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: {parts[0]!r} is not a section")
    section[parts[1]] = value


def _label(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    safe = "".join(c if c.isalnum() or c in "-_.+" else "_" for c in text)
    return safe.strip("_") or "_"


def cell_name(values: dict[str, Any]) -> str:
    """A folder name for a cell: ``method=nft,train.lr=0.0003``."""
    return ",".join(f"{k}={_label(v)}" for k, v in values.items())


def plan(config: str | None, grid: dict[str, list[Any]], overrides: list[str], seeds: int,
         out: Path, presets: dict[str, dict[str, Any]]) -> list[Cell]:
    """Every cell and seed, each config resolved and validated now (nothing runs yet)."""
    read, given = read_config(config), written_keys(overrides=overrides)
    if METHOD in grid:
        unknown = [v for v in grid[METHOD] if v not in presets]
        if unknown:
            raise ConfigError(f"--grid method: unknown preset {unknown[0]!r}; valid: "
                              f"{', '.join(presets)}")
    for key, flag in PER_CELL.items():
        owners = ([f"--set {key}"] if key in given else []) + (
            [f"--grid {key}"] if key in grid else []) + [
            f"preset {name} sets {key}" for name in grid.get(METHOD, []) if key in presets[name]]
        if owners:
            raise ConfigError(f"{owners[0]}: flowgrpo ablate chooses {key} for each cell; use "
                              f"{flag} instead")
    cells, texts = [], []
    for combo in itertools.product(*grid.values()):
        values = dict(zip(grid, combo))
        name = cell_name(values)
        sets = [(k, v, f"preset {value}") for key, value in values.items() if key == METHOD
                for k, v in presets[value].items()]
        sets += [(key, value, f"--grid {key}") for key, value in values.items() if key != METHOD]
        for seed in range(seeds):
            data = json.loads(json.dumps(read))  # a deep copy of plain YAML data
            # a cell that switches a piece gives it its own defaults, as --set does
            switch_pieces(data, {**given, **{key: value for key, value, _ in sets}})
            apply_overrides(data, overrides)
            for key, value, where in sets:
                _set(data, key, value, where)
            _set(data, "run.seed", seed, "--seeds")
            folder = out / name / f"s{seed}"
            _set(data, "run.output_dir", str(folder), "--out")
            try:
                texts.append(to_yaml(from_dict(data)))
            except ConfigError as err:
                raise ConfigError(f"cell {name}: {err}") from None
            cells.append(Cell(name, values, seed, folder))
    for cell, text in zip(cells, texts):  # every cell is valid: write their config files
        if cell.config_file.is_file() and cell.config_file.read_text() != text \
                and cell.folder.exists():
            raise RunError(f"{cell.config_file} belongs to another ablation (its config "
                           f"differs): use a fresh --out")
        cell.folder.parent.mkdir(parents=True, exist_ok=True)
        cell.config_file.write_text(text)
    return cells


def default_out(config: str | None, grid: dict, overrides: list[str], seeds: int) -> Path:
    """``runs/ablations/<config>-<hash>``: the same command finds the same folder again."""
    key = json.dumps([str(config), grid, overrides, seeds], sort_keys=True, default=str)
    stem = Path(config).stem if config else DEFAULT_CONFIG.stem
    return Path("runs") / "ablations" / f"{stem}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def die_with_parent() -> None:
    """In a cell's ``flowgrpo train``: receive SIGTERM when the ablation that started it dies,
    even by SIGKILL, so no cell lives on unwatched (a re-run would start a second process in the
    same run folder). The run then stops as on any SIGTERM. Linux only (``PR_SET_PDEATHSIG``);
    elsewhere nothing changes."""
    import signal

    parent = os.environ.pop(PARENT, "")
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # the ablation died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def read_attempts(folder: Path) -> list[dict]:
    """The attempts of a cell; a line cut short by a kill is skipped."""
    path = folder / "attempts.jsonl"
    attempts = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            attempts.append(json.loads(line))
        except ValueError:
            continue
    return attempts


def append_attempt(folder: Path, attempt: dict) -> None:
    """Append one line to ``attempts.jsonl``, on a line of its own after a torn one."""
    path = folder / "attempts.jsonl"
    torn = path.is_file() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    with open(path, "a") as f:
        f.write(("\n" if torn else "") + json.dumps(attempt) + "\n")


def read_done(folder: Path) -> dict | None:
    """A finished cell's ``done.json``; None when it is absent or not a whole JSON object."""
    try:
        done = json.loads((folder / "done.json").read_text())
    except (OSError, ValueError):
        return None
    return done if isinstance(done, dict) else None


def replace_text(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (a temporary sibling, then a rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def run_cell(cell: Cell, threads: int) -> str | None:
    """Run (or continue) one cell in a subprocess; returns None on success, else a line."""
    from flowgrpo.run.checkpoint import latest_checkpoint
    from flowgrpo.run.lock import describe, holder
    from flowgrpo.run.resume import holds_run

    if cell.done:
        return None
    owner = holder(cell.folder)
    if owner is not None:  # an earlier ablation's run of this cell has not ended
        return (f"{cell.name} seed {cell.seed} is still running ({describe(owner)}); it was "
                f"left to that run")
    cmd = [sys.executable, "-m", "flowgrpo.cli", "train", str(cell.config_file)]
    cmd += {console.QUIET: ["--quiet"], console.VERBOSE: ["--verbose"]}.get(console.level(), [])
    if latest_checkpoint(cell.folder) is not None:
        cmd += ["--resume", "auto"]
    elif cell.folder.is_dir() and holds_run(cell.folder):
        cmd += ["--overwrite"]  # killed before its first checkpoint: nothing to continue
    # torch's threads per run; the cell stops when this process dies (die_with_parent)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), PARENT: str(os.getpid())}
    cell.folder.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with open(cell.folder.parent / f"s{cell.seed}.log", "a") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    wall = time.time() - started
    append_attempt(cell.folder, {"wall_s": wall, "returncode": proc.returncode,
                                 "resumed": "--resume" in cmd})
    if proc.returncode != 0:
        return (f"{cell.name} seed {cell.seed} exited {proc.returncode} (log: "
                f"{cell.folder.parent / f's{cell.seed}.log'})")
    attempts = read_attempts(cell.folder)
    replace_text(cell.folder / "done.json", json.dumps(
        {"wall_s": sum(a["wall_s"] for a in attempts), "attempts": len(attempts)}))
    return None


def ablate(config: str | None, grid_items: list[str], overrides: list[str], seeds: int = 1,
           parallel: int = 1, target: float | None = None, out: str | None = None,
           presets: str | None = None, progress: bool = True) -> Path:
    """Run the grid (skipping finished cells) and write the results; returns the folder."""
    if seeds < 1 or parallel < 1:
        raise ConfigError("--seeds and --parallel must be >= 1")
    grid = parse_grid(grid_items)
    folder = Path(out) if out else default_out(config, grid, overrides, seeds)
    cells = plan(config, grid, overrides, seeds, folder,
                 load_presets(presets) if METHOD in grid else {})
    # seed-major: every cell's first seed before any cell's second, so a partial ablation
    # already compares every cell
    todo = sorted((c for c in cells if not c.done), key=lambda c: c.seed)
    console.note(f"flowgrpo ablate: {len(cells)} runs in {folder} ({len(cells) - len(todo)} "
                 f"done, {len(todo)} to run, {parallel} at a time)")
    threads = max(1, (os.cpu_count() or 1) // parallel)
    failures: list[str] = []
    with ThreadPoolExecutor(parallel) as pool, tqdm(total=len(todo),
                                                    disable=not console.show_progress(progress),
                                                    desc="ablate", unit="run") as bar:
        for result in pool.map(lambda c: run_cell(c, threads), todo):
            if result:
                failures.append(result)
            bar.update(1)
    summarize(folder, cells, list(grid), target)
    if failures:
        raise RunError(f"{len(failures)} of {len(todo)} runs failed (re-run the same command to "
                       f"retry them): {failures[0]}")
    return folder


# ----------------------------------------------------------------------------- results
def read_rows(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cell_result(cell: Cell, target: float | None) -> dict[str, Any]:
    """One CSV row: final and best eval reward, KL, calls, time, and what reaching ``target``
    took (calls and training seconds at the first eval at or above it)."""
    rows = read_rows(cell.folder)
    evals = [r for r in rows if r.get("eval/reward") is not None]
    train = [r for r in rows if "calls/nograd_total" in r]
    kl_key = next((k for k in ("train/kl", "train/approx_kl") if any(k in r for r in rows)),
                  None)
    kls = [r[kl_key] for r in rows if kl_key and r.get(kl_key) is not None]
    seconds = list(itertools.accumulate(r.get("time/step", 0.0) for r in train))
    at = {r["step"]: (r["calls/nograd_total"] + r["calls/grad_total"], s)
          for r, s in zip(train, seconds)}
    hit = next((r["step"] for r in evals if target is not None and r["step"] > 0
                and r["eval/reward"] >= target), None)
    done = read_done(cell.folder) or {}
    return {
        "cell": cell.name, **{k: json.dumps(v) if not isinstance(v, str) else v
                              for k, v in cell.values.items()},
        "seed": cell.seed, "steps": rows[-1]["step"] if rows else 0,
        "final_eval": evals[-1]["eval/reward"] if evals else math.nan,
        "best_eval": max((r["eval/reward"] for r in evals), default=math.nan),
        "final_kl": kls[-1] if kls else math.nan,
        "calls_nograd": train[-1]["calls/nograd_total"] if train else math.nan,
        "calls_grad": train[-1]["calls/grad_total"] if train else math.nan,
        "train_s": seconds[-1] if seconds else math.nan,
        "wall_s": done.get("wall_s", math.nan),
        "calls_to_target": at[hit][0] if hit in at else math.nan,
        "seconds_to_target": at[hit][1] if hit in at else math.nan,
        "done": bool(done),
    }


def _mean_std(values: list[float], digits: int = 3) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _count(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "not reached"
    mean = statistics.mean(values)
    text = f"{mean / 1e3:.1f}k" if mean >= 1e3 else f"{mean:.0f}"
    return text + (f" ({len(values)} seeds)" if len(values) > 1 else "")


def summarize(folder: Path, cells: list[Cell], axes: list[str], target: float | None) -> None:
    """Write ``ablation.csv``, ``ablation.md`` and the three plots."""
    results = [cell_result(c, target) for c in cells]
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=list(results[0]))
    writer.writeheader()
    writer.writerows(results)
    replace_text(folder / "ablation.csv", table.getvalue())
    by_cell: dict[str, list[dict]] = {}
    for r in results:
        by_cell.setdefault(r["cell"], []).append(r)
    lines = [f"target eval reward: {target}" if target is not None else
             "no --target: the 'to target' columns are empty", "",
             "| cell | seeds done | final eval | best eval | final KL | calls no-grad | "
             "calls grad | train s | wall s | calls to target | seconds to target |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rs in by_cell.items():
        def col(key: str, rs=rs) -> list[float]:
            return [float(r[key]) for r in rs]

        lines.append(
            f"| {name} | {sum(r['done'] for r in rs)}/{len(rs)} | {_mean_std(col('final_eval'))}"
            f" | {_mean_std(col('best_eval'))} | {_mean_std(col('final_kl'), 4)} | "
            f"{_count(col('calls_nograd'))} | {_count(col('calls_grad'))} | "
            f"{_mean_std(col('train_s'), 1)} | {_mean_std(col('wall_s'), 1)} | "
            f"{_count(col('calls_to_target'))} | {_mean_std(col('seconds_to_target'), 1)} |")
    replace_text(folder / "ablation.md", "\n".join(lines) + "\n")
    plot(folder, cells)


def _curves(cells: list[Cell]) -> dict[str, list[list[tuple[float, float, float]]]]:
    """Per cell, per seed: ``(step, cumulative calls, cumulative train seconds, eval)`` at each
    eval after the base row, plus the base eval at 0."""
    out: dict[str, list] = {}
    for cell in cells:
        rows = read_rows(cell.folder)
        calls, seconds, points = 0.0, 0.0, []
        for r in rows:
            if "calls/nograd_total" in r:
                calls = r["calls/nograd_total"] + r["calls/grad_total"]
                seconds += r.get("time/step", 0.0)
            if r.get("eval/reward") is not None:
                points.append((r["step"], calls, seconds, r["eval/reward"]))
        if points:
            out.setdefault(cell.name, []).append(points)
    return out


def plot(folder: Path, cells: list[Cell]) -> None:
    """Eval reward against step, cumulative model calls and training seconds: one line per
    cell (the mean over seeds at each eval), a band from the lowest to the highest seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = _curves(cells)
    # 20 distinct colours, then the same ones dashed: no two cells share a line style
    colours = plt.get_cmap("tab20").colors
    styles = {name: (colours[i % 20], "-" if i < 20 else "--") for i, name in enumerate(curves)}
    for index, (file, xlabel) in enumerate((("eval_vs_step.png", "step"),
                                            ("eval_vs_calls.png", "transformer calls"),
                                            ("eval_vs_time.png", "training seconds"))):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, seeds in curves.items():
            n = min(len(points) for points in seeds)  # evals every seed has
            xs = [statistics.mean(p[i][index] for p in seeds) for i in range(n)]
            ys = [[p[i][3] for p in seeds] for i in range(n)]
            colour, dash = styles[name]
            (line,) = ax.plot(xs, [statistics.mean(y) for y in ys], marker="o", ls=dash, ms=3,
                              color=colour, label=name)
            if len(seeds) > 1:
                ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys],
                                color=line.get_color(), alpha=0.2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("eval reward")
        ax.grid(alpha=0.3)
        if curves:
            ax.legend(fontsize=7, ncol=2 if len(curves) > 8 else 1)
        fig.tight_layout()
        fig.savefig(folder / file, dpi=110)
        plt.close(fig)


def flow(value: Any) -> str:
    """A value as one line of YAML (``{size: 3}``, ``ode``)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("...").strip()


def describe_presets(path: str | None = None) -> str:
    """``name: key=value, ...`` per preset (``flowgrpo ablate --list-presets``)."""
    return "\n".join(
        f"{name}: " + (", ".join(f"{k}={flow(v)}" for k, v in values.items())
                       or "(the config as it is)")
        for name, values in load_presets(path).items())
