#!/usr/bin/env bash
# On a machine of several GPUs, after ../shared/device/stage-wheels: where DDP fed by DALI loses against DDP on GPU
# tensors. torch_ddp_bound.py on 1 GPU and on every GPU, fed by GPU tensors and by DALI, then DALI-fed variants: its
# batches dropped (DALI's GPU work without its data), training on a stream of its own (not CUDA's legacy default
# stream), DALI's dynamic executor, DALI checkpointing off, larger DDP buckets. The traced variants' N-GPU torch
# profiler traces are summarized (trace_summary.py) and kept gzipped in $OUT with the whole log (diagnose.log).
# Extra hydrali overrides go to every measurement. From the repository root:
#   bash bench/gpu/ddp_diagnose.sh [hydrali overrides]
set -uo pipefail
source bench/gpu/env.sh
LOG=${OUT:-/tmp}/diagnose.log
exec > >(tee "$LOG") 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
DATA=/tmp/data/synthetic-imagenet-32x1000x4
python3 -c "from pathlib import Path; from hydrali.bench.synthetic import write_synthetic as w; w(Path('$DATA'), 32, 1000, 4)"
RUN=(data=imagefolder "data.root=$DATA" model=resnet50 data.batch_size=256 data.image_size=224 "$@")
BOUND=(python3 -m hydrali.bench.gpu.torch_ddp_bound --repeats 1 --steps 60 --trace /tmp/ddp-traces)
measure() { echo "== $*"; "${BOUND[@]}" "$@" 2>&1 | grep -E "^ddp_bound|Error|error:" ; }
measure --tag base- --feed tensors dali -- "${RUN[@]}"
measure --tag side- --side-stream --feed dali -- "${RUN[@]}"
measure --tag dynamic- --dali-arg exec_dynamic=True --feed dali -- "${RUN[@]}"
measure --tag nockpt- --feed dali -- "${RUN[@]}" pipeline.checkpointing=false
measure --tag bucket- --bucket-cap-mb 100 --feed dali -- "${RUN[@]}"
measure --tag sidebucket- --side-stream --bucket-cap-mb 100 --feed dali -- "${RUN[@]}"
for trace in $(ls /tmp/ddp-traces/*.json | grep -v -- -1gpu); do
  python3 -m hydrali.bench.gpu.trace_summary "$trace" | grep -v "^  stream"
done
for trace in /tmp/ddp-traces/{side,dynamic}-dali-*gpu-rank0.json; do gzip -c "$trace" > "${OUT:-/tmp}/$(basename "$trace").gz"; done
