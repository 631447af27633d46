"""DALI recipes and their options, devices, image-file checks, DALI errors, autotune, the preprocessing that
pretrained weights ask for."""
