"""Layer 2 of the core, transport: moving data over MPI and NCCL, and views of device memory.

Its functions take validated, agreed arguments; they know nothing of names, requests or the engine.
Imports only the base layer.
"""
