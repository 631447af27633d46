#!/usr/bin/env bash
# On a machine of several GPUs, after ../shared/device/stage-wheels: DALI's batches bound to torch's stream (hydrali's
# loader since issue 33) against batches synchronized with the host (DALI's iterator as it comes), in the plain DDP
# loop of torch_ddp_bound.py on 1 GPU and on every GPU, with each variant's N-GPU trace summarized and the native
# stacks of the device synchronizations that remain; then, with "scaling", hydrali's own runs (scaling.sh) eager and
# compiled. From the repository root:
#   bash core/bench/gpu/stream_outputs.sh [bound|scaling] [hydrali overrides]
set -uo pipefail
source core/bench/gpu/env.sh
PART=${1:-bound}
shift || true
LOG=${OUT:-/tmp}/stream_outputs-$PART.log
exec > >(tee "$LOG") 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
DATA=/tmp/data/synthetic-imagenet-32x1000x4
python3 -c "from pathlib import Path; from hydrali.core.bench.synthetic import write_synthetic as w; w(Path('$DATA'), 32, 1000, 4)"
RUN=(data=imagefolder "data.root=$DATA" model=resnet50 data.batch_size=256 data.image_size=224 "$@")
TRACES=/tmp/stream-traces
BOUND=(python3 -m hydrali.core.bench.gpu.torch_ddp_bound --repeats 1 --steps 60)
summary() { python3 -m hydrali.core.bench.gpu.trace_summary "$@" 2>&1 | grep -E "idle|host ahead|thread"; }
if [[ $PART == bound ]]; then
  echo "== batches bound to torch's stream, then synchronized with the host; GPU tensors"
  "${BOUND[@]}" --trace $TRACES --tag bound- --feed dali tensors -- "${RUN[@]}" 2>&1 | grep -E "^ddp_bound|Error"
  "${BOUND[@]}" --trace $TRACES --tag host- --host-outputs --feed dali -- "${RUN[@]}" 2>&1 | grep -E "^ddp_bound|Error"
  for trace in $TRACES/{bound,host}-dali-*gpu-rank0.json; do summary "$trace"; done
  echo "== who still synchronizes the device, batches bound"
  "${BOUND[@]}" --steps 20 --feed dali --backtraces cudaDeviceSynchronize cudaStreamSynchronize -- "${RUN[@]}" 2>&1 \
    | grep -vE "^(ERROR|WARNING|\[W)|UserWarning|return func" | cut -c1-160 | head -80
fi
if [[ $PART == scaling ]]; then
  bash core/bench/gpu/scaling.sh "bench.scaling.runs=['backend=lightning','backend=lightning backend.compile=true']" \
    bench.repeats=1 "$@"
fi
