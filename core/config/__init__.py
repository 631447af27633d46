"""The config's schemas (the only home of choices and defaults) and the checks across groups."""
