"""hydrali's core: what is the same for every task and backend (config, topology, plan, tracking)."""
