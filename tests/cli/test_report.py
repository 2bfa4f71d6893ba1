"""``flowgrpo report``: one run, several runs, ablation folders, labeled eval grids, base versus
final, and the HTML page of image, video and audio runs (fake run folders, no training)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from flowgrpo.cli.main import main
from flowgrpo.cli.report import eval_vs_calls, find_runs, read_rows, report, report_runs
from flowgrpo.errors import RunError
from flowgrpo.run.tracking import Tracker

PROMPTS = ("a handwritten digit 3", "a red cube on a table")
PER_PROMPT = 2


def _media(kind: str, gen: torch.Generator) -> torch.Tensor:
    n = len(PROMPTS) * PER_PROMPT
    if kind == "image":
        return torch.rand(n, 3, 16, 16, generator=gen)
    if kind == "video":
        return torch.rand(n, 3, 3, 8, 8, generator=gen)  # [N, F, 3, H, W]
    return torch.rand(n, 1, 400, generator=gen) * 2 - 1  # [N, C, T]


def make_run(folder: Path, kind: str = "image", steps: int = 4, eval_every: int = 2,
             calls: bool = True, seed: int = 0) -> Path:
    """A run folder as the trainer leaves it: a base eval row at step 0, one row per step
    (rollout reward, KL, call totals), evals with saved media (labeled, with an index)."""
    tracker = Tracker(folder, enabled=True, tensorboard=False, wandb_project=None, config={})
    gen = torch.Generator().manual_seed(seed)

    def evaluate(step: int) -> float:
        scores = torch.rand(len(PROMPTS) * PER_PROMPT, generator=gen)
        tracker.save_media(step, "eval", _media(kind, gen), kind, sample_rate=8000,
                           nrow=PER_PROMPT, prompts=[p for p in PROMPTS for _ in range(PER_PROMPT)],
                           scores=scores)
        return float(scores.mean())

    tracker.log(0, {"eval/reward": evaluate(0)})
    for step in range(1, steps + 1):
        row = {"reward/mean": 0.1 * step + seed, "train/kl": 1e-3 * step}
        if calls:
            row.update({"calls/nograd_total": 100.0 * step, "calls/grad_total": 40.0 * step})
        if step % eval_every == 0 or step == steps:
            row["eval/reward"] = evaluate(step)
        tracker.log(step, row)
    tracker.close()
    return folder


def _valid_png(path: Path) -> tuple[int, int]:
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


def test_several_runs_overlay_and_one_summary_line_each(tmp_path, monkeypatch):
    a = make_run(tmp_path / "a", seed=0)
    b = make_run(tmp_path / "b", steps=6, calls=False, seed=1)
    out = report_runs([a, b], out=tmp_path / "figs" / "cmp.png")
    width, height = _valid_png(tmp_path / "figs" / "cmp.png")
    assert width > 500 and height > 300
    lines = out.splitlines()
    assert len(lines) == 3 and lines[-1] == f"plot: {tmp_path / 'figs' / 'cmp.png'}"
    assert lines[0].startswith("a: eval reward final ") and lines[0].endswith("last step 4")
    assert lines[1].startswith("b: eval reward final ") and lines[1].endswith("last step 6")
    assert "best" in lines[0] and "base" in lines[0]
    # eval reward against cumulative calls: 0 at the base eval, the row's totals after
    assert eval_vs_calls(read_rows(a))[0] == [0.0, 280.0, 560.0]
    assert eval_vs_calls(read_rows(b)) == ([], [])
    # without --out: ./report.png; the runs' own folders are left alone
    monkeypatch.chdir(tmp_path)
    report_runs([str(a), str(b)])
    _valid_png(tmp_path / "report.png")
    assert not (a / "report.png").exists()


def test_runs_without_call_counts_leave_the_calls_panel_out(tmp_path):
    runs = [make_run(tmp_path / f"r{i}", calls=False, seed=i) for i in range(2)]
    out = report_runs(runs, out=tmp_path / "o.png")
    width, height = _valid_png(tmp_path / "o.png")
    assert width > 2 * height  # one row of three panels instead of two rows of two
    assert len(out.splitlines()) == 3


def test_ablation_folder_is_searched_two_levels_down(tmp_path):
    abl = tmp_path / "abl"
    for i, name in enumerate(("lr=1e-4/s0", "lr=1e-4/s1", "lr=3e-4/s0", "single")):
        make_run(abl / name, steps=2, seed=i)
    (abl / "lr=1e-4" / "s0.yaml").write_text("{}\n")  # files next to runs are ignored
    (abl / "notes" / "empty").mkdir(parents=True)
    make_run(abl / "too" / "deep" / "run", steps=2)  # three levels down: not a run of abl
    assert [p.relative_to(abl).as_posix() for p in find_runs(abl)] == [
        "lr=1e-4/s0", "lr=1e-4/s1", "lr=3e-4/s0", "single"]
    out = report_runs([abl]).splitlines()
    assert [line.split(":")[0] for line in out[:-1]] == [
        "lr=1e-4/s0", "lr=1e-4/s1", "lr=3e-4/s0", "single"]
    assert out[-1] == f"plot: {abl / 'report.png'}"
    _valid_png(abl / "report.png")


def test_repeated_labels_fall_back_to_paths(tmp_path):
    a, b = make_run(tmp_path / "x" / "run", steps=2), make_run(tmp_path / "y" / "run", steps=2)
    lines = report_runs([a, b], out=tmp_path / "o.png").splitlines()
    assert lines[0].startswith(f"{a}: ") and lines[1].startswith(f"{b}: ")


def test_one_run_keeps_the_summary_and_adds_base_vs_final_and_html(tmp_path):
    run = make_run(tmp_path / "run")
    out = report(run)
    for text in ("run: ", "steps logged: 5 (last step 4)", "rollout reward: first 0.100",
                 "eval reward: first", "train/kl: last", f"plot: {run / 'report.png'}",
                 f"base vs final: {run / 'base_vs_final.png'}", f"html: {run / 'report.html'}"):
        assert text in out, text
    assert (run / "report.png").stat().st_size > 1000
    grid_w, grid_h = _valid_png(run / "samples" / "eval_00000.png")
    width, height = _valid_png(run / "base_vs_final.png")
    assert 2 * grid_w <= width <= 2 * grid_w + 30 and grid_h < height < grid_h + 40
    page = (run / "report.html").read_text()
    for name in ("report.png", "base_vs_final.png", "samples/eval_00000.png",
                 "samples/eval_00004.png", "samples/eval_00002.png"):
        assert f'"{name}"' in page, name
    assert PROMPTS[0] in page and PROMPTS[1] in page
    # --out moves the plot; the page links it from the run folder
    assert f"plot: {tmp_path / 'elsewhere.png'}" in report_runs([run], tmp_path / "elsewhere.png")
    assert '"../elsewhere.png"' in (run / "report.html").read_text()


def test_base_vs_final_needs_a_base_and_a_later_grid(tmp_path):
    run = make_run(tmp_path / "run", kind="audio")  # audio saves no grid
    out = report(run)
    assert "base vs final" not in out and not (run / "base_vs_final.png").exists()


def test_labeled_grid_is_taller_and_keeps_the_unlabeled_one(tmp_path):
    from torchvision.utils import save_image

    tracker = Tracker(tmp_path, enabled=True, tensorboard=False, wandb_project=None, config={})
    media = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    plain = tracker.save_media(1, "eval", media, "image", nrow=2)
    labeled = tracker.save_media(2, "eval", media, "image", nrow=2, prompts=list(PROMPTS),
                                 scores=[0.25, 0.5, 0.75, 1.0])
    tracker.close()
    save_image(torch.nn.functional.interpolate(media, scale_factor=4), tmp_path / "ref.png",
               nrow=2, padding=1)
    plain_a, labeled_a = np.asarray(Image.open(plain)), np.asarray(Image.open(labeled))
    assert np.array_equal(plain_a, np.asarray(Image.open(tmp_path / "ref.png")))
    assert labeled_a.shape[0] > plain_a.shape[0] + 2 * 20  # a label strip per row
    assert labeled_a.shape[1] >= plain_a.shape[1]
    # the first row's prompt strip holds dark text on white, the grid rows follow unchanged
    strip = labeled_a[:8]
    assert (strip < 100).any() and (strip == 255).any()
    rows = [r for r in range(labeled_a.shape[0])
            if np.array_equal(labeled_a[r, :plain_a.shape[1]], plain_a[1])]
    assert rows, "the first image row is in the labeled grid"
    index = json.loads((tmp_path / "samples" / "eval_00002.json").read_text())
    assert [i["prompt"] for i in index["items"]] == [PROMPTS[0]] * 2 + [PROMPTS[1]] * 2
    assert [i["score"] for i in index["items"]] == [0.25, 0.5, 0.75, 1.0]
    assert index["grid"] == "eval_00002.png" and index["kind"] == "image"


def test_tiny_grid_with_one_sample_per_row_gets_room_for_its_label(tmp_path):
    tracker = Tracker(tmp_path, enabled=True, tensorboard=False, wandb_project=None, config={})
    path = tracker.save_media(0, "eval", torch.rand(2, 3, 16, 16), "image", nrow=1,
                              prompts=["a long prompt " * 20, "short"], scores=torch.rand(2))
    tracker.close()
    width, height = _valid_png(path)
    assert width >= 40 * 6 and height > 2 * 66


@pytest.mark.parametrize("kind", ["video", "audio"])
def test_html_shows_every_media_file_with_prompts_and_scores(tmp_path, kind):
    run = make_run(tmp_path / kind, kind=kind)
    report(run)
    page = (run / "report.html").read_text()
    files = sorted(p for p in (run / "samples").iterdir()
                   if p.suffix in (".png", ".gif", ".wav", ".mp4"))
    assert files
    for path in files:
        assert f'"samples/{path.name}"' in page, path.name
    player = "<audio controls" if kind == "audio" else 'src="samples/eval_00004_1.gif"'
    assert player in page
    assert PROMPTS[0] in page
    assert re.search(r"<td>0\.\d+</td>", page)  # a sample's reward
    assert '"report.png"' in page


def test_cli_reports_two_runs(tmp_path, capsys):
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b", seed=1)
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "cmp.png")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["a", "b", "plot"]
    _valid_png(tmp_path / "cmp.png")
    assert main(["report", str(a)]) == 0
    assert "eval reward: first" in capsys.readouterr().out


def test_a_folder_without_metrics_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(RunError, match="no metrics.jsonl"):
        report_runs([tmp_path / "empty"])
    with pytest.raises(RunError, match="no such folder"):
        report_runs([tmp_path / "missing"])
    assert main(["report", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("flowgrpo: ") and "no metrics.jsonl" in err
    assert len(err.strip().splitlines()) == 1
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(RunError, match="has no rows yet"):
        report(run)
    (run / "metrics.jsonl").write_text('{"step": 1}\n{broken\n{"step": 2}\n')
    with pytest.raises(RunError, match=r"metrics.jsonl:2: not a JSON row"):
        report(run)
