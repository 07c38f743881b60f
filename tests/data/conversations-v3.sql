-- A history database written by the app at schema 3 (local_chat/history/store.py at 14ac2a7), as SQL:
-- tests/test_saved_conversations.py builds the file from it.
BEGIN TRANSACTION;
CREATE TABLE conversations (id TEXT PRIMARY KEY, owner TEXT NOT NULL, title TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, messages TEXT NOT NULL, options TEXT NOT NULL DEFAULT '{}', revision INTEGER NOT NULL DEFAULT 0);
INSERT INTO "conversations" VALUES('conversation-three','browser:cccccccccccccccccccccccccccccccc','What is the capital of France?',1.7957692699877824783e+09,1.7957692699877824783e+09,'[{"role": "user", "content": "What is the capital of France?"}, {"role": "assistant", "content": "The capital of France is Paris."}, {"role": "assistant", "content": "", "metadata": {"title": "9 tokens · first token 0.02 s · 151.6 tokens/s · demo", "status": "done"}, "kind": "stats"}]','{"thinking": false}',0);
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO "settings" VALUES('browser_storage_key','df454a36961fd4c0d755c689b07c4619165091bc46f1e351cd295524b5abda81');
INSERT INTO "settings" VALUES('browser_secret','8e25ccb55a8e273635b03bf282df45fe3f80ecfd51928af98ec88dbaea9f644d');
INSERT INTO "settings" VALUES('image_key','7375446ea1516b4ec1549df31a4448b6cd05bbfbbfc20efca2d790be5b07a541');
CREATE INDEX conversations_by_owner ON conversations (owner, updated DESC);
COMMIT;
PRAGMA user_version = 3;
