"""Layer 4 of the core, the API: argument checks, the host and GPU backends, the synchronous and asynchronous
collectives, the process-set registry, and start-up and shut-down. ``horo.core`` re-exports its public names."""
