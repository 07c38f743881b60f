"""The models the doors pick among (the page's picker, /v1's `model`), under one name: what every kind answers
(common.py: `ModelChoices`, and the `Lease` that holds one for an answer), --models_dir's checkpoints each in a
process of its own (folders.py), an engine's served models with --api_base (served.py), --lora's adapters over one
model (lora.py), and the engine of the model a page's session chose (chosen.py)."""
