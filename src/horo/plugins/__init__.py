"""Framework adapters: move framework tensors to and from the numpy core (one module per framework)."""
