"""python demos/generate.py --prompts "What is the capital of France?" [flags]: generation without the browser."""

from local_chat.launchers.generate import main

if __name__ == "__main__":
    main()
