"""Layer 1 of the core, the base: errors, reduce ops, dtypes, the agreed configuration, the runtime state with
its process sets, the timeline, the watchdog and the failure translation. Imports nothing else of horo."""
