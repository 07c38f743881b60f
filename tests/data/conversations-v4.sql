-- A history database written by the app at schema 4 (local_chat/history/store.py at 6a0a448), as SQL:
-- tests/test_saved_conversations.py builds the file from it.
BEGIN TRANSACTION;
CREATE TABLE conversations (id TEXT PRIMARY KEY, owner TEXT NOT NULL, title TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, messages TEXT NOT NULL, options TEXT NOT NULL DEFAULT '{}', revision INTEGER NOT NULL DEFAULT 0);
INSERT INTO "conversations" VALUES('conversation-four','browser:dddddddddddddddddddddddddddddddd','What is the weather in Paris?',1795769270.0,1795769270.0,'[{"role": "user", "content": "What is the weather in Paris?"}, {"role": "assistant", "content": "", "metadata": {"title": "Called get_weather", "status": "done"}, "kind": "tool_call", "call": {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}}, {"role": "assistant", "content": "Sunny.", "metadata": {"title": "Result of get_weather", "status": "done"}, "kind": "tool_result", "tool_call_id": "call_1"}, {"role": "assistant", "content": "It is sunny in Paris.", "model": "tiny-qwen"}]','{"thinking": false}',0);
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO "settings" VALUES('browser_storage_key','ccc16e736c05e9132374bab3b25b90846187719cd819eb56549cbe289914e7eb');
INSERT INTO "settings" VALUES('browser_secret','71e53b8f5c8f3f6b428a191fc01521a982da05be4e07c1838ad5e19af27c5007');
INSERT INTO "settings" VALUES('image_key','353d3fa13f0f70d077bc1384bb642806b1c612f156983c8400f659c0c53e68a1');
CREATE INDEX conversations_by_owner ON conversations (owner, updated DESC);
COMMIT;
PRAGMA user_version = 4;
