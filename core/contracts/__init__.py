"""The declared interfaces between core, tasks and backends (`Backend`, `Task` and their framework sides), and the
registry through which core finds the backends without importing their frameworks."""
