"""The OCR reward with the real RapidOCR models (bundled in the wheel, no network)."""

from __future__ import annotations

import functools

import pytest
import torch

import reward_models
from reward_models import Media
from reward_models.ocr import levenshtein, reading_order, render_text, target_text, text_score

WORDS = [
    "Hello World", "FLOW GRPO", "open 24 hours", "Coffee Shop", "Quiet Library", "Sale 50%",
    "No Parking", "Fresh Bread", "EXIT", "Welcome Home",
]
BACKGROUNDS = [(235, 230, 220), (250, 250, 250), (220, 235, 245), (245, 235, 200), (230, 245, 230)]


@functools.cache
def ocr_reward():
    return reward_models.get("ocr", threads=1)


def rendered_signs() -> torch.Tensor:
    """``[10, 3, 128, 256]``: each word in DejaVu Sans (or Pillow's font) on a light color."""
    return torch.stack([
        render_text(w, font_size=28 + 2 * (i % 3), background=BACKGROUNDS[i % len(BACKGROUNDS)])
        for i, w in enumerate(WORDS)
    ])


def test_ocr_scores_rendered_text_high_and_wrong_targets_low():
    images = rendered_signs()
    meta = [{} for _ in WORDS]
    right = ocr_reward()(Media("image", images), [f'a sign that says "{w}"' for w in WORDS], meta)
    wrong_words = WORDS[1:] + WORDS[:1]
    wrong = ocr_reward()(Media("image", images), [f'a sign that says "{w}"' for w in wrong_words],
                         meta)
    assert right.scores.mean() >= 0.9, right.scores
    assert wrong.scores.mean() <= 0.5, wrong.scores
    assert ((right.scores >= 0) & (right.scores <= 1)).all()


def test_ocr_video_averages_frames_and_metadata_text_wins():
    """A 2-frame video with the right text in one frame scores about half; metadata["text"]
    overrides the prompt's quote."""
    sign, blank = render_text("EXIT"), torch.full((3, 128, 256), 0.9)
    video = torch.stack([torch.stack([sign, blank]), torch.stack([sign, sign])])
    out = ocr_reward()(Media("video", video), ['"EXIT"', 'a sign, no quote'],
                       [{}, {"text": "exit"}])
    torch.testing.assert_close(out.scores, torch.tensor([0.5, 1.0]))


def test_target_text_rules():
    assert target_text('a sign that says "Hello"', {}) == "Hello"
    assert target_text("a ‘curly’ one and \u201cdouble\u201d", {}) == "curly"
    assert target_text("don't say 'hi there' twice", {}) == "hi there"
    assert target_text("no quotes", {"text": "given"}) == "given"
    with pytest.raises(ValueError, match="metadata\\['text'\\]"):
        target_text("no quotes at all", {})


def test_text_score_rules():
    assert levenshtein("kitten", "sitting") == 3 and levenshtein("", "abc") == 3
    assert text_score("Hello World", "hello  world") == 1.0  # case and whitespace ignored
    assert text_score("Hello World", "hello  world", case_sensitive=True) < 1.0
    assert text_score("abcd", "abxd") == 0.75
    assert text_score("ab", "completely different") == 0.0  # clipped at 0
    assert text_score("OPEN", "we are open now") < 1.0
    assert text_score("OPEN", "we are open now", contains_is_exact=True) == 1.0


def test_reading_order_lines_then_left_to_right():
    def quad(x, y):
        return [[x, y], [x + 40, y], [x + 40, y + 20], [x, y + 20]]

    boxes = [(quad(100, 52), "world"), (quad(0, 0), "top"), (quad(0, 50), "hello")]
    assert reading_order(boxes) == "top hello world"
