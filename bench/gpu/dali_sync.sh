#!/usr/bin/env bash
# On a machine of several GPUs, after ../shared/device/stage-wheels: which part of a DALI-fed DDP step makes a DALI
# thread wait for the GPU once per batch (BENCHMARKS.md, issue 33). torch_ddp_bound.py fed by DALI on 1 GPU and on
# every GPU, one variant of the decoder or of DALI's memory per line: hydrali's defaults, JPEGs decoded on the SMs
# (no hardware decoder), the hardware decoder's memory preallocated, nvJPEG's padding raised, DALI's device memory
# from cudaMallocAsync or from cudaMalloc (not virtual memory), and a decoder without a crop window (pipeline=light).
# Each variant's N-GPU rank-0 trace is summarized: the calls that wait for the GPU, per thread with its name.
# "backtraces": the native stacks that call cudaDeviceSynchronize and its kin (cuda_backtraces.py).
#   bash bench/gpu/dali_sync.sh [first|backtraces|second|third|all] (BACKTRACE_ENV: variables for the backtraces) [hydrali overrides]
set -uo pipefail
source bench/gpu/env.sh
PART=${1:-all}
shift || true
LOG=${OUT:-/tmp}/dali_sync-$PART.log
exec > >(tee "$LOG") 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
DATA=/tmp/data/synthetic-imagenet-32x1000x4
python3 -c "from pathlib import Path; from hydrali.bench.synthetic import write_synthetic as w; w(Path('$DATA'), 32, 1000, 4)"
RUN=(data=imagefolder "data.root=$DATA" model=resnet50 data.batch_size=256 data.image_size=224 "$@")
TRACES=/tmp/dali-sync-traces
BOUND=(python3 -m hydrali.bench.gpu.torch_ddp_bound --repeats 1 --steps 60 --feed dali --trace $TRACES)
PREALLOCATED=(--decoder-arg preallocate_width_hint=640 --decoder-arg preallocate_height_hint=480)
PADDED=(--decoder-arg device_memory_padding=67108864 --decoder-arg host_memory_padding=67108864)
measure() {  # measure TAG [env assignments --] torch_ddp_bound arguments -- overrides
  local tag=$1; shift
  local env=()
  while [[ $# -gt 0 && $1 == *=* && $1 != --* ]]; do env+=("$1"); shift; done
  echo "== $tag ${env[*]} $*"
  env "${env[@]}" "${BOUND[@]}" --tag "$tag-" "$@" 2>&1 | grep -E "^ddp_bound|Error|error:|nvjpeg|allocat" | head -20
  python3 -m hydrali.bench.gpu.trace_summary $TRACES/$tag-dali-*gpu-rank0.json 2>&1 \
    | grep -E "idle|host ahead|thread|NCCL" | grep -v "^  stream"
}
if [[ $PART == first || $PART == all ]]; then
  measure base -- "${RUN[@]}"
  measure smdecode -- "${RUN[@]}" pipeline.hw_decoder_load=0.0
  measure prealloc "${PREALLOCATED[@]}" -- "${RUN[@]}"
  measure padded "${PADDED[@]}" -- "${RUN[@]}"
fi
if [[ $PART == backtraces || $PART == all ]]; then  # who calls them: native stacks on rank 0, 1 GPU and 2
  echo "== backtraces ${BACKTRACE_ENV:-}"
  env ${BACKTRACE_ENV:-} python3 -m hydrali.bench.gpu.torch_ddp_bound --repeats 1 --steps 20 --feed dali \
    --backtraces cudaDeviceSynchronize cudaStreamSynchronize cudaFree cudaFreeHost -- "${RUN[@]}" 2>&1 | grep -vE "^(ERROR|WARNING|\[W)" | head -400
fi
if [[ $PART == second || $PART == all ]]; then
  measure mallocasync DALI_USE_CUDA_MALLOC_ASYNC=1 DALI_USE_VMM=0 -- "${RUN[@]}"
  measure novmm DALI_USE_VMM=0 -- "${RUN[@]}"
fi
if [[ $PART == third || $PART == all ]]; then
  measure nocrop -- "${RUN[@]}" pipeline=light
  measure stats --decoder-arg memory_stats=True -- "${RUN[@]}"
fi
