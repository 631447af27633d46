"""Image classification: DALI recipes, dataset preparation, models, loss and metrics."""
