"""``flowgrpo report RUN [RUN ...] [--out PATH]``: plots, summaries and eval media of runs.

- **One run** (a folder holding ``metrics.jsonl``): ``RUN/report.png`` (reward and KL over
  steps, eval points marked) and a short text summary, plus ``RUN/base_vs_final.png`` (the eval
  grid of step 0, ``samples/eval_00000.png``, next to the last one: same prompts and seeds) and
  ``RUN/report.html``: the plots, then the base and the last eval, one row per sample with its
  prompt and reward (read from ``samples/eval_<step>.json``): the grid of an image run, the GIFs
  of a video run (``samples/eval_<step>_<i>.gif``), WAV players for an audio run
  (``samples/eval_<step>_<i>.wav``), and links to every saved eval file.
- **Several runs, or an ablation folder** (a folder whose subfolders, up to two levels down, hold
  ``metrics.jsonl``; each run is labeled by its path inside it): one overlay figure, eval reward
  against step and against cumulative transformer calls (``calls/nograd_total +
  calls/grad_total``; the panel is left out when no run logged them), rollout reward and KL
  against step, and one summary line per run. The figure goes to ``ABLATION/report.png`` when
  the first argument is an ablation folder, else to ``./report.png`` (``--out`` chooses).

A folder that holds no run, or a run without metrics rows, is a one-line
:class:`~flowgrpo.errors.RunError`.
"""

from __future__ import annotations

import html
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from flowgrpo.errors import RunError

METRICS = "metrics.jsonl"
# samples/eval_<step>.png|json (grids, indexes) and eval_<step>_<i>.gif|wav|mp4 (per sample)
_EVAL_FILE = re.compile(r"^eval_(\d+)(?:_(\d+))?(_grid)?\.(png|gif|wav|mp4|json)$")


@dataclass
class Run:
    """A run to report: its label in plots and summaries, its folder and its metrics rows."""

    label: str
    folder: Path
    rows: list[dict]


def read_rows(folder: Path) -> list[dict]:
    """The rows of ``folder/metrics.jsonl``; a missing, empty or malformed file is a
    :class:`RunError` naming it (a run killed mid-write may leave a partial last line, which is
    skipped)."""
    path = folder / METRICS
    if not path.is_file():
        raise RunError(f"{folder}: no {METRICS}; is it a run folder?")
    lines = path.read_text().splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                break
            raise RunError(f"{path}:{number}: not a JSON row ({err.msg})") from None
        if not isinstance(row, dict) or "step" not in row:
            raise RunError(f"{path}:{number}: a row without a step")
        rows.append(row)
    if not rows:
        raise RunError(f"{path} has no rows yet")
    return rows


def find_runs(folder: Path, depth: int = 2) -> list[Path]:
    """The run folders under ``folder`` (those holding ``metrics.jsonl``), up to ``depth``
    levels down, sorted; a run's own subfolders are not searched."""
    found: list[Path] = []
    if depth < 1:
        return found
    for child in sorted(p for p in folder.iterdir() if p.is_dir()):
        if (child / METRICS).is_file():
            found.append(child)
        else:
            found.extend(find_runs(child, depth - 1))
    return found


def resolve(paths: list[str | Path]) -> tuple[list[Run], Path | None]:
    """The runs named by ``paths`` (run folders or ablation folders) and the ablation folder the
    first path is (None when it is a run). Labels: a run's folder name, a run of an ablation
    folder its path inside it; the full path where labels would repeat."""
    if not paths:
        raise RunError("name at least one run folder")
    found: list[tuple[str, Path]] = []
    ablation = None
    for i, arg in enumerate(paths):
        folder = Path(arg)
        if not folder.is_dir():
            raise RunError(f"{folder}: no such folder")
        if (folder / METRICS).is_file():
            found.append((folder.name or str(folder), folder))
            continue
        inner = find_runs(folder)
        if not inner:
            raise RunError(f"{folder}: no {METRICS} in it or in its subfolders (2 levels "
                           "down); is it a run or an ablation folder?")
        found += [(run.relative_to(folder).as_posix(), run) for run in inner]
        if i == 0:
            ablation = folder
    labels = [label for label, _ in found]
    runs = [Run(label if labels.count(label) == 1 else str(folder), folder, read_rows(folder))
            for label, folder in found]
    return runs, ablation


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _kl_key(rows: list[dict]) -> str:
    return "train/kl" if any("train/kl" in r for r in rows) else "train/approx_kl"


