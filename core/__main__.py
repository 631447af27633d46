"""`python -m core`: the same entry point as the `hydrali` command."""
from core.cli import main

main()
