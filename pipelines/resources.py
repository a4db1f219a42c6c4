"""Dagster resources: the ``SHIFTBENCH_*`` settings as one configurable resource."""

import os

import dagster as dg

from shiftbench.settings import Settings


class ShiftbenchSettings(dg.ConfigurableResource):
    """Settings for a run; a field left unset falls back to its SHIFTBENCH_* environment variable.

    Tests and the CLI pass explicit values; ``dagster dev`` reads the environment.
    """

    home: str | None = None
    imagenet_hierarchy_dir: str | None = None
    breeds_hierarchy_dir: str | None = None
    imagenet_dir: str | None = None
    breeds_calibration: str | None = None
    offline: bool | None = None

    def get(self) -> Settings:
        env = dict(os.environ)
        overrides = {
            "SHIFTBENCH_HOME": self.home,
            "SHIFTBENCH_IMAGENET_HIERARCHY_DIR": self.imagenet_hierarchy_dir,
            "SHIFTBENCH_BREEDS_HIERARCHY_DIR": self.breeds_hierarchy_dir,
            "SHIFTBENCH_IMAGENET_DIR": self.imagenet_dir,
            "SHIFTBENCH_BREEDS_CALIBRATION": self.breeds_calibration,
            "SHIFTBENCH_OFFLINE": None if self.offline is None else ("1" if self.offline else "0"),
        }
        env.update({key: value for key, value in overrides.items() if value is not None})
        return Settings.from_env(env)