def eval_vs_calls(rows: list[dict]) -> tuple[list[float], list[float]]:
    """Eval reward against cumulative transformer calls (``calls/nograd_total +
    calls/grad_total`` of the eval's row, the last total before it otherwise; 0 before any);
    empty when the run logged no call counts."""
    if not any("calls/nograd_total" in r for r in rows):
        return [], []
    calls, xs, ys = 0.0, [], []
    for r in rows:
        if "calls/nograd_total" in r:
            calls = float(r["calls/nograd_total"]) + float(r.get("calls/grad_total", 0.0))
        if r.get("eval/reward") is not None:
            xs.append(calls)
            ys.append(r["eval/reward"])
    return xs, ys


def summary_line(run: Run) -> str:
    """``LABEL: eval reward final F (step S), best B (step S), base R; last step N``."""
    ex, ey = _series(run.rows, "eval/reward")
    last = f"last step {run.rows[-1]['step']}"
    if not ey:
        return f"{run.label}: no eval reward yet; {last}"
    best = max(range(len(ey)), key=ey.__getitem__)
    base = f", base {ey[0]:.3f}" if ex[0] == 0 else ""
    return (f"{run.label}: eval reward final {ey[-1]:.3f} (step {ex[-1]}), best {ey[best]:.3f} "
            f"(step {ex[best]}){base}; {last}")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def overlay(runs: list[Run], png: Path) -> Path:
    """One figure comparing ``runs``: eval reward against step and against cumulative
    transformer calls (when logged), rollout reward and KL against step; written to ``png``."""
    plt = _pyplot()
    with_calls = any(eval_vs_calls(run.rows)[0] for run in runs)
    shape, size = ((2, 2), (12, 8)) if with_calls else ((1, 3), (15, 4.2))
    fig, axes = plt.subplots(*shape, figsize=size, layout="constrained")
    axes = list(axes.flat)
    ax_step, ax_calls = axes[0], axes[1] if with_calls else None
    ax_roll, ax_kl = axes[-2], axes[-1]
    colors = plt.get_cmap("tab10" if len(runs) <= 10 else "tab20")
    kl_keys = set()
    for i, run in enumerate(runs):
        color = colors(i % colors.N)
        ax_step.plot(*_series(run.rows, "eval/reward"), "o-", ms=3, color=color, label=run.label)
        if ax_calls is not None:
            cx, cy = eval_vs_calls(run.rows)
            if cx:
                ax_calls.plot(cx, cy, "o-", ms=3, color=color)
        ax_roll.plot(*_series(run.rows, "reward/mean"), color=color, lw=1)
        kl_keys.add(_kl_key(run.rows))
        ax_kl.plot(*_series(run.rows, _kl_key(run.rows)), color=color, lw=1)
    for ax, xlabel, ylabel in ((ax_step, "step", "eval reward (Euler, fixed seeds)"),
                               (ax_calls, "cumulative transformer calls", "eval reward"),
                               (ax_roll, "step", "rollout reward (mean)"),
                               (ax_kl, "step", " / ".join(sorted(kl_keys)))):
        if ax is not None:
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    handles, labels = ax_step.get_legend_handles_labels()
    if not handles:  # no run has an eval yet: the legend comes from the rollout lines
        handles = ax_roll.get_lines()
        labels = [run.label for run in runs]
    fig.legend(handles, labels, loc="outside right upper", fontsize=8)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def plot_run(run: Run, png: Path) -> list[str]:
    """``report.png`` of one run (reward and KL over steps); returns its summary lines."""
    plt = _pyplot()
    rows = run.rows
    fig, (ax_r, ax_k) = plt.subplots(1, 2, figsize=(11, 4))
    x, y = _series(rows, "reward/mean")
    ax_r.plot(x, y, label="rollout reward (mean)", color="tab:blue")
    ex, ey = _series(rows, "eval/reward")
    ax_r.plot(ex, ey, "o-", label="eval reward (Euler, fixed seeds)", color="tab:orange")
    ax_r.set_xlabel("step")
    ax_r.set_ylabel("reward")
    ax_r.legend()
    ax_r.grid(alpha=0.3)
    kl_key = _kl_key(rows)
    kx, ky = _series(rows, kl_key)
    ax_k.plot(kx, ky, color="tab:red")
    ax_k.set_xlabel("step")
    ax_k.set_ylabel(kl_key)
    ax_k.grid(alpha=0.3)
    fig.suptitle(run.folder.resolve().name)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    lines = [f"run: {run.folder}", f"steps logged: {len(rows)} (last step {rows[-1]['step']})"]
    if y:
        lines.append(f"rollout reward: first {y[0]:.3f}, last {y[-1]:.3f}, max {max(y):.3f}")
    if ey:
        lines.append(f"eval reward: first {ey[0]:.3f} (step {ex[0]}), last {ey[-1]:.3f} "
                     f"(step {ex[-1]}), change {ey[-1] - ey[0]:+.3f}")
    if ky:
        lines.append(f"{kl_key}: last {ky[-1]:.3e}")
    times = [r["time/step"] for r in rows if "time/step" in r]
    if times:
        lines.append(f"time per step: {sum(times) / len(times):.2f} s")
    lines.append(f"plot: {png}")
    return lines


