-- A history database written by the app at schema 2 (local_chat/history/store.py at 4280724), as SQL:
-- tests/test_saved_conversations.py builds the file from it.
BEGIN TRANSACTION;
CREATE TABLE conversations (id TEXT PRIMARY KEY, owner TEXT NOT NULL, title TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, messages TEXT NOT NULL, options TEXT NOT NULL DEFAULT '{}');
INSERT INTO "conversations" VALUES('conversation-two','browser:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb','What is 2 plus 2?',1.79575017767358279226e+09,1.79575017767358279226e+09,'[{"role": "user", "content": "What is 2 plus 2?"}, {"role": "assistant", "content": "It is 4."}]','{"thinking": false}');
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO "settings" VALUES('browser_storage_key','a814ab3bb5e6a9f88302f1a288460ea5827a8988257be75056092bfef316dcb8');
INSERT INTO "settings" VALUES('browser_secret','1bb37e3ec24ec657721776d57e580e2e54d95bfbc1df0f1a4f40110f82794620');
INSERT INTO "settings" VALUES('image_key','b19abec5a6dba8c9f02127c3c2220bc16ec0fb342c52083cc4bc4b4a193bcc23');
CREATE INDEX conversations_by_owner ON conversations (owner, updated DESC);
COMMIT;
PRAGMA user_version = 2;
