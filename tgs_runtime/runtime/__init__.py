"""tgs-runtime: the OCI runtime wrapper (docker run --runtime=tgs). libshim/runtime/launcher.c
is the fast pass-through; this package decides and sets TGS up on create."""
