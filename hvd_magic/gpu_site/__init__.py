"""Not imported: this folder goes first on the PYTHONPATH of hvdrun's ranks whose GPU was pinned
by narrowing CUDA_VISIBLE_DEVICES, so that their Python runs ``sitecustomize.py`` here (see
hvd_magic.gpu_pinning.child_env). A package only so that installs ship it."""
