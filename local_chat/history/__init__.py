"""Saved conversations: the SQLite store (history/store.py)."""

from .store import Conversation, Store, default_db_path

__all__ = ["Conversation", "Store", "default_db_path"]
