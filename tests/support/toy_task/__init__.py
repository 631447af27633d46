"""task=brightness: a toy task written from outside hydrali (is an image dark or bright?), to check
docs/adding_a_task.md against reality. Its files: spec.py (schemas, TaskSpec, install), task.py (data and pipelines),
recipes.py (the DALI recipe), torch_task.py (the torch side and its network), searchpath.py (the Hydra plugin that
finds conf/), and conf/{task,pipeline,data,model}/ (its config options). No file of hydrali names it."""
