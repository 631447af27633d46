#!/usr/bin/env bash
# On the GPU machine after ../shared/device/stage-wheels (sourced bench/gpu/env.sh): what a user sees when a JPEG
# that DALI's GPU decoder cannot read reaches it with data.verify=off (the file check skipped), on each backend: the
# last lines of the run's output, which should be one `hydrali: error:` line naming the file. Two broken files, each
# on its own copy of the bundled digits: a garbage JPEG (its header only) and a JPEG cut short. From the repo root:
#   bash bench/gpu/decode_error.sh [lightning keras]
set -uo pipefail
WORK=/tmp/decode-error
rm -rf $WORK && mkdir -p $WORK
python3 -c "
from hydrali.tasks.classification.datasets import write_digits
write_digits('$WORK/digits', size=32, val_fraction=0.2)"
for kind in garbage truncated; do
  cp -r $WORK/digits $WORK/$kind
  victim=$(ls $WORK/$kind/val/7/*.jpg | sed -n 3p)
  if [ $kind = garbage ]; then printf '\xff\xd8\xff\xe0not really a jpeg, not really a jpeg' > "$victim"
  else head -c 200 "$victim" > $WORK/cut && mv $WORK/cut "$victim"; fi
  for backend in ${@:-lightning keras}; do
    echo "== $kind file ($victim), backend=$backend"
    env ${TF_LIBS:+$([ $backend = keras ] && echo LD_LIBRARY_PATH=$TF_LIBS)} python3 -m hydrali.core data=imagefolder \
      data.root=$WORK/$kind data.image_size=32 data.verify=off epochs=1 tracking=none backend=$backend \
      backend.devices=1 "hydra.run.dir=$WORK/run-$kind-$backend" > $WORK/$kind-$backend.log 2>&1
    echo "exit $?"; tail -3 $WORK/$kind-$backend.log
  done
done
