"""What core decides once for every backend, from the config and the device: the `auto` settings (auto_settings),
progressive resizing's sizes (resizing), the seeds (seeding) and the checkpoints kept (retention)."""
