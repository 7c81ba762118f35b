"""Where `planner probe` puts its tables and record, and where `planner calibrate` reads them: one
directory holding `probe.yaml` and the tables under `probe/<family>/<engine>/<torch version>/`, in
aiconfigurator-core's layout (its "system" named `probe`, its "engine" `torch`; collectives under
`comm/nccl/`)."""

__all__ = ["PROBE_ENGINE", "PROBE_FILE", "PROBE_SYSTEM"]

PROBE_FILE = "probe.yaml"
PROBE_SYSTEM = "probe"  # the system directory, read like an aiconfigurator system
PROBE_ENGINE = "torch"  # the engine directory: the kernels are PyTorch's (and flash-attn's where used)
