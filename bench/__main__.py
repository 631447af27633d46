"""`python -m hydrali.bench`: the same entry point as the `hydrali-bench` command."""

from hydrali.bench.cli import main

main()
