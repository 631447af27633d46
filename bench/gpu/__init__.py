"""What is run by hand on the GPU machine (after ../shared/device/stage-wheels; env.sh sets up a shell for it):
checkpointing.sh measures what DALI's reader checkpointing costs and checks a preemption signal on the GPU;
scaling.sh runs hydrali-bench's scaling section (1 GPU against several) and keeps every run's logs; torch_ddp_bound.py
measures what DDP alone scales to (the run's network in a plain DDP loop, on GPU tensors or DALI batches);
signals.py finds which loaded library takes signals over from Python."""
