"""Run one setting of an experiment the way run() does, keeping the trace it was read from."""
from dataclasses import asdict

from app.lab import Lab, get


def run_one(name: str, setting_name: str, size: str = "ci", model=None) -> tuple[dict, list[dict]]:
    exp = get(name)
    setting = next(s for s in exp.settings(size) if s.name == setting_name)
    lab = Lab(name, model, size, "cpu", None, None)
    lab.setting = setting
    return asdict(exp.run_setting(lab, setting)), lab.last_events
