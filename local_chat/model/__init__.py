"""The local model: `LocalEngine` (model/local_engine.py, the engine of a model in this process), `MetaModel`
(model/meta.py: LLaMA2-Accessory's loading and generation API over one) and the code under them. Importing this
package imports nothing: `local_chat.model.detokenize` needs no torch."""
