"""The lab: serving trade-offs measured on the real engine, setting against setting
(python -m app.lab NAME; the page's Experiments tab). An experiment is an `Experiment`."""
from app.lab.experiment import (Cancelled, Experiment, Progress, RequestRecord, Result, Setting, SettingResult,
                                StepRecord)
from app.lab.registry import experiments, get, register
from app.lab.run_experiment import run
from app.lab.runner import Job, Lab

__all__ = ["Cancelled", "Experiment", "Job", "Lab", "Progress", "RequestRecord", "Result", "Setting",
           "SettingResult", "StepRecord", "experiments", "get", "register", "run"]
