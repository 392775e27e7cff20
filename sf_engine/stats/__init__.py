"""What a run reports: typed messages, stage timers, their aggregation, the bottleneck, the terminal /
TensorBoard / summary.json writers and W&B tracking.
"""
