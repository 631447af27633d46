"""MLflow runs, sweeps and their reports, and the files a run writes into its dir."""
