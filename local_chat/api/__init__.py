"""The OpenAI-compatible /v1 API (api/routes.py), its request bodies read and checked (api/requests.py)."""

from .routes import OpenAIAPI, model_name

__all__ = ["OpenAIAPI", "model_name"]
