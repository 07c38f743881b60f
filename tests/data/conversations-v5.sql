-- A history database written by the app at schema 5 (local_chat/history/store.py at 2df6904), as SQL:
-- tests/test_documents.py builds the file from it.
BEGIN TRANSACTION;
CREATE TABLE conversations (id TEXT PRIMARY KEY, owner TEXT NOT NULL, title TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, messages TEXT NOT NULL, options TEXT NOT NULL DEFAULT '{}', revision INTEGER NOT NULL DEFAULT 0);
INSERT INTO "conversations" VALUES('conversation-five','browser:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee','What is the weather in Paris?',1795800000.0,1795800000.0,'[{"role": "user", "content": "What is the weather in Paris?"}, {"role": "assistant", "content": "```json\n{\n  \"city\": \"Paris\"\n}\n```", "metadata": {"title": "Called get_weather · weather", "status": "done"}, "kind": "tool_call", "call": {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}, "server": "weather", "approval": "done"}, {"role": "assistant", "content": "```text\nSunny.\n```", "metadata": {"title": "Result of get_weather", "status": "done"}, "kind": "tool_result", "tool_call_id": "call_1", "result": "Sunny."}, {"role": "assistant", "content": "It is sunny in Paris."}]','{}',0);
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO "settings" VALUES('browser_storage_key','6731276673ddf488ba4e38d038ebb8000bbe82b3a680b975ed19cab67e6561d9');
INSERT INTO "settings" VALUES('browser_secret','edde32122b601ec03ac76b35a0e3f59e110a2a2c53b7513a8d3529542c545e5b');
INSERT INTO "settings" VALUES('image_key','35529a707f65d2f7afc61eee4b9bd11ecffe1ecb0da58bc34413e30a428068ed');
CREATE TABLE tool_approvals (owner TEXT NOT NULL, tool TEXT NOT NULL, PRIMARY KEY (owner, tool));
INSERT INTO "tool_approvals" VALUES('browser:eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee','weather/get_weather');
CREATE INDEX conversations_by_owner ON conversations (owner, updated DESC);
COMMIT;
PRAGMA user_version = 5;
