"""What the commands run: the flags every launcher shares (flags.py, no torch), the model they name (loading.py), the
browser launchers (browser.py: app.py, demos/*.py, local-chat) and the command line (generate.py,
local-chat-generate)."""
