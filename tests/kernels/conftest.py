"""Run the Triton kernels on CPU tensors through the interpreter (set before any kernel module is imported)."""

import os

os.environ["TRITON_INTERPRET"] = "1"
