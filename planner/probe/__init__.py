"""`planner probe`: measure the kernels the calibrated step model prices (dense and grouped expert GEMMs,
decode and prefill attention, elementwise work, HBM bandwidth, collectives) on the machine it runs on,
at the shapes of the models named, and write them as kernel tables `planner calibrate` reads.

Needs PyTorch (the optional extra `probe`); nothing else in the planner imports this package."""
