"""F5-TTS (zero-shot voice-cloning text-to-speech) through the ``f5-tts`` package's model code.

F5-TTS is a DiT that infills a log-mel spectrogram: the reference voice's mel fills the first
``P`` frames of its ``cond`` input, the text (reference transcript + the text to speak, as
characters/pinyin) is embedded along the frames, and the flow runs over all ``T`` frames. Its
checkpoints are not diffusers pipelines: a folder (or hub repo) holds ``model_*.safetensors`` and
``vocab.txt``; the architecture comes from the folder's ``config.json`` (written by
:meth:`F5TTSPipeline.save_pretrained`) or from one of the package's training configs
(``F5TTS_v1_Base`` by default). Audio is 24 kHz, decoded from the mel by Vocos.

Latents are the mel itself, ``[B, T, n_mels]`` (100 channels, 256-sample hop: 93.75 frames per
second), ``T = P + round(audio_duration * 93.75)`` for every sample; or, with ``audio_duration:
per_prompt``, each prompt its own length: its metadata's ``duration`` (seconds), else F5's own
rule (:meth:`F5TTSAdapter.estimate_frames`: the reference's frames per UTF-8 byte of its
transcript times the text's bytes). A batch is then padded to its longest sample
(:mod:`pipelines.lengths`). F5's DiT takes a frame mask, which its text and convolutional
position embeddings honour, but its shipped configs switch the attention mask off
(``attn_mask_enabled: False``), so padded frames would reach the others through attention (as
in ``CFM.sample`` with a batch of several durations; F5's own inference generates one text at a
time). The velocity therefore runs each group of equally long samples at its own length, with
no mask (one DiT call per distinct length: a GRPO group shares its prompt, so a batch has few),
which is ``CFM.sample`` of that sample alone, and is 0 on the padding. The condition carries the
lengths and :data:`~pipelines.base.LOGPROB_WEIGHT` 0 on the padding; :meth:`F5TTSAdapter.decode`
vocodes each sample at its own length.

Model units: F5's time is ``t = 1 - sigma`` (its ``t = 0`` is noise) and it predicts
``x_data - noise``, so our velocity is ``v = -pred``. The schedule is ``CFM.sample``'s: the
empirically pruned steps for 5, 6, 7, 10, 12 or 16 steps (``linspace`` otherwise), then sway
sampling ``t + s (cos(pi t / 2) - 1 + t)``; with ``s = -1``, ``sigma = cos(pi t / 2)``.

Guidance: F5's CFG ``pred + cfg_strength (pred - null)``, the null branch without text and
reference mel, as one batched call (the DiT's ``cfg_infer``): our ``guidance = 1 +
cfg_strength``, so F5's default ``cfg_strength = 2`` is ``guidance = 3``. The DiT's text cache is
off (``cache=False``): a replay sees other sub-batches than the rollout.

Reference frames: ``CFM.sample`` lets the model move them and overwrites them with the
reference at the end; here they carry :data:`~pipelines.base.LOGPROB_WEIGHT` 0 (nothing in
log-probs and KLs) and :meth:`F5TTSAdapter.decode` drops them. Dropout in the DiT (0.1 in F5's
configs) is switched off: a replayed log-prob must equal the rollout's.

Imports: ``f5_tts.model``'s ``__init__`` also imports F5's trainer (``wandb``, ``datasets``,
``ema_pytorch``). Without those, the model modules are imported from the package folder
directly (:func:`import_f5`), so inference needs only the model code's dependencies
(``scripts/install_f5_tts.sh``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .base import LATENT_LENGTH, LOGPROB_WEIGHT, Cond, FlowAdapter, PeftLoraFiles, register
from .lengths import (
    DURATION_KEY,
    check_audio_duration,
    decode_by_length,
    length_condition,
    length_groups,
    metadata_seconds,
    pad_frames,
    padded_length,
)

VOCOS_ID = "charactr/vocos-mel-24khz"
DEFAULT_CONFIG = "F5TTS_v1_Base"
TARGET_RMS = 0.1  # F5 raises quieter reference audio to this RMS and scales its output back
TRAINER_ONLY = ("wandb", "datasets", "ema_pytorch")
MEL_KEYS = ("target_sample_rate", "n_mel_channels", "hop_length", "win_length", "n_fft",
            "mel_spec_type")


@lru_cache(maxsize=1)
def import_f5() -> types.SimpleNamespace:
    """F5's ``DiT``, ``CFM`` and helpers (``utils``) from the installed ``f5-tts``.

    When a trainer-only dependency is missing, ``f5_tts.model`` is registered as a bare package
    over its folder (its ``__init__`` not run), so its submodules import; ``CFM`` and ``DiT`` are
    then set on it as its ``__init__`` would."""
    if importlib.util.find_spec("f5_tts") is None:
        raise ImportError("f5_tts family: the f5-tts package is not installed "
                          "(run scripts/install_f5_tts.sh)")
    missing = [m for m in TRAINER_ONLY if importlib.util.find_spec(m) is None]
    if "f5_tts.model" not in sys.modules and missing:
        package = types.ModuleType("f5_tts.model")
        roots = importlib.util.find_spec("f5_tts").submodule_search_locations
        package.__path__ = [str(Path(root) / "model") for root in roots]
        sys.modules["f5_tts.model"] = package
    dit = importlib.import_module("f5_tts.model.backbones.dit")
    cfm = importlib.import_module("f5_tts.model.cfm")
    utils = importlib.import_module("f5_tts.model.utils")
    package = sys.modules["f5_tts.model"]
    package.CFM, package.DiT = cfm.CFM, dit.DiT
    return types.SimpleNamespace(
        DiT=dit.DiT, CFM=cfm.CFM, utils=utils,
        package_dir=Path(next(iter(importlib.util.find_spec("f5_tts").submodule_search_locations))),
    )


def read_vocab(path: str | Path) -> dict[str, int]:
    """F5's ``vocab.txt``: one token per line, its index the line number (F5's reader)."""
    return import_f5().utils.get_tokenizer(str(path), "custom")[0]


def package_config(name_or_path: str) -> dict[str, Any]:
    """``{"backbone", "arch", "mel_spec"}`` of an F5 training YAML: a file, or the name of one
    of the package's ``configs/`` (``F5TTS_v1_Base``, ``F5TTS_Base``, ...)."""
    import yaml

    path = Path(name_or_path)
    if not path.is_file():
        path = import_f5().package_dir / "configs" / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ValueError(f"f5_tts: model_config {name_or_path!r} is neither a YAML file nor one "
                         "of the package's configs (e.g. F5TTS_v1_Base)")
    model = yaml.safe_load(path.read_text())["model"]
    return {"backbone": model["backbone"], "arch": dict(model["arch"]),
            "mel_spec": {k: model["mel_spec"][k] for k in MEL_KEYS}}