# ----------------------------------------------------------------------- eval media of one run
@dataclass
class EvalMedia:
    """What one eval saved under ``samples/``: the grid, the per-sample files and the index."""

    step: int
    grid: Path | None = None
    index: dict | None = None
    files: dict[int, list[Path]] | None = None

    @property
    def kind(self) -> str:
        """``image``, ``video`` or ``audio`` (from the index, else from the files)."""
        if self.index and self.index.get("kind"):
            return self.index["kind"]
        suffixes = {f.suffix for fs in (self.files or {}).values() for f in fs}
        return "audio" if ".wav" in suffixes else "video" if ".gif" in suffixes else "image"


def eval_media(run_dir: Path) -> dict[int, EvalMedia]:
    """Every eval's saved files in ``RUN/samples``, by step (ascending)."""
    out: dict[int, EvalMedia] = {}
    folder = run_dir / "samples"
    if not folder.is_dir():
        return out
    for path in sorted(folder.iterdir()):
        match = _EVAL_FILE.match(path.name)
        if not match or not path.is_file():
            continue
        step, sample, suffix = int(match[1]), match[2], match[4]
        media = out.setdefault(step, EvalMedia(step, files={}))
        if sample is not None:
            media.files.setdefault(int(sample), []).append(path)
        elif suffix == "png":
            media.grid = path
        elif suffix == "json":
            try:
                media.index = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                media.index = None  # an unreadable index: the media are still shown
    return dict(sorted(out.items()))


def base_vs_final(run_dir: Path, media: dict[int, EvalMedia] | None = None) -> Path | None:
    """``RUN/base_vs_final.png``: the step-0 eval grid next to the last one (same prompts and
    seeds), each under a caption; None when there are not two grids to compare."""
    from PIL import Image

    from flowgrpo.run.tracking import render_text

    media = eval_media(run_dir) if media is None else media
    grids = {step: m.grid for step, m in media.items() if m.grid is not None}
    last = max(grids, default=0)
    if 0 not in grids or last == 0:
        return None
    base, final = Image.open(grids[0]).convert("RGB"), Image.open(grids[last]).convert("RGB")
    scale = max(1, round(max(base.width, final.width) / 600))
    captions = [render_text(text, scale) for text in ("base (step 0)", f"final (step {last})")]
    gap, top = 8 * scale, captions[0].height + 6 * scale
    canvas = Image.new("RGB", (base.width + gap + final.width,
                               top + max(base.height, final.height)), (255, 255, 255))
    for x, image, caption in ((0, base, captions[0]), (base.width + gap, final, captions[1])):
        canvas.paste(caption, (x + 2 * scale, 3 * scale))
        canvas.paste(image, (x, top))
    path = run_dir / "base_vs_final.png"
    canvas.save(path)
    return path


def _href(path: Path, base: Path) -> str:
    return quote(Path(os.path.relpath(path, base)).as_posix())


def _score(value) -> str:
    return "" if value is None else f"{value:.4g}"


def _eval_section(title: str, media: EvalMedia, run_dir: Path) -> list[str]:
    """The HTML of one eval: its grid, then one table row per sample with its prompt, reward
    and player (GIF or WAV), or per grid row for images."""
    items = (media.index or {}).get("items") or []
    nrow = max(int((media.index or {}).get("nrow") or 1), 1)
    out = [f"<h2>{html.escape(title)}</h2>"]
    if media.grid is not None:
        href = _href(media.grid, run_dir)
        out.append(f'<p><a href="{href}"><img class="grid" src="{href}" '
                   f'alt="eval grid, step {media.step}"></a></p>')
    kind = media.kind
    if kind == "image":
        if items:
            out.append("<table><tr><th>row</th><th>prompt</th><th>rewards</th></tr>")
            for r in range(0, len(items), nrow):
                row = items[r:r + nrow]
                prompts = " | ".join(dict.fromkeys(i.get("prompt") or "" for i in row))
                scores = ", ".join(_score(i.get("score")) for i in row)
                out.append(f"<tr><td>{r // nrow}</td><td>{html.escape(prompts)}</td>"
                           f"<td>{scores}</td></tr>")
            out.append("</table>")
        return out
    out.append("<table><tr><th>#</th><th>prompt</th><th>reward</th><th>sample</th></tr>")
    for i, files in sorted((media.files or {}).items()):
        item = items[i] if i < len(items) else {}
        cells = []
        for f in files:
            href = _href(f, run_dir)
            if f.suffix == ".gif":
                cells.insert(0, f'<img class="sample" src="{href}" alt="sample {i}">')
            elif f.suffix == ".wav":
                cells.insert(0, f'<audio controls preload="none" src="{href}"></audio>')
            else:
                cells.append(f'<a href="{href}">{html.escape(f.name)}</a>')
        out.append(f"<tr><td>{i}</td><td>{html.escape(item.get('prompt') or '')}</td>"
                   f"<td>{_score(item.get('score'))}</td><td>{' '.join(cells)}</td></tr>")
    out.append("</table>")
    return out


