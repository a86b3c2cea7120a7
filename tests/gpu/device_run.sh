#!/usr/bin/env bash
# horo's GPU checks and GPU benches in one run, on a machine with one CUDA GPU and no network.
#
#   tests/gpu/device_run.sh OUTDIR          # on the GPU machine, from the repository root
#   tests/gpu/device_run.sh OUTDIR --cpu    # a dry run of the same steps on CPU (tiny sizes), e.g. in CI
#
# The GPU machine needs CUDA, torch, CuPy with NCCL and pytest; what it lacks (Open MPI, mpi4py, Keras) comes as
# wheels in ./.whl (docs/contributing.md, "GPU checks", says which and how to download them). The script makes a venv over the
# machine's own packages, installs the wheels into it, and runs, each step with its own time limit:
#   1. tests/gpu/host_path.py --check: host time of a repeated horo.torch.allreduce_ and of a gradient bucket;
#   2. bench lightning, MLP and ResNet-50: HoroStrategy (its full exchange path: horo takes no size-1 shortcut)
#      against DDP over NCCL;
#   3. bench torch_step: a ResNet-50 step with horo.torch.DistributedOptimizer against DDP;
#   4. bench gpu: horo's NCCL path against raw NCCL calls and host staging;
#   5. pytest tests/gpu.
# Every step's output goes to OUTDIR/<step>.txt; OUTDIR/summary.txt collects the PASS/FAIL lines. Exit status:
# 0 when every step ran and nothing failed. STEPS=name,name,... runs only those steps; lightning_profile
# (tests/gpu/lightning_profile.py: where a Lightning ResNet-50 step spends its time) runs only when named there.
set -u
OUT=${1:?usage: tests/gpu/device_run.sh OUTDIR [--cpu]}
MODE=${2:-gpu}
cd "$(dirname "$0")/../.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe

if [ "$MODE" = "--cpu" ]; then
    PY=${PYTHON:-.venv/bin/python}
else
    # A venv that sees the machine's packages (torch, CuPy, ...) through a .pth file, with the wheels on top.
    VENV=${HORO_GPU_VENV:-$HOME/.cache/horo-gpu-venv}
    PY=$VENV/bin/python
    if [ ! -x "$PY" ]; then
        img=$(python3 -c "import site; print(site.getsitepackages()[0])")
        python3 -m venv "$VENV"
        echo "$img" > "$("$PY" -c 'import site; print(site.getsitepackages()[0])')/zz_image.pth"
        if ls .whl/*.whl >/dev/null 2>&1; then
            "$PY" -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
        fi
    fi
fi
MPIEXEC=$(dirname "$PY")/mpiexec
[ -x "$MPIEXEC" ] || MPIEXEC=mpiexec
export PATH=$(dirname "$PY"):$PATH
failed=0
DEFAULT_STEPS=host_path,lightning_mlp,lightning_resnet50,torch_step,bench_gpu,pytest_gpu

step() {  # step NAME SECONDS COMMAND...: run with a time limit, keep its output, note a failure
    local name=$1 limit=$2
    shift 2
    case ",${STEPS:-$DEFAULT_STEPS}," in *",$name,"*) ;; *) return 0 ;; esac
    echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" | tee -a "$OUT/summary.txt"
    local t0=$SECONDS
    timeout -k 10 "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    if [ $rc -eq 5 ] && [ "$name" = pytest_gpu ] && [ "$MODE" = "--cpu" ]; then
        rc=0  # pytest's "no tests ran": without a GPU every GPU test skips
    fi
    grep -a -E '^(PASS|FAIL)|^- .*(PASS|FAIL)' "$OUT/$name.txt" | tee -a "$OUT/summary.txt"
    echo "    rc=$rc in $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
    if [ $rc -ne 0 ]; then
        failed=1
        tail -n 25 "$OUT/$name.txt"
    fi
}

: > "$OUT/summary.txt"
{
    date -u
    uname -a
    nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
    nproc
    "$PY" -c "import sys, torch, numpy; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
    "$PY" -c "import cupy; from cupy.cuda import nccl; print('cupy', cupy.__version__, 'nccl', nccl.get_version())" \
        2>&1 | tail -n 1
    "$PY" -c "import mpi4py, horo; from mpi4py import MPI; print('mpi4py', mpi4py.__version__, MPI.Get_library_version().splitlines()[0])"
    git log -1 --format='%H %s' 2>/dev/null || true
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [ "$MODE" = "--cpu" ]; then
    step lightning_mlp 300 "$MPIEXEC" -n 2 "$PY" -m horo.bench lightning --accelerator cpu --model mlp --width 64 \
        --steps 3 --warmup 2 --repeats 1 --variants horo,ddp
    step lightning_resnet50 300 "$MPIEXEC" -n 1 "$PY" -m horo.bench lightning --accelerator cpu --model resnet50 \
        --image-size 32 --batch-size 2 --steps 2 --warmup 1 --repeats 1 --variants horo,ddp
    step torch_step 300 "$MPIEXEC" -n 2 "$PY" -m horo.bench torch_step --device cpu --model resnet50 \
        --image-size 32 --batch-size 2 --steps 2 --warmup 1 --repeats 1
    step bench_gpu 120 "$MPIEXEC" -n 1 "$PY" -m horo.bench gpu --sizes 4KiB --repeats 1
    step pytest_gpu 300 "$PY" -m pytest -q -p no:cacheprovider tests/gpu
else
    step host_path 120 "$MPIEXEC" -n 1 "$PY" tests/gpu/host_path.py --check
    step lightning_mlp 150 "$MPIEXEC" -n 1 "$PY" -m horo.bench lightning --accelerator gpu --model mlp \
        --steps 40 --warmup 5 --repeats 5 --variants horo,ddp --target 0.95
    step lightning_resnet50 150 "$MPIEXEC" -n 1 "$PY" -m horo.bench lightning --accelerator gpu --model resnet50 \
        --batch-size 64 --steps 20 --warmup 5 --repeats 7 --variants horo,ddp --target 0.98
    step torch_step 120 "$MPIEXEC" -n 1 "$PY" -m horo.bench torch_step --device cuda --model resnet50 \
        --batch-size 64 --steps 10 --warmup 3 --repeats 5 --target 1.03
    step bench_gpu 90 "$MPIEXEC" -n 1 "$PY" -m horo.bench gpu --sizes 4KiB,64KiB,1MiB,16MiB,256MiB --repeats 5
    step pytest_gpu 240 "$PY" -m pytest -q -p no:cacheprovider --timeout=200 tests/gpu
    step lightning_profile 150 "$MPIEXEC" -n 1 "$PY" tests/gpu/lightning_profile.py
fi
[ -f "$OUT/pytest_gpu.txt" ] && grep -a -E "passed|failed|error" "$OUT/pytest_gpu.txt" | tail -n 1 \
    | tee -a "$OUT/summary.txt"
echo "=== done $(date -u +%H:%M:%S): $([ $failed = 0 ] && echo 'every step ran and passed' || echo 'some step FAILED')" \
    | tee -a "$OUT/summary.txt"
exit $failed
