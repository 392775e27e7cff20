"""Sampler nodes on other machines: the sampler node, its Ray actors, slots on the wire, and the receiver role."""
