"""`python -m hydrali.core`: the same entry point as the `hydrali` command."""

from hydrali.core.cli.main import main

main()
