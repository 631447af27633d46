"""Where a process sits in a job: launcher variables, topology, rank-0 agreement, local launch."""
