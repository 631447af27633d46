#!/usr/bin/env bash
# On the GPU machine after ../shared/device/stage-wheels (--tf for Keras): the first step of ResNet-50 at 224 px with
# backend.compile=true, cold and with the compiled code kept in paths.cache_dir (issue 49, part 2). In a fresh cache:
# a 2-job lr sweep on one GPU (one process runs both jobs: the second is a warm worker's next job), then one run at
# a third lr in a new process (a later run, or a fresh worker's job). Prints each job's first step and train seconds.
# CIFAR-10 (.devdata/cifar10.tgz) upsampled: 100 training and 20 validation images per class. From the repo root:
#   bash bench/gpu/compile_cache.sh lightning 0      # backend, GPU id
set -uo pipefail
source bench/gpu/env.sh
backend=${1:-lightning}; gpu=${2:-0}
if [ ! -d /tmp/cifar/cifar ]; then mkdir -p /tmp/cifar && tar -xzf .devdata/cifar10.tgz -C /tmp/cifar; fi
small=/tmp/cifar-small
if [ ! -d $small ]; then
  for split in train val; do
    count=$([ $split = train ] && echo 100 || echo 20)
    for class in /tmp/cifar/cifar/$split/*/; do
      mkdir -p $small/$split/$(basename $class)
      ls $class | head -$count | while read -r f; do cp "$class/$f" $small/$split/$(basename $class)/; done
    done
  done
fi
root=/tmp/compile-cache-$backend; rm -rf $root
[ "$backend" = keras ] && export LD_LIBRARY_PATH=$TF_LIBS
common=(data=imagefolder data.root=$small model=resnet50 data.image_size=224 epochs=1 data.batch_size=128
  backend=$backend backend.devices=1 backend.compile=true tracking=none paths.root=$root paths.data_dir=$root/data)
export CUDA_VISIBLE_DEVICES=$gpu
python3 -m hydrali.core -m "${common[@]}" optim.lr=0.1,0.2 hydra/launcher=basic hydra.sweep.dir=$root/sweep \
  > $root.sweep.log 2>&1 || tail -20 $root.sweep.log
python3 -m hydrali.core "${common[@]}" optim.lr=0.3 hydra.run.dir=$root/later > $root.later.log 2>&1 \
  || tail -20 $root.later.log
for summary in $root/sweep/0/summary.json $root/sweep/1/summary.json $root/later/summary.json; do
  python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[1].split('/')[-3:-1], \
'first step %.2f s, train %.2f s' % (s['first_step_seconds'], s['train_seconds']))" $summary $backend
done
du -sh $root/.hydrali_cache/* 2>/dev/null
mkdir -p "${OUT:-/tmp/out}/compile-cache"; cp $root.*.log "${OUT:-/tmp/out}/compile-cache/"
