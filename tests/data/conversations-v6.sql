-- A history database written by the app at schema 6 (local_chat/history/store.py at 52b85e9), as SQL:
-- tests/test_branches.py builds the file from it (its full-text index as its CREATE statement).
BEGIN TRANSACTION;
CREATE TABLE conversations (id TEXT PRIMARY KEY, owner TEXT NOT NULL, title TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, messages TEXT NOT NULL, options TEXT NOT NULL DEFAULT '{}', revision INTEGER NOT NULL DEFAULT 0);
INSERT INTO "conversations" VALUES('conversation-six','browser:ffffffffffffffffffffffffffffffff','What is the capital of Japan?',1.79584138475032806399e+09,1.79584138475032806399e+09,'[{"role": "user", "content": "What is the capital of Japan?"}, {"role": "assistant", "content": "The capital of Japan is Tokyo."}, {"role": "assistant", "content": "", "metadata": {"title": "9 tokens · 12.0 tokens/s", "status": "done"}, "kind": "stats"}, {"role": "user", "content": [{"type": "image", "sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}, {"type": "text", "text": "And this picture?"}]}, {"role": "assistant", "content": "A red square, seen from Kyoto.", "model": "demo"}]','{}',0);
INSERT INTO "conversations" VALUES('conversation-six-b','browser:ffffffffffffffffffffffffffffffff','Greetings',1.79584138475051116948e+09,1.79584138475051116948e+09,'[{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi! How can I help?"}]','{}',0);
CREATE TABLE documents (sha256 TEXT PRIMARY KEY, name TEXT NOT NULL, paged INTEGER NOT NULL, pages TEXT NOT NULL);
CREATE TABLE passage_vectors (passage INTEGER NOT NULL, model TEXT NOT NULL, vector BLOB NOT NULL, PRIMARY KEY (passage, model));
CREATE VIRTUAL TABLE passages USING fts5(sha256 UNINDEXED, page UNINDEXED, text);
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO "settings" VALUES('browser_storage_key','b2a709f6ada31f344628a61badc4613cf6281db0b35e2254b2a25fad7e96272a');
INSERT INTO "settings" VALUES('browser_secret','e07fbe67bc088223d2d0a54e4bea2a5f7c38336432e89a401e1191e624f0ff21');
INSERT INTO "settings" VALUES('image_key','08f4b831701cf4f1ccabd5babeebbd9f7c736005d40c8542232fcfafb40591b5');
CREATE TABLE tool_approvals (owner TEXT NOT NULL, tool TEXT NOT NULL, PRIMARY KEY (owner, tool));
CREATE INDEX conversations_by_owner ON conversations (owner, updated DESC);
COMMIT;
PRAGMA user_version = 6;
