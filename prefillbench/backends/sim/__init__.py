"""The sim: model shapes and GPU spec sheets (specs), the models and GPUs it knows by name (presets), reading one
from a name or a file (configs), a per-operator roofline cost model (cost), a pipeline driver for --pp (pipeline),
calibration against a real backend (calibration) and SARATHI's experiments (paper).

Nothing here imports torch; the backend that puts it behind the Backend interface is
prefillbench.backends.sim.backend.
"""
