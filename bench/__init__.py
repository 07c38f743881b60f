"""The benchmark suite: python bench/run.py (CPU), python bench/gpu.py (GPU). See bench/RESULTS.md."""
