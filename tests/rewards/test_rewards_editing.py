"""Editing rewards (preserve, region_ocr, edit_regions) on images made in code."""

from __future__ import annotations

import functools
import os

import pytest
import torch

import reward_models
import reward_models.editing as editing
from reward_models import Media, RewardOutput
from reward_models.media import to_pil
from reward_models.ocr import render_text

SIZE = 128


def quantized(image: torch.Tensor) -> torch.Tensor:
    """Round to 8 bits so a PNG round trip is exact."""
    return (image.clamp(0, 1) * 255).round() / 255


def scene(seed: int = 0) -> torch.Tensor:
    """``[3, 128, 128]``: a sign, two shapes and texture noise."""
    gen = torch.Generator().manual_seed(seed)
    image = render_text("OPEN", (SIZE, SIZE), 24)
    image[0, 90:120, 10:40] = 0.8  # red square bottom left
    image[:, 10:30, 90:120] = 0.2  # dark bar top right
    return quantized(image + 0.08 * torch.randn(image.shape, generator=gen))


def save(image: torch.Tensor, path) -> str:
    to_pil(image[None])[0].save(path)
    return str(path)


def save_mask(mask: torch.Tensor, path) -> str:
    from PIL import Image

    Image.fromarray((mask.numpy() * 255).astype("uint8"), "L").save(path)
    return str(path)


def noise_at(image: torch.Tensor, rows: slice, cols: slice, seed: int = 1) -> torch.Tensor:
    out = image.clone()
    gen = torch.Generator().manual_seed(seed)
    patch = out[:, rows, cols]
    out[:, rows, cols] = quantized(torch.rand(patch.shape, generator=gen))
    return out


CENTER = (slice(32, 96), slice(32, 96))  # the edit region of most tests
CENTER_BOX = [0.25, 0.25, 0.75, 0.75]


def center_mask() -> torch.Tensor:
    mask = torch.zeros(SIZE, SIZE)
    mask[CENTER] = 1
    return mask


def call(reward, images: torch.Tensor, metadata: list[dict], prompts: list[str] | None = None):
    prompts = prompts if prompts is not None else ["edit"] * len(metadata)
    return reward(Media("image", images), prompts, metadata)


# --- preserve -------------------------------------------------------------------------------------


def test_preserve_is_max_for_the_source_and_ignores_the_edit_region(tmp_path):
    source = scene()
    src = save(source, tmp_path / "src.png")
    mask = save_mask(center_mask(), tmp_path / "mask.png")
    inside = noise_at(source, *CENTER)
    outside = noise_at(source, slice(0, 32), slice(0, 64))  # a patch outside the mask
    images = torch.stack([source, inside, outside])
    for metric in ("ssim", "psnr"):
        reward = reward_models.get("preserve", metric=metric)
        by_mask = call(reward, images, [{"image": src, "mask": mask}] * 3).scores
        by_box = call(reward, images, [{"image": src, "boxes": [CENTER_BOX]}] * 3).scores
        whole = call(reward, images, [{"image": src}] * 3).scores
        assert torch.equal(by_mask[:2], torch.ones(2)), (metric, by_mask)  # bit-exact
        assert torch.equal(by_box, by_mask)  # the box covers the same pixels
        assert by_mask[2] < 0.9, (metric, by_mask)
        assert whole[0] == 1 and whole[1] < 0.9 and whole[2] < 0.9  # no region: all compared
    out = call(reward_models.get("preserve"), images, [{"image": src, "mask": mask}] * 3)
    assert out.info["ssim"] == pytest.approx(float(out.scores.mean()))
    assert out.info["outside_frac"] == pytest.approx(0.75)
    assert 50 > out.info["psnr_db"] > 30  # two of three capped at 50 dB


def test_preserve_dilate_leaves_a_band_around_the_region():
    source = scene()
    edited = noise_at(source, slice(30, 98), slice(30, 98))  # 2 px past the edit mask
    meta = [{"image": source, "mask": center_mask()}]
    assert call(reward_models.get("preserve"), edited[None], meta).scores[0] < 0.99
    assert call(reward_models.get("preserve", dilate=2), edited[None], meta).scores[0] == 1


def test_preserve_region_covering_everything_scores_the_maximum():
    source = scene()
    edited = noise_at(source, slice(0, SIZE), slice(0, SIZE))
    out = call(reward_models.get("preserve"), edited[None],
               [{"image": source, "boxes": [[0, 0, 1, 1]]}])
    assert out.scores.tolist() == [1.0] and out.info["outside_frac"] == 0