def write_html(run_dir: Path, summary: list[str], plot: Path | None,
               media: dict[int, EvalMedia], comparison: Path | None) -> Path:
    """``RUN/report.html``: the summary, the plots, the base and the last eval (prompts,
    rewards, grids, GIFs or WAV players) and links to every saved eval file."""
    name = html.escape(run_dir.resolve().name)
    out = ["<!doctype html>", '<html><head><meta charset="utf-8">',
           f"<title>flowgrpo report: {name}</title>",
           "<style>body{font-family:sans-serif;margin:1.5em}img{max-width:100%}"
           "img.grid,img.sample{image-rendering:pixelated}img.sample{min-width:128px}"
           "table{border-collapse:collapse}"
           "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:middle}"
           "</style></head><body>", f"<h1>{name}</h1>",
           f"<pre>{html.escape(chr(10).join(summary))}</pre>"]
    if plot is not None:
        out.append(f'<p><img src="{_href(plot, run_dir)}" alt="reward and KL over steps"></p>')
    if comparison is not None:
        out += ["<h2>Base vs final</h2>",
                f'<p><img class="grid" src="{_href(comparison, run_dir)}" '
                'alt="base and final eval grids"></p>']
    steps = list(media)
    if steps:
        first, last = steps[0], steps[-1]
        out += _eval_section(f"Eval at step {first}" + (" (base)" if first == 0 else ""),
                             media[first], run_dir)
        if last != first:
            out += _eval_section(f"Eval at step {last} (last)", media[last], run_dir)
        out += ["<h2>Every eval</h2>", "<ul>"]
        for step, m in media.items():
            files = ([m.grid] if m.grid else []) + [f for _, fs in sorted(m.files.items())
                                                     for f in fs]
            index = run_dir / "samples" / f"eval_{step:05d}.json"
            files += [index] if index.is_file() else []
            links = " ".join(f'<a href="{_href(f, run_dir)}">{html.escape(f.name)}</a>'
                             for f in files)
            out.append(f"<li>step {step}: {links}</li>")
        out.append("</ul>")
    out.append("</body></html>")
    path = run_dir / "report.html"
    path.write_text("\n".join(out) + "\n")
    return path


# ---------------------------------------------------------------------------------- entries
def report(run_dir: str | Path, out: str | Path | None = None) -> str:
    """Report one run: ``report.png`` (or ``out``), ``base_vs_final.png`` and ``report.html``
    in the run folder; returns the summary text."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"{run_dir}: no such folder")
    run = Run(run_dir.name, run_dir, read_rows(run_dir))
    png = Path(out) if out is not None else run_dir / "report.png"
    lines = plot_run(run, png)
    media = eval_media(run_dir)
    comparison = base_vs_final(run_dir, media)
    if comparison is not None:
        lines.append(f"base vs final: {comparison}")
    lines.append(f"html: {write_html(run_dir, lines, png, media, comparison)}")
    return "\n".join(lines)


def report_runs(paths: list[str | Path], out: str | Path | None = None) -> str:
    """``flowgrpo report``: one run folder gets :func:`report`; several runs or an ablation
    folder get the overlay figure and one summary line per run; returns the text to print."""
    if out is not None and Path(out).is_dir():
        raise RunError(f"--out {out} is a folder; give the plot's file name (e.g. "
                       f"{Path(out) / 'report.png'})")
    if len(paths) == 1 and (Path(paths[0]) / METRICS).is_file():
        return report(paths[0], out)
    runs, ablation = resolve(paths)
    png = Path(out) if out is not None else (ablation or Path()) / "report.png"
    overlay(runs, png)
    return "\n".join([summary_line(run) for run in runs] + [f"plot: {png}"])