def vocos_from_config(config: dict) -> torch.nn.Module:
    """A Vocos vocoder (random weights) from its ``config.yaml`` content: ``feature_extractor``,
    ``backbone`` and ``head``, each ``{"class_path", "init_args"}``."""
    from vocos import Vocos
    from vocos.pretrained import instantiate_class

    parts = {k: instantiate_class(args=(), init=config[k])
             for k in ("feature_extractor", "backbone", "head")}
    return Vocos(**parts)


def load_vocos(source: str, revision: str | None = None,
               cache_dir: str | None = None) -> tuple[torch.nn.Module, dict]:
    """A Vocos vocoder and its config from a local folder (``config.yaml`` + ``model.safetensors``
    or ``pytorch_model.bin``) or a hub repo (``charactr/vocos-mel-24khz``); tensors only, nothing
    unpickled."""
    import yaml
    from safetensors.torch import load_file

    folder = Path(source)
    if folder.is_dir():
        config_file = folder / "config.yaml"
        weights = folder / "model.safetensors"
        if not weights.is_file():
            weights = folder / "pytorch_model.bin"
    else:
        from huggingface_hub import hf_hub_download

        def get(name: str) -> Path:
            return Path(hf_hub_download(source, name, revision=revision, cache_dir=cache_dir))

        config_file, weights = get("config.yaml"), get("pytorch_model.bin")
    config = yaml.safe_load(config_file.read_text())
    vocoder = vocos_from_config(config)
    state = (load_file(str(weights)) if weights.suffix == ".safetensors"
             else torch.load(weights, map_location="cpu", weights_only=True))
    vocoder.load_state_dict(state)
    return vocoder.eval().requires_grad_(False), config


