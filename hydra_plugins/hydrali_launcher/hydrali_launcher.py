"""The class Hydra instantiates for hydra/launcher=hydrali (Hydra takes launchers only from the hydra_plugins
namespace); everything it does is hydrali.core.cli.sweep_launcher's."""

from hydrali.core.cli.sweep_launcher import HydraliLauncher as _Launcher


class HydraliLauncher(_Launcher):
    """hydrali's launcher of a sweep: jobs at once on GPUs of their own where the machine has several."""
