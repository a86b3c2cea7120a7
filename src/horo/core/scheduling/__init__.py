"""Layer 3 of the core, scheduling: the agreement before each collective, signatures, requests, the
background engine with its response cache, and the tuners of its knobs. Imports the layers below only."""
