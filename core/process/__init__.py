"""What a hydrali process is, beside the run it trains: its garbage collector (collector), the Hydra job it runs
(job_context), the processes alive in a run dir (live_processes) and the signals that ask it to stop (preemption)."""
