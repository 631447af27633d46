#!/usr/bin/env bash
# On a 4-GPU machine after ../shared/device/stage-wheels (--tf for Keras; hydra-joblib-launcher among the extras):
# two pieces of GPU work at once, each on two GPUs and half the cores, in the background so that they outlive the
# device call that starts them (the machine stays held while calls follow back to back; a process started with
# setsid outlives its call). Each half is a command line run with CUDA_VISIBLE_DEVICES and taskset set; its output
# goes to /tmp/results/<name>.log and its files to /tmp/results (pass OUT=/tmp/results to scripts that take OUT).
# From the repo root, e.g. issue 49's sweeps:
#   (setsid nohup bash bench/gpu/halves.sh \
#      "SWEEP_LABEL=sweep-L8 bash bench/gpu/sweep.sh \"bench.sweep.grid='optim.lr=0.05,0.1,0.2,0.4 seed=1,2'\"" \
#      "SWEEP_LABEL=sweep-K4 bash bench/gpu/sweep.sh 'bench.sweep.overrides=[\"experiment=cifar10\",\"tracking=none\",\"backend=keras\"]'" \
#      > /tmp/halves.log 2>&1 &)
# then, in later calls: `tail /tmp/results/*.log; cp -r /tmp/results $OUT/` (the device tool brings back a limited
# number of files per call: copy the logs and tables, not whole run dirs).
set -uo pipefail
results=/tmp/results; mkdir -p $results
source bench/gpu/env.sh
[ -d /tmp/cifar/cifar ] || { mkdir -p /tmp/cifar && tar -xzf .devdata/cifar10.tgz -C /tmp/cifar; }
half() {  # name, GPUs, cores, command
  { date +%T; CUDA_VISIBLE_DEVICES=$2 OUT=$results taskset -c $3 bash -c "$4"; echo "rc $?"; date +%T
    touch $results/$1.done; } > $results/$1.log 2>&1
}
half A 0,1 0-31 "$1" &
if [ $# -gt 1 ]; then half B 2,3 32-63 "$2" & fi
wait
