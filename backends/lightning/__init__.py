"""The PyTorch Lightning backend (DDP), fed by DALI's PyTorch plugin."""
