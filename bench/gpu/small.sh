#!/usr/bin/env bash
# On the GPU machine after ../shared/device/stage-wheels: hydrali-bench's small-image section (7: experiment=cifar10
# at 32 px through Lightning, its upper bound on GPU tensors, hydrali reading the files every epoch and hydrali with
# pipeline.options.decode_once=true) with the given hydrali-bench overrides, its table printed last; the bench log and
# its JSON go to $OUT/small/. From the repository root:
#   bash bench/gpu/small.sh                                        # the synthetic 32 x 32 folder (25,000 JPEG files)
#   bash bench/gpu/small.sh bench.small.root=/tmp/cifar/cifar      # CIFAR-10 itself: .devdata/cifar10.tgz (a copy of
#                                                                  #   ../shared/data/cifar10.tgz, git-ignored: the
#                                                                  #   device call carries .devdata), unpacked here
#   bash bench/gpu/small.sh bench.repeats=5 "bench.small.overrides=['experiment=cifar10','backend.compile=true']"
set -uo pipefail
source bench/gpu/env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ -f .devdata/cifar10.tgz ] && [ ! -d /tmp/cifar/cifar ]; then
  mkdir -p /tmp/cifar && tar -xzf .devdata/cifar10.tgz -C /tmp/cifar
fi
BENCH=/tmp/bench/small-$(date +%H-%M-%S)   # a run dir per call
python3 -m hydrali.bench.cli "bench.sections=[small]" "hydra.run.dir=$BENCH" paths.data_dir=/tmp/data "$@" \
  > /tmp/bench-small.log 2>&1
status=$?
grep -E "bench: repeat|decoded the|hydrali-bench:" /tmp/bench-small.log
sed -n '/^| section/,$p' /tmp/bench-small.log
[ $status -eq 0 ] || tail -30 /tmp/bench-small.log
mkdir -p "${OUT:-/tmp/out}/small"
cp /tmp/bench-small.log "${OUT:-/tmp/out}/small/bench.log"; cp "$BENCH/bench.json" "${OUT:-/tmp/out}/small/" 2>/dev/null
exit $status
