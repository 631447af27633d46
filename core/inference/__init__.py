"""Using a trained run: `hydrali eval` (score a checkpoint on a split), `hydrali predict` (label a folder of images)
and `hydrali export` (hand the network to a serving stack), each with the run's own config and validation
preprocessing in DALI. Core reads the batches and scores them; a backend only runs its trained network on them
(core.contracts.backend.TrainedNetwork), so the figures are computed once for both backends."""
