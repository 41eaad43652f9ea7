#!/usr/bin/env bash
# hpctrain against PyTorch on one GPU, for a lent GPU machine with no internet: installs what it
# lacks from the wheels in .whl/ (the cuDNN Frontend; an MPI library, cuda-bindings and pytest only
# where missing), prints the versions, runs the GPU tests of the cuDNN convolutions against
# im2col, then bench/gpu_step.py. Everything lands under $OUT (default runs/bench/gpu); the
# tables go to stdout as each number is measured. Under 5 minutes on an H100 as it stands.
#
#   OUT=/some/dir bash bench/gpu_device.sh                      # everything
#   bash bench/gpu_device.sh --nets resnet50 --precisions bf16  # arguments go to gpu_step.py
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/bench/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SECONDS=0
BENCH_UNTIL=${BENCH_UNTIL:-290}  # seconds from the start by which the benchmark is cut

# install_wheels TARGET WHEEL...: pip where it works, else each wheel unzipped as it is
install_wheels() {
    local target=$1; shift
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$target" "$@" 2>/dev/null \
        && return 0
    echo "pip could not install $*; unzipping them into $target"
    for wheel in "$@"; do $PY -m zipfile -e "$wheel" "$target" || return 1; done
}
if install_wheels /tmp/site .whl/*.whl; then
    export PYTHONPATH=/tmp/site:$PWD
else
    echo "wheels not installed"; export PYTHONPATH=$PWD
fi
# the frontend plans through cuda-bindings; install it only where the machine has none
if ! $PY -c "import cuda.bindings.driver" 2>/dev/null && ls .whl/extra/*.whl >/dev/null 2>&1; then
    install_wheels /tmp/site-extra .whl/extra/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site-extra
fi
if ! $PY -c "import pytest" 2>/dev/null && ls .whl/test/*.whl >/dev/null 2>&1; then
    install_wheels /tmp/site-test .whl/test/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site-test
fi
# libcudnn.so.9 from PyTorch's wheels, where the dynamic linker would not find it
CUDNN_LIB=$($PY - <<'EOF'
import glob, os, sys
for root in sys.path:
    for found in glob.glob(os.path.join(root or ".", "nvidia", "**", "libcudnn.so.9"), recursive=True):
        print(os.path.dirname(os.path.abspath(found)))
        raise SystemExit
EOF
)
[ -n "$CUDNN_LIB" ] && export LD_LIBRARY_PATH=$CUDNN_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

mpi_version() { $PY -c "from mpi4py import MPI; print('MPI:', MPI.Get_library_version().splitlines()[0])"; }
if ! mpi_version 2>/dev/null; then
    # the mpich wheel's libraries, unpacked as they are (pip --target leaves its lib/ out)
    rm -rf /tmp/mpich && $PY -m zipfile -e .whl/mpich-*.whl /tmp/mpich >/dev/null 2>&1
    MPICH=$(ls -d /tmp/mpich/mpich-*.data/data 2>/dev/null | head -n 1)
    if [ -n "$MPICH" ]; then
        chmod +x "$MPICH"/bin/* 2>/dev/null
        export LD_LIBRARY_PATH=$MPICH/lib:${LD_LIBRARY_PATH:-} PATH=$MPICH/bin:$PATH
    fi
    mpi_version || echo "MPI: none found; hpctrain cannot run (mpi4py needs an MPI library)"
fi

$PY - <<'EOF' 2>&1 | tee "$OUT/versions.txt"
import importlib
def show(what, get):
    try:
        print(f"{what}: {get()}")
    except Exception as err:
        print(f"{what}: unavailable ({type(err).__name__}: {err})")
def torch_words():
    torch = importlib.import_module("torch")
    return (f"{torch.__version__} cuda {torch.version.cuda} cudnn "
            f"{torch.backends.cudnn.version()} on {torch.cuda.get_device_name()}")
show("torch", torch_words)
show("cupy", lambda: importlib.import_module("cupy").__version__)
show("nccl (cupy)", lambda: importlib.import_module("cupy.cuda.nccl").get_version())
show("cudnn frontend", lambda: importlib.import_module("cudnn").__version__)
from hpctrain.kernels import cudnn_conv
show("cudnn backend", lambda: cudnn_conv.unavailable() or importlib.import_module("cudnn").backend_version())
EOF

echo "== cuDNN convolutions against im2col, fused batch norm and SGD against the generic kernels"
timeout 150 $PY -m pytest -q -p no:cacheprovider -rfEsx --tb=line tests/test_cudnn_conv.py \
    tests/test_fused_norm.py tests/test_fused_sgd.py > "$OUT/test_cudnn_conv.txt" 2>&1
echo "pytest exit status $? after ${SECONDS}s"
tail -n 25 "$OUT/test_cudnn_conv.txt"

echo "== training step, hpctrain against PyTorch (bench/gpu_step.py)"
timeout $((BENCH_UNTIL - SECONDS > 60 ? BENCH_UNTIL - SECONDS : 60)) $PY bench/gpu_step.py \
    --out "$OUT/gpu_step.json" "$@" 2>&1 | tee "$OUT/gpu_step.txt"
echo "gpu_step exit status ${PIPESTATUS[0]} after ${SECONDS}s; files in $OUT"

# two ranks sharing the GPU: the NCCL step against the host-staged MPI step, the same losses
MPIEXEC=$(command -v mpiexec || ls /tmp/site/bin/mpiexec /tmp/mpich/mpich-*.data/data/bin/mpiexec \
          2>/dev/null | head -n 1)
if [ -n "${MPIEXEC:-}" ] && [ "${NCCL_CHECK:-1}" = 1 ]; then
    echo "== 2 ranks on one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1): nccl against mpi ($MPIEXEC)"
    for how in nccl mpi; do
        timeout 90 "$MPIEXEC" -n 2 env NCCL_MULTI_RANK_GPU_ENABLE=1 $PY -m hpctrain --device gpu \
            --net resnet18 --image-size 64 --batch 32 --steps 8 --print-every 1 --compute flops \
            --precision ${NCCL_PRECISION:-bf16} --grid ${NCCL_GRID:-conv=domain:2x1,fc=2x1} \
            --collectives $how 2>&1 | grep -E "^step|^done|rror|NCCL" | head -n 14 \
            | tee "$OUT/ranks2_$how.txt"
    done
fi
echo "all done after ${SECONDS}s"
