"""h3_core: a pure-PyTorch implementation of the MiniMax-H3 text-to-video+audio DiT and its
step-execution contract (see ../shared/docs/h3_spec.md). No Triton imports live here."""
