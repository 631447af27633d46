"""The PyTorch Lightning backend (DDP), fed by DALI's PyTorch plugin."""

import logging

# Lightning imports torch's flop counter, which warns once when triton is missing; the set-up removes triton on
# machines without a GPU (Makefile: it crashes a process that loaded TensorFlow), where no triton kernel can run
logging.getLogger("torch.utils.flop_counter").setLevel(logging.ERROR)
