#!/usr/bin/env bash
# A parallel sweep's overhead on the CPU (no GPU needed): 4 jobs of 2 training and 2 validation batches each over
# the 60,000 files of CIFAR-10 (tar -xzf ../shared/data/cifar10.tgz -C /tmp/cifar), hydrali's launcher given two
# GPU ids, then each job's wall time and parts (summary.json's wall_parts): a fresh worker's start-up and data check,
# a warm worker's data check and build. Run it twice: the first run also checks every file once.
#   bash bench/sweep_overhead.sh [/tmp/cifar/cifar] [work dir]
set -euo pipefail
root=${1:-/tmp/cifar/cifar}; work=${2:-/tmp/sweep-overhead}
python=${PYTHON:-python3}
rm -rf "$work/sweep" && mkdir -p "$work"
cd "$work"
/usr/bin/time -f "sweep: %e s" "$python" -m hydrali.core -m data=imagefolder "data.root=$root" pipeline=light \
  "model.widths=[8,16,32]" data.image_size=16 epochs=1 tracking=none "paths.cache_dir=$work/cache" \
  progress_bar=false backend.trainer.enable_model_summary=false \
  +backend.trainer.limit_train_batches=2 +backend.trainer.limit_val_batches=2 "hydra.launcher.gpus=[0,1]" \
  optim.lr=0.1,0.2,0.3,0.4 "hydra.sweep.dir=$work/sweep" 2>&1 | tail -1
for job in 0 1 2 3; do
  "$python" -c "import json, sys; s = json.load(open(sys.argv[1])); print('job $job', s['wall_seconds'], \
{k.removesuffix('_s'): round(v, 2) for k, v in s['wall_parts'].items()})" "$work/sweep/$job/summary.json"
done
