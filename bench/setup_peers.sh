#!/usr/bin/env bash
# Install the peers of bench/meshgraphnet_peers.py into .venv (optional; not dependencies of meshshard).
#
# - nvidia-physicsnemo without its declared dependencies: they include torchvision, whose wheels on
#   the package index need CUDA libraries (and would replace the CPU torch 2.13.0); its MeshGraphNet
#   needs only the modules listed below, and the benchmark gives it a stand-in torchvision.
# - torch-scatter, built against the installed torch (no wheel matches torch 2.13 on CPU): about
#   5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
$PY -m pip install --quiet torch==2.13.0 warp-lang s3fs jaxtyping einops tensordict timm nvtx omegaconf treelib termcolor
$PY -m pip uninstall --quiet --yes torchvision || true   # timm pulls one in; it cannot load beside the CPU torch
$PY -m pip install --quiet --no-deps nvidia-physicsnemo
$PY -c "import torch_scatter" 2>/dev/null || $PY -m pip install --quiet --no-build-isolation torch-scatter
PYTHONPATH=bench/_stubs $PY -c "import torch_scatter, physicsnemo.models.meshgraphnet; print('peers ready')"
