"""`hydrali-bench`: the benchmark, all of it (sections, loops, timing, report)."""
