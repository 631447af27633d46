"""A hydrali run under Python's profiler: where the training process's host thread spends its time (waiting for
DALI's next batch, launching or waiting for the compiled step, callbacks, logging), on either backend.

    python -m hydrali.bench.host_profile [--top N] [--match WORDS] <hydrali overrides>

It runs `hydrali <overrides>` in this process under cProfile, then prints the functions with the most cumulative
time (the whole run's, the compile's warm-up included: run enough epochs that the steady state dominates), keeping
those whose module or name contains one of `--match`'s comma-separated words (default: the pieces of a training
step on both backends). A GPU diagnostic: its figures go into BENCHMARKS.md with the command that made them.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys

DEFAULT_MATCH = (
    "dali,next,train_step,one_step,multi_step,training_step,optimizer_step,backward,callback,on_train_batch,"
    "advance,run_training_batch,_call_and_handle,distribute,fit,synchron,item,log"
)  # what a step is made of on Lightning (its loops and hooks) and Keras (its TF trainer and callbacks)


def main(argv: list[str] | None = None) -> None:
    """Profile one hydrali run (the overrides in `argv`) and print its heaviest matching functions."""
    parser = argparse.ArgumentParser(prog="python -m hydrali.bench.host_profile", description=__doc__.split("\n")[0])
    parser.add_argument("--top", type=int, default=40, help="how many functions to print (default 40)")
    parser.add_argument("--match", default=DEFAULT_MATCH, help="comma-separated words a function's name must hold")
    args, overrides = parser.parse_known_args(argv)

    from hydrali.core.cli.main import main as hydrali

    sys.argv = ["hydrali", *overrides]
    profile = cProfile.Profile()
    try:
        profile.runcall(hydrali)
    except SystemExit as done:  # Hydra's entry point ends the process's run with its exit code
        if done.code not in (0, None):
            raise
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text).sort_stats("cumulative")
    words = "|".join(w.strip() for w in args.match.split(",") if w.strip())
    stats.print_stats(words, args.top)
    print(text.getvalue())


if __name__ == "__main__":
    main()
