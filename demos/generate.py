"""python demos/generate.py --prompts "What is the capital of France?" [flags]: generation without the browser."""

from launchers.generate import main

if __name__ == "__main__":
    main()
