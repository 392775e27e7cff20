"""What the roles run on: shared trajectory buffers and the slot pool, queues and pipes, shared weights, the
wiring table, the role protocol and process entry, checkpoints, the device.
"""
