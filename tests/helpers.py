"""Kept for tests/test_keras_workers.py, which imports write_one_image_per_class from here: it lives in
tests/support/datasets.py now (the plug-ins that were here are in tests/support/plugins.py)."""
from tests.support.datasets import write_one_image_per_class  # noqa: F401
