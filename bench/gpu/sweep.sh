#!/usr/bin/env bash
# On the GPU machine after ../shared/device/stage-wheels (hydra-joblib-launcher among its extras; --tf too for Keras
# sweeps): hydrali-bench's sweep section (8: one experiment=cifar10 sweep under Hydra's basic launcher, then under
# hydrali's, each a whole `hydrali -m` command) with the given hydrali-bench overrides, its table printed last; the
# bench log, its JSON and each sweep's own log go to $OUT/sweep/. CIFAR-10 from .devdata/cifar10.tgz (a copy of
# ../shared/data/cifar10.tgz, git-ignored: the device call carries .devdata), unpacked here. From the repo root:
#   bash bench/gpu/sweep.sh                                        # 4 jobs (optim.lr=0.05,0.1,0.2,0.4), Lightning
#   bash bench/gpu/sweep.sh "bench.sweep.grid='optim.lr=0.05,0.1,0.2,0.4 seed=1,2'"   # 8 jobs
#   bash bench/gpu/sweep.sh 'bench.sweep.overrides=["experiment=cifar10","tracking=none","backend=keras"]'
# SWEEP_LABEL (default sweep) names the log and $OUT's folder, so that two sweeps can run at once on disjoint GPUs
# (CUDA_VISIBLE_DEVICES) and cores (taskset).
set -uo pipefail
label=${SWEEP_LABEL:-sweep}
source bench/gpu/env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ ! -d /tmp/cifar/cifar ]; then mkdir -p /tmp/cifar && tar -xzf .devdata/cifar10.tgz -C /tmp/cifar; fi
BENCH=/tmp/bench/$label-$(date +%H-%M-%S)   # a run dir per call
python3 -m hydrali.bench.cli "bench.sections=[sweep]" bench.sweep.root=/tmp/cifar/cifar "hydra.run.dir=$BENCH" \
  paths.data_dir=/tmp/data ${TF_LIBS:+bench.keras_library_path=$TF_LIBS} "$@" > /tmp/bench-$label.log 2>&1
status=$?
grep -E "^hydrali-bench|bench: |sweep" /tmp/bench-$label.log | grep -v "^|" | tail -30
sed -n '/^| section/,$p' /tmp/bench-$label.log
[ $status -eq 0 ] || tail -30 /tmp/bench-$label.log
mkdir -p "${OUT:-/tmp/out}/$label"
cp /tmp/bench-$label.log "${OUT:-/tmp/out}/$label/bench.log"; cp "$BENCH/bench.json" "${OUT:-/tmp/out}/$label/" 2>/dev/null
(cd "$BENCH" && find sweep \( -name '*.log' -o -name summary.json \) | tar -cf "${OUT:-/tmp/out}/$label/logs.tar" -T -)
exit $status