def test_preserve_resizes_the_source_and_caches_it_by_path_and_mtime(tmp_path):
    from PIL import Image

    source = scene()
    path = tmp_path / "big.png"
    to_pil(source[None])[0].resize((2 * SIZE, 3 * SIZE), Image.BICUBIC).save(path)  # other size
    reward = reward_models.get("preserve")
    meta = [{"image": str(path), "boxes": [CENTER_BOX]}]
    loads = editing.FILES.loads
    first = call(reward, source[None], meta).scores
    assert first[0] > 0.9  # the same picture after a down-and-up resize
    assert call(reward, source[None], meta).scores.equal(first)
    assert editing.FILES.loads == loads + 1  # decoded once
    to_pil(scene(seed=5)[None])[0].save(path)  # new content, new modification time
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert call(reward, source[None], meta).scores[0] < first[0]
    assert editing.FILES.loads == loads + 2


def test_preserve_default_image_param_and_in_memory_arrays():
    source = scene()
    reward = reward_models.get("preserve", image=source)
    out = call(reward, torch.stack([source, scene(seed=3)]), [{}, {"mask": center_mask().numpy()}])
    assert out.scores[0] == 1 and out.scores[1] < 0.9


def test_masked_ssim_matches_the_definition_away_from_the_border():
    """Full weight: the map at an interior pixel is Wang et al.'s SSIM of its 11x11 window."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(1, 1, 32, 32, generator=gen, dtype=torch.float64)
    y = (x + 0.1 * torch.randn(x.shape, generator=gen, dtype=torch.float64)).clamp(0, 1)
    ssim = editing.masked_ssim(x, y, torch.ones(1, 1, 32, 32))
    g = editing.gaussian_window(11, 1.5)
    window = g[:, None] * g[None, :]
    for r, c in ((5, 5), (16, 20), (26, 26)):
        px, py = x[0, 0, r - 5 : r + 6, c - 5 : c + 6], y[0, 0, r - 5 : r + 6, c - 5 : c + 6]
        mx, my = (window * px).sum(), (window * py).sum()
        vx, vy = (window * (px - mx) ** 2).sum(), (window * (py - my) ** 2).sum()
        cov = (window * (px - mx) * (py - my)).sum()
        c1, c2 = 0.01**2, 0.03**2
        want = (2 * mx * my + c1) * (2 * cov + c2) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
        assert float(ssim[0, r, c]) == pytest.approx(float(want), abs=1e-5)


# --- errors ---------------------------------------------------------------------------------------


@functools.cache
def region_ocr():
    return reward_models.get("region_ocr", threads=1)


def one_line_error(fn, match: str, error=ValueError) -> None:
    with pytest.raises(error, match=match) as info:
        fn()
    assert "\n" not in str(info.value)


def test_errors_are_one_line(tmp_path):
    image = scene()[None]
    preserve = reward_models.get("preserve")
    one_line_error(lambda: call(preserve, image, [{}]), r"metadata\['image'\]")
    one_line_error(lambda: call(preserve, image, [{"image": str(tmp_path / "none.png")}]),
                   "cannot read .*none.png.*FileNotFoundError")
    (tmp_path / "bad.png").write_text("not a png")
    one_line_error(lambda: call(preserve, image, [{"image": str(tmp_path / "bad.png")}]),
                   "cannot read .*bad.png")
    empty = save_mask(torch.zeros(8, 8), tmp_path / "empty.png")
    one_line_error(lambda: call(preserve, image, [{"image": image[0], "mask": empty}]), "empty")
    bad_box = {"image": image[0], "boxes": [[0.5, 0, 0.2, 1]]}
    one_line_error(lambda: call(preserve, image, [bad_box]), "x0 < x1")
    one_line_error(lambda: call(preserve, image, [{"image": torch.zeros(4, 4)}]), r"\[3, h, w\]")
    one_line_error(lambda: reward_models.get("preserve", metric="lpips"), "ssim' or 'psnr")
    one_line_error(lambda: call(preserve, image, [{}, {}]), "1 samples but 2 prompts")
    edit = reward_models.get("edit_regions", inner=region_ocr())
    for reward in (region_ocr(), edit):
        one_line_error(lambda r=reward: call(r, image, [{"image": image[0], "text": "x"}]),
                       r"needs an edit region for sample 0: set metadata\['mask'\]")
    audio = Media("audio", torch.zeros(1, 1, 100), sample_rate=16000)
    video = Media("video", torch.zeros(1, 2, 3, 8, 8))
    for reward in (preserve, region_ocr(), edit):
        for media in (audio, video):
            one_line_error(lambda r=reward, m=media: r(m, ["p"], [{}]), f"got {media.kind} media")


# --- region_ocr -----------------------------------------------------------------------------------


def two_signs(left: str, right: str) -> torch.Tensor:
    """``[3, 128, 256]``: two signs side by side."""
    return torch.cat([render_text(left, (128, 128)), render_text(right, (128, 128))], dim=2)


def test_region_ocr_reads_only_the_edit_region():
    image = two_signs("EXIT", "OPEN")
    images = torch.stack([image, image, image])
    right_half = torch.zeros(8, 16)
    right_half[:, 8:] = 1
    meta = [
        {"boxes": [[0, 0, 0.5, 1], [0.5, 0, 1, 1]], "text": "EXIT"},  # the first box counts
        {"boxes": [[0, 0, 0.5, 1]], "text": "SALE"},  # wrong text
        {"mask": right_half},  # target from the prompt's quote
    ]
    prompts = ["change the sign", "change the sign", 'make the right sign say "open"']
    out = call(region_ocr(), images, meta, prompts)
    assert out.scores[0] == 1 and out.scores[2] == 1, out.scores
    assert out.scores[1] <= 0.25, out.scores
    # the whole-image reading also holds the other sign, so plain ``ocr`` cannot score 1
    whole = region_ocr().ocr(Media("image", images[:1]), prompts[:1], meta[:1])
    assert whole.scores[0] < 0.7


# --- edit_regions ---------------------------------------------------------------------------------


class FromMetadata:
    """Inner reward stub: ``metadata["q"]`` per sample (or per crop), records what it saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[tuple, list[dict]]] = []

    def __call__(self, media, prompts, metadata):
        self.seen.append((tuple(media.data.shape), metadata))
        return RewardOutput(torch.tensor([float(m["q"]) for m in metadata]), info={"calls": 1.0})


