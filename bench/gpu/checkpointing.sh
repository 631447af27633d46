#!/usr/bin/env bash
# On the GPU machine, after ../shared/device/stage-wheels: what DALI's reader checkpointing (pipeline.checkpointing,
# on by default) costs a default ResNet-50 run, and a preemption signal in the middle of an epoch on the GPU, then
# the resume. Run from the repository root: bash bench/gpu/checkpointing.sh [repeats]
set -uo pipefail
export PYTHONPATH=/tmp/site:/tmp/shim
mkdir -p /tmp/shim/hydrali && for d in core backends tasks conf; do ln -sfn "$PWD/$d" /tmp/shim/hydrali/$d; done
DATA=/tmp/data/synthetic-imagenet-8x1000x4
python3 -c "from pathlib import Path; from hydrali.bench.synthetic import write_synthetic; \
write_synthetic(Path('$DATA'), 8, 1000, 4)"
RUN=(data=imagefolder model=resnet50 "data.root=$DATA" data.batch_size=256 tracking=none
     progress_bar=false)
repeats=${1:-2}
for i in $(seq 1 "$repeats"); do
  for ck in false true; do  # interleaved
    python3 -m hydrali.core "${RUN[@]}" epochs=2 pipeline.checkpointing=$ck "hydra.run.dir=/tmp/runs/ck-$ck-$i" \
      > "/tmp/runs/ck-$ck-$i.log" 2>&1
    echo "pipeline.checkpointing=$ck repeat $i: $(grep -E 'images/s \(train\)' "/tmp/runs/ck-$ck-$i.log" || tail -3 "/tmp/runs/ck-$ck-$i.log")"
  done
done
# a preemption signal during the second epoch, then the same command again; and the same run never stopped
SMALL=("${RUN[@]}" data.batch_size=64 epochs=3)
python3 -m hydrali.core "${SMALL[@]}" hydra.run.dir=/tmp/runs/whole > /tmp/runs/whole.log 2>&1
OUT=/tmp/runs/preempted
python3 -m hydrali.core "${SMALL[@]}" "hydra.run.dir=$OUT" > /tmp/runs/preempted-1.log 2>&1 &
pid=$!
until grep -q "epoch 1/3" /tmp/runs/preempted-1.log 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 0.2; done
sleep 1
kill -USR1 $pid
wait $pid
echo "first start: exit $? | $(grep -E 'hydrali: preempted|error' /tmp/runs/preempted-1.log)"
python3 -m hydrali.core "${SMALL[@]}" "hydra.run.dir=$OUT" > /tmp/runs/preempted-2.log 2>&1
echo "second start: exit $?"
grep -hE "resuming|epoch [0-9]/3|Error|error" /tmp/runs/preempted-2.log | cut -c1-200
echo "never stopped:"
grep -hE "epoch [0-9]/3" /tmp/runs/whole.log | cut -c1-200
