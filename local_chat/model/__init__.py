"""The local model: `MetaModel` (model/meta.py: loading, generation, the engine for a model in this process) and the
code under it. Importing this package imports nothing: `local_chat.model.detokenize` needs no torch."""