def test_edit_regions_map_edit_cells_local_preservation_and_weights():
    source = scene()
    inside_only = noise_at(source, *CENTER)  # the edit changes the box only
    corner = noise_at(inside_only, slice(104, 128), slice(104, 128))  # and one far corner
    images = torch.stack([inside_only, corner])
    meta = [{"image": source, "boxes": [CENTER_BOX], "q": q} for q in (0.25, 0.75)]
    inner = FromMetadata()
    reward = reward_models.get("edit_regions", inner=inner, grid=(4, 4), edit_weight=2.0,
                               preserve_weight=0.5)
    out = call(reward, images, meta)
    box = torch.zeros(4, 4, dtype=torch.bool)
    box[1:3, 1:3] = True
    assert out.regions.shape == (2, 4, 4)
    assert torch.equal(out.regions[0][box], torch.full((4,), 0.5))  # 2.0 * q
    assert torch.equal(out.regions[1][box], torch.full((4,), 1.5))
    assert torch.equal(out.regions[0][~box], torch.full((12,), 0.5))  # 0.5 * SSIM 1 (exact)
    far = ~box
    far[3, 3] = False  # the changed corner is more than 5 px away from every other cell
    assert torch.equal(out.regions[1][far], torch.full((11,), 0.5))
    preserve = reward_models.get("preserve")
    ssim, error, outside, _ = preserve.maps(Media("image", images), meta, "preserve")
    local = preserve.reduce(ssim, error, outside, (4, 4))[0]
    assert out.regions[1, 3, 3] == pytest.approx(0.5 * float(local[1, 3, 3]), abs=1e-6)
    assert out.regions[1, 3, 3] < 0.45
    whole = call(preserve, images, meta).scores
    torch.testing.assert_close(out.components["preserve"], whole)
    torch.testing.assert_close(out.components["edit"], torch.tensor([0.25, 0.75]))
    torch.testing.assert_close(out.scores, 2.0 * torch.tensor([0.25, 0.75]) + 0.5 * whole)
    assert out.info["edit/calls"] == 1 and out.info["edit_cells_frac"] == 0.25
    assert out.info["preserve/outside_frac"] == pytest.approx(0.75)
    assert inner.seen[0][0] == (2, 3, SIZE, SIZE) and inner.seen[0][1] is meta  # whole images


def test_edit_regions_crop_mode_scores_each_box():
    source = scene()
    boxes = [[0, 0, 0.5, 0.5], [0.25, 0.25, 0.75, 0.75]]  # they share cell (1, 1)
    meta = [{"image": source, "boxes": boxes, "group": "g",
             "box_metadata": [{"q": 1.0}, {"q": 0.0}], "q": 9.0}]
    inner = FromMetadata()
    reward = reward_models.get("edit_regions", inner=inner, crop=True, crop_size=(32, 32),
                               grid=(4, 4))
    out = call(reward, source[None], meta)
    shape, crop_meta = inner.seen[0]
    assert shape == (2, 3, 32, 32)
    assert [m["group"] for m in crop_meta] == ["g/edit0", "g/edit1"]
    assert all("image" not in m and "boxes" not in m for m in crop_meta)
    expected = torch.ones(4, 4)  # unchanged outside: SSIM 1
    expected[:2, :2] = 1.0
    expected[1:3, 1:3] = 0.0
    expected[1, 1] = 0.5  # in both boxes: their mean
    torch.testing.assert_close(out.regions[0], expected)
    torch.testing.assert_close(out.components["edit"], torch.tensor([(3 * 1.0 + 0.5) / 7]))