class F5TTSPipeline(torch.nn.Module):
    """The adapter's ``pipeline``: F5's ``CFM`` (DiT + mel front end), its vocabulary and the
    Vocos vocoder, with F5's folder layout on disk.

    Args:
        model: an F5 ``CFM``.
        config: ``{"backbone": "DiT", "arch": DiT kwargs, "mel_spec": MelSpec kwargs}``
            (needed by :meth:`save_pretrained` only).
        vocoder: a module with Vocos' ``decode(mel [B, n_mels, frames]) -> [B, samples]``;
            ``None``: ``vocoder_source`` is loaded on first use.
        vocoder_config: the vocoder's ``config.yaml`` as a dict (to save it).
        vocoder_source: folder or hub id loaded when ``vocoder`` is ``None``.
    """

    def __init__(self, model: torch.nn.Module, config: dict | None = None,
                 vocoder: torch.nn.Module | None = None, vocoder_config: dict | None = None,
                 vocoder_source: str = VOCOS_ID) -> None:
        super().__init__()
        self.model = model
        self.config = config
        self.vocoder = vocoder
        self.vocoder_config = vocoder_config
        self.vocoder_source = vocoder_source

    @property
    def transformer(self) -> torch.nn.Module:
        return self.model.transformer

    def get_vocoder(self) -> torch.nn.Module:
        """The vocoder on the DiT's device, loaded from ``vocoder_source`` on first use."""
        if self.vocoder is None:
            self.vocoder, self.vocoder_config = load_vocos(self.vocoder_source)
        device = next(self.transformer.parameters()).device
        return self.vocoder.to(device)

    @classmethod
    def from_config(cls, config: dict, vocab: dict[str, int] | None, **kwargs: Any
                    ) -> F5TTSPipeline:
        """A randomly initialised model of ``config`` (F5's init: output layers zero) with the
        token map ``vocab`` (``None``: UTF-8 bytes, 256 tokens)."""
        f5 = import_f5()
        if config.get("backbone", "DiT") != "DiT":
            raise ValueError(f"f5_tts: only the DiT backbone (F5-TTS) is supported, got "
                             f"{config['backbone']!r}")
        mel = config["mel_spec"]
        dit = f5.DiT(**config["arch"], text_num_embeds=len(vocab) if vocab else 256,
                     mel_dim=mel["n_mel_channels"])
        cfm = f5.CFM(transformer=dit, mel_spec_kwargs=mel, vocab_char_map=vocab)
        return cls(cfm, config, **kwargs)

    @classmethod
    def from_pretrained(cls, path_or_id: str, *, model_config: str = DEFAULT_CONFIG,
                        checkpoint: str | None = None, vocab_file: str | None = None,
                        vocoder: str | torch.nn.Module | None = None,
                        subfolder: str | None = None, revision: str | None = None,
                        cache_dir: str | None = None) -> F5TTSPipeline:
        """Load an F5 checkpoint folder or hub repo (``SWivid/F5-TTS`` with ``subfolder=
        "F5TTS_v1_Base"``): the architecture from its ``config.json`` or ``model_config``, the
        weights from ``checkpoint`` (default: its one ``model_*.safetensors``; EMA keys are
        read as F5 reads them), the vocabulary from ``vocab_file``, its ``vocab.txt`` or the
        package's, the vocoder from ``vocoder``, its ``vocoder/`` folder or Vocos' hub repo."""
        from safetensors.torch import load_file

        folder = Path(path_or_id).expanduser()
        if not folder.is_dir() and (path_or_id.startswith((".", "/", "~"))
                                    or path_or_id.count("/") != 1):
            raise ValueError(f"f5_tts: {path_or_id} is neither a folder nor a hub id (org/name)")
        if not folder.is_dir():
            from huggingface_hub import snapshot_download

            prefix = f"{subfolder.strip('/')}/" if subfolder else ""
            weights = checkpoint or "model_*.safetensors"
            root = snapshot_download(path_or_id, revision=revision, cache_dir=cache_dir,
                                     allow_patterns=[prefix + weights, f"{prefix}vocab.txt",
                                                     f"{prefix}config.json"])
            folder = Path(root) / prefix
        elif subfolder:
            folder = folder / subfolder
        config_file = folder / "config.json"
        config = (json.loads(config_file.read_text()) if config_file.is_file()
                  else package_config(model_config))
        candidates = ([folder / checkpoint] if checkpoint
                      else sorted(folder.glob("model_*.safetensors")))
        if len(candidates) != 1 or not candidates[0].is_file():
            found = ", ".join(p.name for p in candidates) or "none"
            raise ValueError(f"f5_tts: {folder} needs one model_*.safetensors or the "
                             f"checkpoint option (found: {found})")
        vocab_path = Path(vocab_file) if vocab_file else folder / "vocab.txt"
        if not vocab_path.is_file():
            vocab_path = import_f5().package_dir / "infer" / "examples" / "vocab.txt"
        if isinstance(vocoder, torch.nn.Module):
            vocoder_kwargs = {"vocoder": vocoder}
        else:
            source = vocoder or (str(folder / "vocoder") if (folder / "vocoder").is_dir()
                                 else VOCOS_ID)
            loaded, vocoder_config = load_vocos(source, cache_dir=cache_dir)
            vocoder_kwargs = {"vocoder": loaded, "vocoder_config": vocoder_config}
        vocab = read_vocab(vocab_path)
        state = {k.removeprefix("ema_model."): v for k, v in load_file(str(candidates[0])).items()}
        state = {k: v for k, v in state.items()  # F5's loader drops the same keys
                 if k not in ("initted", "step") and not k.startswith("mel_spec.")}
        rows = state.get("transformer.text_embed.text_embed.weight", torch.empty(0)).shape[0]
        if rows != len(vocab) + 1:
            raise ValueError(f"f5_tts: {vocab_path} has {len(vocab)} tokens but the checkpoint "
                             f"embeds {rows - 1}; pass the checkpoint's vocab_file")
        pipe = cls.from_config(config, vocab, **vocoder_kwargs)
        pipe.model.load_state_dict(state)
        return pipe

    def save_pretrained(self, directory: str | Path) -> None:
        """Write ``config.json``, ``model_last.safetensors`` (F5's EMA key layout),
        ``vocab.txt`` and, when its config is known, ``vocoder/``."""
        from safetensors.torch import save_file

        if self.config is None:
            raise ValueError("f5_tts: save_pretrained needs the model's config (build it with "
                             "F5TTSPipeline.from_config or load it with from_pretrained)")
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(self.config, indent=2))
        state = {f"ema_model.{k}": v.detach().contiguous().cpu()
                 for k, v in self.model.state_dict().items()}
        save_file(state, str(folder / "model_last.safetensors"))
        vocab = self.model.vocab_char_map
        if vocab is not None:
            tokens = sorted(vocab, key=vocab.get)
            (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in tokens), encoding="utf-8")
        if self.vocoder is not None and self.vocoder_config is not None:
            import yaml

            (folder / "vocoder").mkdir(exist_ok=True)
            (folder / "vocoder" / "config.yaml").write_text(yaml.safe_dump(self.vocoder_config))
            tensors = {k: v.contiguous().cpu() for k, v in self.vocoder.state_dict().items()}
            save_file(tensors, str(folder / "vocoder" / "model.safetensors"))


