"""The command line: `hydrali` and `hydrali ui`, exit codes, Hydra's errors as one line."""
