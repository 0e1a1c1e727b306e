"""The autotuner: an evolutionary search over ``MappingOptions``, safe evaluation and a persistent
tuning cache. ``space`` (genes of a def), ``genetic`` (the search), ``evaluate`` and ``worker``
(candidates compiled and timed in worker processes), ``cache`` (SQLite), ``tune`` (the driver)."""
