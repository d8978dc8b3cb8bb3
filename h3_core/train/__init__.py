"""Training of the `demo` model: a procedural data set (data.py), caption states (text_states.py),
the two VAEs (vae_train.py), the DiT by flow matching (dit_train.py), export of the shipped
weights (export.py) and the evaluation through the server (evaluate.py). docs/demo_model.md
has the commands and the results.

Nothing here imports the text encoder or the engine at module level except text_states.py and
evaluate.py, so the training modules run on a machine without the MiniLM package.
"""
