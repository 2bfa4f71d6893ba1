"""Tiny reward models built in code (random weights, no hub, no network): an open_clip config,
a transformers CLIP and CLAP folder, an aesthetic head. Each builds once per process, in a
temporary folder removed at exit."""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
from pathlib import Path

import torch

TINY_OPEN_CLIP = "flowgrpo-tiny-clip"
OPEN_CLIP_CFG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
def tmpdir(name: str) -> Path:
    """A new temporary folder, removed when the process exits."""
    path = Path(tempfile.mkdtemp(prefix=f"flowgrpo-{name}-"))
    atexit.register(shutil.rmtree, path, True)
    return path


@functools.cache
def tiny_open_clip() -> str:
    """Registers a tiny open_clip config (random init) and returns its model name."""
    import open_clip

    path = tmpdir("openclip-cfg") / f"{TINY_OPEN_CLIP}.json"
    path.write_text(json.dumps(OPEN_CLIP_CFG))
    open_clip.add_model_config(path)
    return TINY_OPEN_CLIP


def char_vocab(specials: list[str], prefix: str = "", suffix: str = "") -> dict[str, int]:
    """Character-level BPE vocabulary (no merges): printable ASCII plus word-boundary variants."""
    chars = [chr(c) for c in range(33, 127)]
    tokens = specials + chars + [prefix + c + suffix for c in chars]
    return {t: i for i, t in enumerate(dict.fromkeys(tokens))}


@functools.cache
def tiny_hf_clip_dir(seed: int = 0) -> str:
    """A random tiny transformers CLIPModel + CLIPProcessor saved to a folder."""
    from transformers import (
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        CLIPProcessor,
        CLIPTokenizer,
    )

    vocab = char_vocab(["<|startoftext|>", "<|endoftext|>"], suffix="</w>")
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[], model_max_length=24)
    images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, max_position_embeddings=24, bos_token_id=0, eos_token_id=1,
            pad_token_id=1,
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            image_size=32, patch_size=8,
        ),
        projection_dim=16,
    )
    path = tmpdir("hf-clip")
    CLIPModel(config).save_pretrained(path)
    CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(path)
    return str(path)


@functools.cache
def tiny_clap_dir(seed: int = 0) -> str:
    """A random tiny ClapModel + ClapProcessor (8 kHz, 1 s window) saved to a folder."""
    from transformers import (
        ClapConfig,
        ClapFeatureExtractor,
        ClapModel,
        ClapProcessor,
        RobertaTokenizer,
    )

    vocab = char_vocab(["<s>", "<pad>", "</s>", "<unk>", "<mask>", "\u0120"], prefix="\u0120")
    tokenizer = RobertaTokenizer(vocab=vocab, merges=[], model_max_length=32)
    features = ClapFeatureExtractor(
        feature_size=16, sampling_rate=8000, hop_length=80, max_length_s=1, fft_window_size=256,
        frequency_min=50, frequency_max=4000, truncation="rand_trunc", padding="repeatpad",
    )
    torch.manual_seed(seed)
    config = ClapConfig(
        text_config=dict(
            vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, max_position_embeddings=40, projection_dim=16,
        ),
        audio_config=dict(
            window_size=4, num_mel_bins=16, spec_size=64, patch_size=4, patch_stride=(4, 4),
            hidden_size=32, patch_embeds_hidden_size=16, depths=[1, 1],
            num_attention_heads=[2, 2], projection_dim=16, enable_fusion=False,
        ),
        projection_dim=16,
    )
    path = tmpdir("clap")
    ClapModel(config).save_pretrained(path)
    ClapProcessor(feature_extractor=features, tokenizer=tokenizer).save_pretrained(path)
    return str(path)


@functools.cache
def tiny_aesthetic_head(dim: int = 16, prefix: str = "") -> str:
    """A random aesthetic head for ``dim``-wide embeddings saved as safetensors."""
    from safetensors.torch import save_file

    from reward_models.aesthetic import AestheticHead

    torch.manual_seed(1)
    head = AestheticHead(dim)
    path = tmpdir("aesthetic") / "head.safetensors"
    save_file({prefix + k: v.contiguous() for k, v in head.state_dict().items()}, str(path))
    return str(path)
