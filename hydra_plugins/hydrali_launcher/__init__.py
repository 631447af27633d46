"""hydrali's sweep launcher as Hydra finds launchers: a class in the hydra_plugins namespace
(conf/hydra/launcher/hydrali.yaml names it; its work is hydrali.core.cli.sweep_launcher's)."""
