#!/usr/bin/env bash
# The checks to run on a machine with a CUDA GPU (none of them can run in CI, which has no GPU).
#
#     bash bench/gpu.sh [WORKDIR]        # meshshard installed; python3 (or $PYTHON) holds torch with CUDA
#     SIDE=12 bash bench/gpu.sh          # a smaller mesh (default 30: 27,000 nodes)
#
# From a generated dataset of tet-mesh cases (.vtu files with point fields), the commands a user
# runs, on the GPU: dataset, partition, train (float32, bf16-mixed, tf32, float64, --model), predict,
# and the same runs' NCCL set-up under torchrun. Then what one machine with fewer GPUs than ranks
# does: --nproc 2 on one GPU runs the ranks on the CPU (gloo) with a note, MESHSHARD_BACKEND=nccl
# refuses it before any rank starts, and torchrun with 2 ranks on one GPU is refused on every rank
# at once. With 2 GPUs or more, --nproc 2 trains and predicts on NCCL. Then
# float64 training on the GPU against the CPU: the losses of 5 steps, relative difference.
# Each step prints its command and its exit code; the script goes on after a failure and ends
# with a summary (exit 1 if a check failed). Timings: bench/meshgraphnet_peers.py --device cuda.
set -u
py=${PYTHON:-python3}
W=${1:-/tmp/meshshard-gpu}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
export PYTHONUNBUFFERED=1 MESHSHARD_TIMEOUT=120
failed=()

check() {  # check NAME EXPECTED_RC|nonzero COMMAND...: run, print its last lines, compare the exit code
    local name=$1 want=$2
    shift 2
    echo
    echo "=== $name"
    echo "+ $*"
    local start=$SECONDS
    "$@" >"$W/$name.log" 2>&1
    local rc=$?
    tail -n 6 "$W/$name.log"
    echo "--- $name: exit $rc (expected $want), $((SECONDS - start)) s"
    if [ "$want" = nonzero ]; then [ "$rc" != 0 ]; else [ "$rc" = "$want" ]; fi || failed+=("$name (exit $rc, expected $want)")
}

if ! $py -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "bench/gpu.sh: torch sees no CUDA device here; these checks need one" >&2
    exit 2
fi
$py - <<'EOF'
import torch, torch_geometric
try:
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
except (AttributeError, RuntimeError):
    nccl = "none"
print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", nccl, "PyG", torch_geometric.__version__)
print("GPUs:", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
EOF

# Six cases on one SIDE^3-node tet box: input k (a smooth field, different per case), target T.
$py - "$ROOT" "${SIDE:-30}" <<'EOF'
import sys
from pathlib import Path
import meshio
import numpy as np
sys.path.insert(0, str(Path(sys.argv[1]) / "bench"))
from _meshes import make_box_mesh
points, tets = make_box_mesh(int(sys.argv[2]))
Path("cases").mkdir()
for case in range(6):
    a = 1 + case
    k = np.sin(a * points[:, 0]) * np.cos(2 * points[:, 1]) + points[:, 2]
    T = np.tanh(k) * (1 - points[:, 0]) + 0.1 * case
    meshio.write(f"cases/case-{case}.vtu", meshio.Mesh(points, [("tetra", tets)], point_data={"k": k, "T": T}))
print(f"6 cases, {len(points):,} nodes, {len(tets):,} tets")
EOF

ms() { $py -m meshshard "$@"; }
check dataset 0 ms dataset cases --out data --inputs k --targets T --val-fraction 0.34
check partition-1 0 ms partition data --parts 1 --out parts1
check partition-2 0 ms partition data --parts 2 --out parts2
train=(--data data --steps 20 --log-every 5 --val-every 10)
check train-gpu 0 ms train parts1 "${train[@]}" --out run-gpu
grep -q "cuda" "$W/train-gpu.log" || failed+=("train-gpu: the banner does not name a CUDA device")
check train-gpu-bf16 0 ms train parts1 "${train[@]}" --out run-bf16 --precision bf16-mixed
check train-gpu-tf32 0 ms train parts1 "${train[@]}" --out run-tf32 --precision tf32
check train-torchrun-nccl 0 $py -m torch.distributed.run --nproc-per-node 1 -m meshshard train parts1 "${train[@]}" --out run-nccl
check train-own-model 0 ms train parts1 "${train[@]}" --out run-model --model "$ROOT/examples/own_model/model.py:build" --model-args '{"hidden": 32}'
check predict-gpu 0 ms predict run-gpu --data data --out pred-gpu
check predict-own-model 0 ms predict run-model --data data --out pred-model --model "$ROOT/examples/own_model/model.py:build"

ngpu=$($py -c "import torch; print(torch.cuda.device_count())")
if [ "$ngpu" -ge 2 ]; then
    check train-nccl-2 0 ms train parts2 "${train[@]}" --out run-nccl2 --nproc 2
    check predict-nccl-2 0 ms predict run-nccl2 --data data --out pred-nccl2 --nproc 2
else
    check nproc-2-one-gpu 0 ms train parts2 "${train[@]}" --out run-cpu2 --nproc 2
    grep -q "note: 2 ranks and 1 GPU here: the ranks run on the CPU (gloo)" "$W/nproc-2-one-gpu.log" || failed+=("nproc-2-one-gpu: no note")
    MESHSHARD_BACKEND=nccl check refuse-nccl-nproc-2 2 ms train parts2 "${train[@]}" --out run-refused --nproc 2
    grep -q "Expected a GPU for each of the 2 ranks" "$W/refuse-nccl-nproc-2.log" || failed+=("refuse-nccl-nproc-2: not the expected message")
    check refuse-torchrun-2 nonzero timeout 120 $py -m torch.distributed.run --nproc-per-node 2 -m meshshard train parts2 "${train[@]}" --out run-refused2
    grep -q "Expected a GPU for each of the 2 ranks" "$W/refuse-torchrun-2.log" || failed+=("refuse-torchrun-2: not the expected message")
fi

# float64 on the GPU against the CPU: same seed, same data, 5 steps.
check train-f64-gpu 0 ms train parts1 --data data --steps 5 --log-every 1 --dtype float64 --out run-f64-gpu
CUDA_VISIBLE_DEVICES= check train-f64-cpu 0 ms train parts1 --data data --steps 5 --log-every 1 --dtype float64 --out run-f64-cpu
$py - <<'EOF' || failed+=("float64 GPU vs CPU losses differ")
import json
def losses(run):
    rows = [json.loads(line) for line in open(f"{run}/log.jsonl")]
    return [r["loss"] for r in rows if "loss" in r]
gpu, cpu = losses("run-f64-gpu"), losses("run-f64-cpu")
worst = max(abs(a - b) / abs(b) for a, b in zip(gpu, cpu))
print(f"float64, 5 steps: GPU losses {gpu}\n                  CPU losses {cpu}\n  worst relative difference {worst:.2e}")
assert len(gpu) == len(cpu) > 0 and worst < 1e-10, worst
EOF

echo
if [ ${#failed[@]} -eq 0 ]; then
    echo "gpu.sh: every check passed (logs in $W)"
else
    echo "gpu.sh: ${#failed[@]} check(s) failed (logs in $W):"
    printf '  %s\n' "${failed[@]}"
    exit 1
fi
