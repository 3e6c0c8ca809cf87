"""Ports shared by the modules: presence, ephemeral publishing, clock, IDs, metrics.

Nothing in the kernel imports another package of the project; every other
module may import the kernel.
"""
