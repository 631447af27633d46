"""What the tests share, one module per kind of help:

    cli        hydrali run as a user runs it, from this checkout: the subprocess environment (PYTHONPATH), a run to
               its end (run_cli) or in the background (start_cli), free TCP ports
    configs    configs composed as `hydrali <overrides>` would compose them, and the tiny overrides tests train with
    checks     what a run recorded (summary.json), a refusal's one line, and the checks both backends' tests make
    datasets   the datasets tests write: one image per class, a small COCO-layout set of rectangles
    plugins    callbacks and models a test plugs into hydrali through `_target_` strings, as a user would
    untrained_detection  the mAP of an untrained detector, the baseline a detection run must lift

Nothing here imports TensorFlow (or Keras) at module level: only Keras tests load it.
"""
