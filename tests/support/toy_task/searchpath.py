"""The Hydra plugin that adds task=brightness's config options (tests/support/toy_task/conf/) to Hydra's search
path; installed as hydra_plugins/hydrali_brightness_task.py, where Hydra finds plugins."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class BrightnessSearchPath(SearchPathPlugin):
    """Appends pkg://tests.support.toy_task.conf: conf/task/brightness.yaml and the options it chooses."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        """Add the task's config folder after hydrali's own."""
        search_path.append(provider="hydrali-brightness-task", path="pkg://tests.support.toy_task.conf")
