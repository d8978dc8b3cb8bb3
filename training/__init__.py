"""Training of the `demo` model: a procedural data set (data.py), caption states (text_states.py),
the two VAEs (vae_train.py), the DiT by flow matching (dit_train.py), export of the shipped
weights (export.py) and the in-process evaluation (evaluate.py). docs/demo_model.md has the
commands and the results.

Dependencies point one way: training imports h3_core, never client/ or server/. Nothing here
imports the text encoder at module level (text_states.py and evaluate.main load it when run),
so the training modules run on a machine without the MiniLM package.
"""
