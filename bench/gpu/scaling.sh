#!/usr/bin/env bash
# On a machine of several GPUs, after ../shared/device/stage-wheels (--tf --nccl for Keras rows): hydrali-bench's
# scaling section (6) with the given hydrali-bench overrides (bench.scaling.runs=..., bench.repeats=...), its table
# printed last; the bench log, its JSON and every run's logs (rank logs and Lightning profiler reports included)
# go to $OUT/scaling-logs.tgz. From the repository root:
#   bash bench/gpu/scaling.sh "bench.scaling.runs=['backend=lightning']" bench.repeats=2
set -uo pipefail
source bench/gpu/env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
BENCH=/tmp/bench/$(date +%H-%M-%S)   # a run dir per call: the runs of an earlier call stay apart
python3 -m hydrali.bench.cli "bench.sections=[scaling]" "hydra.run.dir=$BENCH" paths.data_dir=/tmp/data \
  ${TF_LIBS:+"bench.keras_library_path=$TF_LIBS"} "$@" > /tmp/bench.log 2>&1
status=$?
grep -E "bench: repeat|hydrali-bench:" /tmp/bench.log
sed -n '/^| section/,$p' /tmp/bench.log
[ $status -eq 0 ] || tail -30 /tmp/bench.log
tar czf "${OUT:-/tmp}/scaling-logs.tgz" /tmp/bench.log "$BENCH/bench.json" \
  $(find "$BENCH/scaling" -name "*.log" -o -name summary.json 2>/dev/null) 2>/dev/null
exit $status
