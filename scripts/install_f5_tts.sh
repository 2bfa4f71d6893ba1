#!/usr/bin/env bash
# Install the optional f5_tts family (pipelines/f5_tts.py) next to an installed flowgrpo, without
# changing the core stack, then run its tests.
#
# Why not `pip install f5-tts`: its requirements bring F5's web UI, training and download helpers
# (gradio, cached_path, wandb, datasets, bitsandbytes, ...), and resolving them downgrades
# huggingface_hub, filelock, rich and pillow. The adapter needs only F5's model code, so:
#   1. the model code's dependencies are installed with pip's resolver, under constraints that
#      hold the core packages at their installed versions (pip fails instead of changing them);
#      torchaudio is left to the resolver so that it fits the installed torch (torchaudio 2.11+
#      accepts any torch >= 2.11; older ones pin their torch exactly);
#   2. f5-tts itself is installed with --no-deps;
#   3. the core packages' versions are compared before and after.
#
# Usage: bash scripts/install_f5_tts.sh   (PYTHON=... to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}

F5_TTS="f5-tts==1.1.22"
MODEL_DEPS=(
    "x-transformers==2.31.10"  # F5's DiT: rotary embeddings
    "torchdiffeq==0.2.5"       # imported by F5's CFM
    "vocos==0.1.0"             # the 24 kHz mel vocoder (with encodec==0.1.1)
    "rjieba==0.2.2"            # F5's text front end (word segmentation)
    "pypinyin==0.55.0"         # F5's text front end (pinyin for Chinese)
    "librosa>=0.10"            # F5's mel filters
    "torchaudio"               # F5's and Vocos' mel spectrograms, resampling
)
CORE="torch torchvision numpy huggingface.hub transformers diffusers accelerate peft pillow \
safetensors filelock rich"

core_versions() {
    local pattern
    pattern="^($(echo "$CORE" | tr -s ' ' '|'))=="
    "$PY" -m pip list --format=freeze 2>/dev/null | grep -iE "$pattern" | sort -f
}

before=$(core_versions)
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "$before" >"$constraints"
echo "core packages held at:"
sed 's/^/  /' "$constraints"

"$PY" -m pip install -c "$constraints" "${MODEL_DEPS[@]}"
"$PY" -m pip install --no-deps "$F5_TTS"

after=$(core_versions)
if [ "$before" != "$after" ]; then
    echo "install_f5_tts.sh: the core packages changed:" >&2
    diff <(echo "$before") <(echo "$after") >&2 || true
    exit 1
fi
"$PY" -c "import torch, torchaudio; print('torch', torch.__version__, '| torchaudio', \
torchaudio.__version__)"
"$PY" -m pytest -q tests/families/test_f5_tts.py
