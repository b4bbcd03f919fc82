"""`tfgpu run SCRIPT.py`: a training script run unchanged, each `fit` recorded (GPUMonitor,
StepTimer), the longest diagnosed, the report written (docs/diagnosis.md, "Zero changes:
`tfgpu run SCRIPT.py`"). Importing it loads Keras: the command line checks its arguments first."""

from tfgpu.run._run import run_script as run_script

__all__ = ["run_script"]
