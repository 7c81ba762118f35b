"""LLM deployment planner: roofline physics for serving a transformer on a cluster, and CP-SAT to
choose the deployment that serves a workload at the lowest cost per token."""

__version__ = "0.1.0"
