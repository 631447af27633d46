#!/usr/bin/env bash
# On the GPU machine after ../shared/device/stage-wheels (--tf too for Keras runs): issue 53's runs on Imagenette
# (10 ImageNet classes, 9,469 train / 3,925 val JPEGs of 224 x 224, the public copy in GitHub's
# thunderInfy/imagenette, carried as three git-ignored parts .devnette/imagenette.tar.a{a,b,c}, one per device call,
# each copied to /tmp/keep/ by its call) as one `hydrali -m` sweep of the given overrides under hydrali's launcher
# (jobs at once, one GPU each), then the table of its runs (bench/gpu/runs_table.py). From the repo root:
#   NETTE_LABEL=defaults bash bench/gpu/imagenette.sh model=resnet18,resnet50
# The sweep's dir is /tmp/nette-runs/$NETTE_LABEL; its log, table and summaries go to $OUT/nette-$NETTE_LABEL/.
# A sweep runs one backend: with backend=keras among its overrides (not backend=lightning,keras), TensorFlow's library path (env.sh's TF_LIBS),
# which the image's torch cannot import beside.
set -uo pipefail
label=${NETTE_LABEL:-runs}
source bench/gpu/env.sh
if [ ! -d /tmp/nette/train ]; then
  mkdir -p /tmp/nette && cat /tmp/keep/imagenette.tar.* | tar -x -C /tmp/nette || exit 3
fi
sweep=/tmp/nette-runs/$label
case " $* " in *backend=*keras*) libs=${TF_LIBS:-} ;; *) libs=${LD_LIBRARY_PATH:-} ;; esac
LD_LIBRARY_PATH=$libs python3 -m hydrali.core -m data=imagefolder data.root=/tmp/nette tracking=none paths.data_dir=/tmp/data \
  "hydra.sweep.dir=$sweep" "$@" > /tmp/nette-$label.log 2>&1
status=$?
tail -5 /tmp/nette-$label.log
python3 -m hydrali.bench.gpu.runs_table "$sweep" | tee /tmp/nette-$label.md
out="${OUT:-/tmp/out}/nette-$label"; mkdir -p "$out"
cp /tmp/nette-$label.log /tmp/nette-$label.md "$out/"
(cd "$sweep" && find . \( -name summary.json -o -name hydrali.log -o -name '*.console.log' \) | tar -cf "$out/runs.tar" -T -)
exit $status
