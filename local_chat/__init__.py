"""local-chat: a browser chat app for local LLMs and vision-language models. The parts and their import order are in
docs/architecture.md."""
