"""The benchmark suite: python -m bench.run (CPU), python -m bench.gpu (GPU), from the checkout (python bench/run.py
and python bench/gpu.py run them too). See bench/RESULTS.md."""
