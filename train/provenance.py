"""What a run's numbers depend on besides its config: library versions, the device and the environment switches
that pick kernels (``GEMTRAIN_*``, cuBLAS and TF32 overrides). The run summary records it, so two runs of one
config from different calls or machines can be told apart when their figures disagree."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# Environment variables that change which kernels run or how they accumulate.
ENV_PREFIXES = ("GEMTRAIN_", "CUBLAS_", "CUBLASLT_", "NVIDIA_TF32_OVERRIDE", "TORCH_CUDNN_", "TRITON_")
REPO = Path(__file__).resolve().parents[1]


def _revision() -> str | None:
    """The checkout's commit (with "+changes" where tracked files differ), None outside a git checkout."""
    if not (REPO / ".git").exists():
        return None
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("+changes" if dirty else "")


def software(device) -> dict:
    """The record for a run on ``device`` (a torch.device)."""
    import torch  # here, so the comparison below stays usable without torch

    out: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "revision": _revision(),
                 "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                 "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
                 "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}}
    try:
        import triton
        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    return out


def differences(a: dict | None, b: dict | None) -> str:
    """The keys of two ``software`` records that differ ("env NAME" for an environment switch), "nothing" where
    none does, "not recorded" where a run has none (summaries from before the record)."""
    if not a or not b:
        return "not recorded"
    flat = lambda sw: {**{k: v for k, v in sw.items() if k != "env"},
                       **{f"env {k}": v for k, v in (sw.get("env") or {}).items()}}
    fa, fb = flat(a), flat(b)
    return ", ".join(sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))) or "nothing"
