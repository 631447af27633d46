#!/usr/bin/env bash
# On the GPU machine after ../shared/device/stage-wheels (--tf too for Keras lines): single hydrali runs, one per
# line of a runs file, as many at once as there are GPUs, each on a GPU (and a share of the cores) of its own; a lane
# takes the next line as soon as its run ends, so runs of different settings (which one `hydrali -m` grid cannot
# hold) share the machine. Issue 53's Imagenette runs are kept as such files (bench/gpu/nette/*.txt).
#   LANES_LABEL=nette13 LANES_BASE="data=imagefolder data.root=/tmp/nette" bash bench/gpu/lanes.sh bench/gpu/nette/session13.txt
# Each line: the overrides after $LANES_BASE (blank lines and lines starting with # are skipped); a line with
# backend=keras runs with TensorFlow's library path (env.sh's TF_LIBS). Run dirs: /tmp/lanes/$LANES_LABEL/<line
# number>/ (console output beside them as <n>.console.log); after every run the table of the runs so far
# (bench/gpu/runs_table.py) is written to /tmp/lanes/$LANES_LABEL.md, which a later device call copies to $OUT.
set -uo pipefail
set -f  # the overrides are split into words, never globbed (model.layers=[3,4,6,3] is a pattern to bash)
label=${LANES_LABEL:-runs}
base=${LANES_BASE:-}
runs_file=$1
source bench/gpu/env.sh
gpus=${LANES_GPUS:-$(nvidia-smi -L | wc -l)}
cores=$(nproc)
root=/tmp/lanes/$label
mkdir -p "$root/claims"
mapfile -t lines < <(grep -v '^\s*\(#\|$\)' "$runs_file")

lane() {  # GPU index: claims lines one by one (mkdir is atomic) and runs each
  local gpu=$1 per=$((cores / gpus)) n libs
  for n in "${!lines[@]}"; do
    mkdir "$root/claims/$n" 2>/dev/null || continue
    case " ${lines[$n]} " in *backend=keras*) libs=${TF_LIBS:-} ;; *) libs=${LD_LIBRARY_PATH:-} ;; esac
    echo "$(date +%T) lane $gpu starts $n: ${lines[$n]}"
    # shellcheck disable=SC2086  # the overrides are words
    CUDA_VISIBLE_DEVICES=$gpu LD_LIBRARY_PATH=$libs taskset -c $((gpu * per))-$((gpu * per + per - 1)) \
      python3 -m hydrali.core $base ${lines[$n]} tracking=none progress_bar=false \
      paths.data_dir=/tmp/data "hydra.run.dir=$root/$n" > "$root/$n.console.log" 2>&1
    echo "$(date +%T) lane $gpu ended $n: rc $?"
    python3 -m hydrali.bench.gpu.runs_table "$root" > "$root.md.tmp" && mv "$root.md.tmp" "$root.md"
  done
}
for ((g = 0; g < gpus; g++)); do lane $g & done
wait
touch "$root.done"
