#!/usr/bin/env bash
# The environments of bench/bench_photo_input.py's fast-loader contenders, each a venv of its own (their wheels pin
# numpy/torch versions this project's .venv does not have):
#
#   scripts/bench_loaders_env.sh [DALI_VENV] [FFCV_VENV]     # default: .venv-dali and .venv-ffcv here (git-ignored)
#
# DALI_VENV: nvidia-dali-cuda120 2.4.0 (with nvidia-nvimgcodec and the other CUDA 12 codec wheels it pulls) and
# numpy: about 1.1 GB. Its CPU operators run without a GPU (pipeline device_id=None).
# FFCV_VENV: ffcv 1.0.2, built from its sdist against libturbojpeg and OpenCV (apt: pkg-config libturbojpeg0-dev
# libopencv-dev, installed here when run as root), plus Pillow, which ffcv imports but does not declare; it pulls
# numba, opencv-python and a CUDA build of torch: about 5.8 GB.
# A venv that already imports its loader is left as it is. The bench finds them at these default paths, or through
# SHIFTBENCH_DALI_PYTHON / SHIFTBENCH_FFCV_PYTHON (the venv's bin/python) when made elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
dali=${1:-.venv-dali}
ffcv=${2:-.venv-ffcv}

quiet_pip() {
  local venv=$1
  shift
  set +e
  "$venv/bin/python" -m pip install -q "$@" 2>&1 | grep -v "is ignored: it is neither a file nor a directory"
  local status=${PIPESTATUS[0]}
  set -e
  return "$status"
}

if [ -x "$dali/bin/python" ] && "$dali/bin/python" -c "import nvidia.dali" 2>/dev/null; then
  echo "[loaders] $dali has DALI"
else
  echo "[loaders] $dali: nvidia-dali-cuda120 and numpy"
  [ -x "$dali/bin/python" ] || "$PYTHON" -m venv "$dali"
  quiet_pip "$dali" nvidia-dali-cuda120==2.4.0 numpy
fi

if [ -x "$ffcv/bin/python" ] && "$ffcv/bin/python" -c "import ffcv" 2>/dev/null; then
  echo "[loaders] $ffcv has ffcv"
else
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "[loaders] apt-get install pkg-config libturbojpeg0-dev libopencv-dev (ffcv compiles against them)"
    apt-get install -y -q pkg-config libturbojpeg0-dev libopencv-dev >/dev/null
  else
    echo "[loaders] not root: ffcv needs pkg-config, libturbojpeg0-dev and libopencv-dev installed" >&2
  fi
  echo "[loaders] $ffcv: ffcv (compiled), Pillow"
  [ -x "$ffcv/bin/python" ] || "$PYTHON" -m venv "$ffcv"
  quiet_pip "$ffcv" ffcv==1.0.2 pillow
fi
echo "[loaders] DALI: $dali/bin/python, ffcv: $ffcv/bin/python"
