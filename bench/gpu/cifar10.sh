#!/usr/bin/env bash
# On the GPU machine after ../shared/device/stage-wheels (--tf for backend=keras), with the CIFAR-10 tgz carried in
# the checkout (.devdata/cifar10.tgz: a copy of ../shared/data/cifar10.tgz; .git/info/exclude ignores .devdata/):
# one run of hydrali per NAME=OVERRIDES argument, one after the other, each timed from the command to its summary
# (wall), its end-of-run table printed, its summary.json and log copied to $OUT/NAME/ (a backend=keras run gets
# TensorFlow's library path). From the repository root:
#   bash bench/gpu/cifar10.sh "lightning=experiment=cifar10" "keras=experiment=cifar10 backend=keras"
set -uo pipefail
source bench/gpu/env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -d /tmp/cifar/cifar ] || { mkdir -p /tmp/cifar && tar -xzf .devdata/cifar10.tgz -C /tmp/cifar; }
export HYDRALI_ROOT=/tmp/hydrali-runs
mkdir -p "$HYDRALI_ROOT"
status=0
for spec in "$@"; do
  name=${spec%%=*}; overrides=${spec#*=}
  dir=$HYDRALI_ROOT/$name; rm -rf "$dir"; mkdir -p "${OUT:-/tmp/out}/$name"
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  # TensorFlow finds its CUDA 12 libraries and the image's cuDNN only on this path (env.sh: TF_LIBS); torch not
  case " $overrides " in *" backend=keras "*) libs=${TF_LIBS:-} ;; *) libs=${LD_LIBRARY_PATH:-} ;; esac
  LD_LIBRARY_PATH=$libs python3 -m hydrali.core data.root=/tmp/cifar/cifar "hydra.run.dir=$dir" $overrides \
    > "$dir.log" 2>&1
  rc=$?; end=$(date +%s.%N)
  echo "=== $name ($overrides): exit $rc, wall $(python3 -c "print(f'{$end - $start:.1f}')") s"
  sed -n '/^hydrali run summary/,$p' "$dir.log" | tail -30
  [ $rc -eq 0 ] || { tail -25 "$dir.log"; status=$rc; }
  cp "$dir.log" "${OUT:-/tmp/out}/$name/run.log"; cp "$dir/summary.json" "${OUT:-/tmp/out}/$name/" 2>/dev/null
done
exit $status
