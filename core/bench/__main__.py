"""`python -m hydrali.core.bench`: the same entry point as the `hydrali-bench` command."""

from hydrali.core.bench.cli import main

main()
