"""Saved conversations: the SQLite store (history/store.py)."""

from .store import SavedConversation, Store, default_db_path

__all__ = ["SavedConversation", "Store", "default_db_path"]