def f5_text(ref_text: str, text: str) -> str:
    """The string F5's inference reads: the reference transcript ended by ``". "`` (its
    preprocessing) plus one space (its batch step) before the text; no reference, the text."""
    if not ref_text:
        return text
    if not ref_text.endswith(". ") and not ref_text.endswith("。"):
        ref_text += " " if ref_text.endswith(".") else ". "
    if len(ref_text[-1].encode("utf-8")) == 1:
        ref_text += " "
    return ref_text + text


@register("f5_tts")
class F5TTSAdapter(PeftLoraFiles, FlowAdapter):
    """Adapter for F5-TTS checkpoints (text-to-speech in the voice of a reference clip).

    Args:
        path_or_id: checkpoint folder or hub repo (see :meth:`F5TTSPipeline.from_pretrained`).
        model: instead of a path, a built ``CFM``, ``DiT`` or :class:`F5TTSPipeline` (tests).
        pipeline: an already built :class:`F5TTSPipeline` (as every family accepts).
        vocoder: a Vocos-like module, or a folder / hub id to load one from.
        ref_audio: reference voice: a WAV file (mixed to mono, resampled to 24 kHz) or a
            waveform ``[samples]`` / ``[1, samples]`` at the model's rate.
        ref_mel: reference voice as a log-mel ``[frames, n_mels]`` (what ``CFM.sample`` takes).
        ref_text: the reference's transcript (required with a reference; no ASR here).
        audio_duration: seconds of generated speech per sample (after the reference), or
            ``"per_prompt"``: each prompt's metadata ``duration`` (seconds), else F5's length
            rule (:meth:`estimate_frames`, which needs a reference voice).
        sway_coef: sway sampling coefficient in [-1, 1] (F5's default -1), or ``None``.
        use_epss: F5's empirically pruned step grids for 5, 6, 7, 10, 12 and 16 steps.
        target_rms: quieter reference audio is raised to this RMS and the output scaled back.
        torch_dtype: the DiT's dtype (the vocoder stays float32).
        model_config, checkpoint, vocab_file, subfolder, revision, cache_dir: loading options.
    """

    modality = "audio"
    pipeline_classes = ()  # F5 folders are not diffusers pipelines: not checked
    # The attention projections of every DiT block.
    default_lora_targets = ("to_q", "to_k", "to_v", "to_out.0")
    text_encoder_names = ()  # the text embedding is part of the DiT
    per_prompt_encoding = True  # tokens are padded to the frames, as the DiT pads them itself

    def __init__(
        self,
        path_or_id: str | None = None,
        *,
        model: torch.nn.Module | None = None,
        pipeline: F5TTSPipeline | None = None,
        vocoder: str | torch.nn.Module | None = None,
        ref_audio: str | Path | torch.Tensor | None = None,
        ref_mel: torch.Tensor | None = None,
        ref_text: str = "",
        audio_duration: float | str = 5.0,
        sway_coef: float | None = -1.0,
        use_epss: bool = True,
        target_rms: float = TARGET_RMS,
        torch_dtype: str | torch.dtype = "float32",
        model_config: str = DEFAULT_CONFIG,
        checkpoint: str | None = None,
        vocab_file: str | None = None,
        subfolder: str | None = None,
        revision: str | None = None,
        cache_dir: str | None = None,
    ) -> None:
        if sum(x is not None for x in (path_or_id, model, pipeline)) != 1:
            raise ValueError("f5_tts: give one of a checkpoint folder / hub id, model= or "
                             "pipeline=")
        seconds = check_audio_duration("f5_tts", audio_duration)
        if sway_coef is not None and not -1.0 <= sway_coef <= 1.0:
            raise ValueError(f"f5_tts: sway_coef must be in [-1, 1] or None, got {sway_coef}")
        if ref_audio is not None and ref_mel is not None:
            raise ValueError("f5_tts: give ref_audio or ref_mel, not both")
        if (ref_audio is not None or ref_mel is not None) != bool(ref_text.strip()):
            raise ValueError("f5_tts: a reference voice and its ref_text go together")
        if path_or_id is not None:
            pipe = F5TTSPipeline.from_pretrained(
                path_or_id, model_config=model_config, checkpoint=checkpoint,
                vocab_file=vocab_file, vocoder=vocoder, subfolder=subfolder, revision=revision,
                cache_dir=cache_dir)
        else:
            pipe = self._wrap(model if pipeline is None else pipeline, vocoder, vocab_file)
        dtype = getattr(torch, torch_dtype) if isinstance(torch_dtype, str) else torch_dtype
        pipe.model.to(dtype)
        if pipe.vocoder is not None:
            pipe.vocoder.requires_grad_(False).eval()
        self.pipeline = pipe
        self.transformer = pipe.transformer
        for module in self.transformer.modules():  # replayed log-probs must equal the rollout's
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        # the trainer's switch, bound to the DiT so that a deep copy of it stays self-contained
        self.transformer.enable_gradient_checkpointing = types.MethodType(
            _checkpoint_activations, self.transformer)
        mel = pipe.model.mel_spec
        self.sample_rate = int(mel.target_sample_rate)
        self.hop_length = int(mel.hop_length)
        self.n_mels = int(pipe.model.num_channels)
        self.audio_duration = seconds  # None: per prompt
        if seconds is None:  # a sample's length is part of its condition, padded to the batch's
            self.condition_keys = (DURATION_KEY,)
            self.per_prompt_encoding = False
        self.sway_coef = sway_coef
        self.use_epss = use_epss
        self.target_rms = float(target_rms)
        self.ref_text = ref_text if ref_text.strip() else ""
        self.gain = 1.0  # F5 scales the output by rms / target_rms after raising a quiet ref
        if ref_audio is not None:
            ref_mel = self.reference_mel(ref_audio)
        self.ref_mel = (torch.zeros(0, self.n_mels) if ref_mel is None
                        else torch.as_tensor(ref_mel, dtype=torch.float32).cpu())
        if self.ref_mel.dim() != 2 or self.ref_mel.shape[1] != self.n_mels:
            raise ValueError(f"f5_tts: ref_mel must be [frames, {self.n_mels}], got "
                             f"{tuple(self.ref_mel.shape)}")

    @staticmethod
    def _wrap(model: torch.nn.Module, vocoder: Any, vocab_file: str | None) -> F5TTSPipeline:
        """An :class:`F5TTSPipeline` around a built ``CFM`` or ``DiT``."""
        if isinstance(model, F5TTSPipeline):
            pipe = model
        else:
            f5 = import_f5()
            if isinstance(model, f5.DiT):  # F5's mel settings, the DiT's channels
                mel = {"n_mel_channels": model.proj_out.out_features}
                model = f5.CFM(transformer=model, mel_spec_kwargs=mel)
            if not isinstance(model, f5.CFM):
                raise ValueError(f"f5_tts: model must be an F5 CFM, DiT or F5TTSPipeline, got "
                                 f"{type(model).__name__}")
            if vocab_file:
                model.vocab_char_map = read_vocab(vocab_file)
            pipe = F5TTSPipeline(model)
        if isinstance(vocoder, torch.nn.Module):
            pipe.vocoder = vocoder
        elif isinstance(vocoder, str):
            pipe.vocoder, pipe.vocoder_config = load_vocos(vocoder)
        return pipe

    # ----------------------------------------------------------------------------------------
    # sizes, reference voice and text

    @property
    def ref_frames(self) -> int:
        """``P``, the reference voice's mel frames (0 without one)."""
        return int(self.ref_mel.shape[0])

    @property
    def per_prompt(self) -> bool:
        """Whether each prompt has its own length (``audio_duration: per_prompt``)."""
        return self.audio_duration is None

    def num_frames(self, prompt: str | None = None, meta: dict | None = None) -> int:
        """``T = P + round(seconds * sample_rate / hop)``, ``seconds`` the ``audio_duration``;
        per prompt, its metadata's ``duration``, else ``P +`` :meth:`estimate_frames`."""
        seconds = self.audio_duration
        if self.per_prompt:
            seconds = metadata_seconds("f5_tts", meta)
            if seconds is None:
                if prompt is None:
                    raise ValueError("f5_tts: with audio_duration: per_prompt a sample's length "
                                     "comes from its prompt; draw with initial_noise(generators, "
                                     "cond)")
                return self.ref_frames + max(1, self.estimate_frames(prompt))
        return self.ref_frames + max(1, round(seconds * self.sample_rate
                                              / self.hop_length))

    @torch.no_grad()
    def reference_mel(self, audio: str | Path | torch.Tensor) -> torch.Tensor:
        """``[P, n_mels]`` log-mel of a reference voice, prepared as F5 prepares it (mono, quiet
        audio raised to ``target_rms``, resampled, F5's mel front end); sets :attr:`gain`."""
        import torchaudio

        if isinstance(audio, (str, Path)):
            from flowgrpo.audio import load_wav

            wav, rate = load_wav(audio)
            wav = wav.mean(0, keepdim=True)
        else:
            wav, rate = torch.as_tensor(audio, dtype=torch.float32).reshape(1, -1), None
        if wav.numel() == 0:
            raise ValueError("f5_tts: the reference audio is empty")
        rms = wav.square().mean().sqrt().item()
        self.gain = min(1.0, rms / self.target_rms)
        if rms < self.target_rms:
            wav = wav * self.target_rms / max(rms, 1e-8)
        if rate is not None and rate != self.sample_rate:
            wav = torchaudio.functional.resample(wav, rate, self.sample_rate)
        mel = self.pipeline.model.mel_spec(wav.to(self.device).float())
        return mel[0].transpose(0, 1).float().cpu()

    def tokens(self, prompt: str) -> torch.Tensor:
        """``[L]`` long token ids of ``ref_text + prompt`` as ``CFM.sample`` makes them."""
        utils = import_f5().utils
        text = f5_text(self.ref_text, prompt)
        vocab = self.pipeline.model.vocab_char_map
        if vocab is None:
            return utils.list_str_to_tensor([text])[0]
        return utils.list_str_to_idx(utils.convert_char_to_pinyin([text]), vocab)[0]

    def _rule(self, prompt: str, speed: float) -> float:
        """F5's length rule (``infer_batch_process``) in frames after the reference, unrounded:
        the reference's frames per UTF-8 byte of its transcript times the prompt's bytes, at
        ``speed`` (0.3 for prompts under 10 bytes)."""
        if not self.ref_frames:
            raise ValueError("f5_tts: F5's length rule needs a reference voice; give each prompt "
                             "a duration in its metadata or set audio_duration")
        size = len(prompt.encode("utf-8"))
        speed = 0.3 if size < 10 else speed
        ref_bytes = len(f5_text(self.ref_text, "").encode("utf-8"))
        return self.ref_frames / ref_bytes * size / speed

    def estimate_frames(self, prompt: str, speed: float = 1.0) -> int:
        """F5's length rule in frames after the reference, rounded down as F5 rounds it
        (``int(P / ref_bytes * bytes / speed)``)."""
        return int(self._rule(prompt, speed))

    def estimate_seconds(self, prompt: str, speed: float = 1.0) -> float:
        """F5's length rule for ``prompt`` in seconds (:meth:`estimate_frames` unrounded)."""
        return self._rule(prompt, speed) * self.hop_length / self.sample_rate

    # ----------------------------------------------------------------------------------------
    # the adapter interface

    def encode(self, prompts: list[str]) -> Cond:
        """:meth:`encode_inputs` without metadata (per prompt: the lengths from the text)."""
        return self.encode_inputs(prompts)

    @torch.no_grad()
    def encode_inputs(self, prompts: list[str], metadata: list[dict] | None = None) -> Cond:
        """Token ids ``text [B, T]`` (``-1`` after the text, as F5 pads) and, with a reference
        voice, the per-frame :data:`LOGPROB_WEIGHT` ``[B, T, 1]`` (0 on its frames). Per
        prompt, also each sample's frames :data:`LATENT_LENGTH` ``[B]`` (from its metadata's
        ``duration`` or F5's rule, at least its tokens plus one as ``CFM.sample`` makes it),
        ``T`` the longest, and the weight 0 on the padding too."""
        metadata = metadata if metadata is not None else [{} for _ in prompts]
        tokens = [self.tokens(p) for p in prompts]
        lengths = [self.num_frames(p, m) for p, m in zip(prompts, metadata)]
        if self.per_prompt:  # CFM.sample's floor: at least the text plus one frame
            lengths = [max(n, ids.numel() + 1) for n, ids in zip(lengths, tokens)]
        frames = max(lengths)
        text = torch.full((len(prompts), frames), -1, dtype=torch.long)
        for i, (prompt, ids) in enumerate(zip(prompts, tokens)):
            if ids.numel() >= frames:
                raise ValueError(f"f5_tts: {prompt[:40]!r}... needs {ids.numel() + 1} frames "
                                 f"but samples have {frames}; raise audio_duration")
            text[i, : ids.numel()] = ids
        tensors = {"text": text.to(self.device)}
        if self.per_prompt:
            tensors.update(length_condition(lengths, self.ref_frames, self.device))
        elif self.ref_frames:
            weight = torch.ones(len(prompts), frames, 1, device=self.device)
            weight[:, : self.ref_frames] = 0.0
            tensors[LOGPROB_WEIGHT] = weight
        return Cond(tensors)

    def noise(self, n: int, generator: torch.Generator | None = None,
              frames: int | None = None) -> torch.Tensor:
        """``[n, T, n_mels]`` float32 (``T = frames``, default :meth:`num_frames`); with a seeded
        CPU generator, ``CFM.sample``'s draw."""
        from diffusers.utils.torch_utils import randn_tensor

        shape = (n, frames or self.num_frames(), self.n_mels)
        return randn_tensor(shape, generator=generator, device=self.device, dtype=torch.float32)

    def initial_noise(self, generators: list[torch.Generator], cond: Cond) -> torch.Tensor:
        """Per prompt: each sample's :meth:`noise` at its own length (``CFM.sample``'s draw for
        that duration), zero-padded to the batch's longest; otherwise the default."""
        lengths = cond.tensors.get(LATENT_LENGTH)
        if lengths is None:
            return super().initial_noise(generators, cond)
        parts = [self.noise(1, g, int(n)) for g, n in zip(generators, lengths.tolist())]
        return pad_frames(parts, padded_length(cond))

    def schedule(self, num_steps: int) -> torch.Tensor:
        """``1 - t`` for ``CFM.sample``'s time grid (pruned steps or linspace, then sway)."""
        if self.use_epss:
            t = import_f5().utils.get_epss_timesteps(num_steps, "cpu", torch.float32)
        else:
            t = torch.linspace(0, 1, num_steps + 1, dtype=torch.float32)
        if self.sway_coef is not None:
            t = t + self.sway_coef * (torch.cos(torch.pi / 2 * t) - 1 + t)
        sigmas = 1.0 - t
        sigmas[0], sigmas[-1] = 1.0, 0.0
        return sigmas

    def velocity(
        self, x: torch.Tensor, sigma: torch.Tensor, cond: Cond, guidance: float
    ) -> torch.Tensor:
        """``-pred`` ``[B, T, n_mels]``; with ``guidance > 1``, F5's CFG in one batched call.
        Samples of per-prompt lengths: one call per distinct length, each group cut to its
        length (the DiT's convolutions would read the padding), velocity 0 on the padding."""
        b, frames = x.shape[0], x.shape[1]
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x.device).expand(b)
        text = cond.tensors["text"]
        lengths = cond.tensors.get(LATENT_LENGTH)
        if lengths is None or bool((lengths == frames).all()):
            return self._velocity(x, sigma, text, guidance)
        out = x.new_zeros(x.shape, dtype=self.dtype)
        for n, rows in length_groups(lengths.to(x.device)):
            out[rows, :n] = self._velocity(x[rows, :n], sigma[rows], text[rows, :n], guidance)
        return out

    def _velocity(self, x: torch.Tensor, sigma: torch.Tensor, text: torch.Tensor,
                  guidance: float) -> torch.Tensor:
        """One DiT call on ``x [b, T, n_mels]`` at ``sigma [b]``: ``-pred``."""
        b, frames = x.shape[0], x.shape[1]
        mel = self.ref_mel.to(device=x.device, dtype=self.dtype)
        step_cond = F.pad(mel, (0, 0, 0, frames - mel.shape[0]))[None].expand(b, -1, -1)
        pred = self.transformer(
            x=x.to(self.dtype), cond=step_cond, text=text,
            time=(1.0 - sigma).to(self.dtype), mask=None, cfg_infer=guidance > 1.0, cache=False,
        )
        if guidance > 1.0:  # [cond; null] from one call
            pos, null = pred.chunk(2)
            pred = null + guidance * (pos - null)
        return -pred

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Mel ``[B, T, n_mels]`` -> waveform ``[B, 1, samples]`` in [-1, 1], the reference
        frames dropped, scaled back by :attr:`gain` as F5 does. Per prompt, each sample is
        vocoded at its own length (its frames before the zero padding) and its waveform padded
        with silence to the batch's longest."""
        vocoder = self.pipeline.get_vocoder()  # on the DiT's device

        def vocode(z: torch.Tensor) -> torch.Tensor:
            mel = z.float().transpose(1, 2).to(self.device)
            audio = vocoder.decode(mel).clone() * self.gain  # clone: out of inference mode
            return audio.reshape(z.shape[0], 1, -1).float().clamp(-1, 1)

        generated = x[:, self.ref_frames:]
        return decode_by_length(generated, vocode) if self.per_prompt else vocode(generated)

    def position_weights(self, regions: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """Scores over the generated audio's time ``[B, n]`` (or ``[B, f, n]``, averaged over
        ``f``) -> ``[B, T, 1]``: area-averaged onto the generated frames; reference frames 0."""
        scores = regions.float()
        if scores.dim() == 3:
            scores = scores.mean(1)
        p = self.ref_frames
        mapped = F.interpolate(scores[:, None], size=latents.shape[1] - p, mode="area")
        return F.pad(mapped, (p, 0)).transpose(1, 2)


def _checkpoint_activations(dit: torch.nn.Module) -> None:
    """``enable_gradient_checkpointing`` for F5's DiT, which has its own flag."""
    dit.checkpoint_activations = True