def test_edit_regions_with_region_ocr_and_a_mask(tmp_path):
    """Right text in the box scores high, wrong text low; the kept sign stays at SSIM 1."""
    source = two_signs("OPEN", "OPEN")
    src = save(source, tmp_path / "src.png")
    mask = torch.zeros(SIZE, 2 * SIZE)
    mask[:, SIZE:] = 1  # edit the right sign
    mask_path = save_mask(mask, tmp_path / "mask.png")
    images = torch.stack([two_signs("OPEN", "EXIT"), two_signs("OPEN", "SALE")])
    meta = [{"image": src, "mask": mask_path, "text": "EXIT"}] * 2
    reward = reward_models.get("edit_regions", inner=region_ocr(), grid=(2, 4))
    out = call(reward, images, meta)
    assert out.components["edit"][0] == 1 and out.components["edit"][1] <= 0.25
    assert torch.equal(out.regions[:, :, :2], torch.ones(2, 2, 2))  # the left sign kept
    assert torch.equal(out.regions[:, :, 2:], out.components["edit"][:, None, None].expand(2, 2, 2))
    assert torch.equal(out.components["preserve"], torch.ones(2))


# --- batching and the reward contract -------------------------------------------------------------


def batch_case(tmp_path) -> tuple[torch.Tensor, list[str], list[dict]]:
    sources = [save(scene(seed=s), tmp_path / f"s{s}.png") for s in range(4)]
    images = torch.stack([noise_at(scene(seed=s), slice(8 * s, 8 * s + 40), slice(0, 64), seed=s)
                          for s in range(4)])
    meta = [{"image": sources[0], "boxes": [CENTER_BOX], "q": 0.1, "group": "a"},
            {"image": sources[1], "mask": center_mask(), "q": 0.2, "group": "a"},
            {"image": sources[2], "boxes": [[0, 0, 0.5, 0.5], CENTER_BOX], "q": 0.3, "group": "b"},
            {"image": sources[3], "boxes": [[0.5, 0.5, 1, 1]], "q": 0.4, "group": "b"}]
    return images, ["edit"] * 4, meta


@pytest.mark.parametrize("name", ["preserve", "preserve_psnr", "edit_regions", "edit_crops"])
def test_batched_equals_one_by_one_and_permutations_follow(tmp_path, name):
    builds = {
        "preserve": lambda: reward_models.get("preserve"),
        "preserve_psnr": lambda: reward_models.get("preserve", metric="psnr", channels="rgb"),
        "edit_regions": lambda: reward_models.get("edit_regions", inner=FromMetadata(),
                                                  grid=(8, 8)),
        "edit_crops": lambda: reward_models.get("edit_regions", inner=FromMetadata(), crop=True,
                                                grid=(8, 8), preserve_params={"dilate": 2}),
    }
    reward = builds[name]()
    images, prompts, meta = batch_case(tmp_path)
    out = call(reward, images, meta, prompts)
    assert out.scores.dtype == torch.float32 and out.scores.shape == (4,)
    assert torch.isfinite(out.scores).all() and len(set(out.scores.tolist())) == 4
    again = call(reward, images, meta, prompts)
    assert torch.equal(again.scores, out.scores)
    for i in range(4):
        alone = call(reward, images[i : i + 1], meta[i : i + 1], prompts[i : i + 1])
        torch.testing.assert_close(alone.scores, out.scores[i : i + 1], atol=1e-6, rtol=0)
        if out.regions is not None:
            torch.testing.assert_close(alone.regions, out.regions[i : i + 1], atol=1e-6, rtol=0)
    perm = [2, 0, 3, 1]
    permuted = call(reward, images[perm], [meta[i] for i in perm], prompts)
    torch.testing.assert_close(permuted.scores, out.scores[perm], atol=1e-6, rtol=0)
    if out.regions is not None:
        assert torch.isfinite(out.regions).all()
        torch.testing.assert_close(permuted.regions, out.regions[perm], atol=1e-6, rtol=0)
        for key in ("edit", "preserve"):
            torch.testing.assert_close(permuted.components[key], out.components[key][perm])


def test_registered_names():
    assert {"preserve", "region_ocr", "edit_regions"} <= set(reward_models.names())
