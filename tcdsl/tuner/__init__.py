"""The autotuner: an evolutionary search over ``MappingOptions`` with safe evaluation and a
persistent SQLite tuning cache (``genetic`` searches genomes, ``cache`` stores results)."""
