"""The demo model's build (`python -m demo_model`): its synthetic world (data), the recipe, the tokenizer, how samples
become batches (samples), the training, the evaluation and the model card. The shipped model is in assets/demo-model.
"""

import os

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # before torch: oneDNN reads it once (see build.py)
