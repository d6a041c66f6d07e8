"""Offline resource report of the attention kernels for sm_90, on a machine without a GPU.

Compiles the Triton kernels that one forward+backward of ``jagged_attention`` launches (no launch: the
kernels are compiled for an H100/H200 target and never run), then prints one row per kernel: registers,
spill bytes, shared memory, and what the compiled code holds (Hopper tensor-core ops ``HGMMA`` in SASS,
FP8 tensor-core ops ``QGMMA``, local-memory traffic ``LDL``/``STL``, and in the TTGIR the ``local_alloc`` ops that stage a register tile
through shared memory). What a GPU run costs in device time, this reads for free: whether a change
removed a shared-memory round trip, added spills, or kept the tensor-core ops.

    python benchmarks/kernel_resources.py                      # batch-A-like call: causal softmax, D=128
    python benchmarks/kernel_resources.py mask=window:256 act=silu d=64 bias=1 dtype=fp16
    python benchmarks/kernel_resources.py precision=fp8            # FP8 forward and FP8 score products backward
    KERNEL_RESOURCES_DUMP=DIR python benchmarks/kernel_resources.py  # also writes each kernel's TTGIR and PTX

The dumps carry no source locations: a refactor that compiles to the same code leaves them unchanged, so
``diff -r BEFORE AFTER`` of two dumps tells, without a GPU, whether it did.

Needs the Triton the GPU machine runs (its ptxas and the kernels' source), not a GPU: the script installs
a stand-in driver that reports an sm_90 target. Set GEMTRAIN_ATTN_AUTOTUNE=0 (the default here) so each
kernel compiles its shipped configuration only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("GEMTRAIN_ATTN_AUTOTUNE", "0")
os.environ.setdefault("GEMTRAIN_ATTN_TMA", "1")  # the descriptor path of Hopper's large calls
if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("kernel_resources.py compiles for the GPU: unset TRITON_INTERPRET")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

ARCH = 90


class _TargetOnlyDriver:
    """What ``JITFunction.warmup`` asks of a driver to compile (never to launch): an sm_90 target."""

    def get_current_target(self):
        return GPUTarget("cuda", ARCH, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


def _compile_only() -> list:
    """Route every kernel launch of ``kernels/`` to a compile (``warmup``); returns the list of compiled kernels."""
    from kernels import attention_triton_common as common
    from kernels import triton_launch

    compiled: list = []

    def warm(fn, grid, args, kwargs):
        kernels = fn.warmup(*args, grid=grid, **kwargs)
        compiled.extend(kernels if isinstance(kernels, list) else [kernels])

    def launch(kernel, grid, args, meta, key):
        named = dict(zip(kernel.arg_names, args))
        kernel.nargs = named
        for config in kernel.prune_configs({**meta}):
            if config.pre_hook is not None:
                config.pre_hook({**named, **meta, **config.all_kwargs()})
        warm(kernel, grid, args, meta)

    common.launch = launch
    from kernels import attention_window_op as window_op
    window_op.tile_of = lambda q: window_op.TILE  # the GPU's tiles, not the interpreter's (CPU tensors here)
    triton_launch.run = lambda fn, grid, *args, **kwargs: warm(fn, grid, args, kwargs)
    return compiled


def _ptxas_report(ptx: str) -> dict:
    ptxas = knobs.nvidia.ptxas.path
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        out = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{ARCH}a", str(src), "-o", str(Path(tmp) / "k.o")],
                             capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return {"regs": int(regs.group(1)) if regs else -1,
            "spill": f"{spill.group(1)}/{spill.group(2)}" if spill else "?"}


def _sass_counts(cubin: bytes) -> dict:
    tool = Path(knobs.nvidia.ptxas.path).with_name("cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([str(tool), "--dump-sass", f.name], capture_output=True, text=True).stdout
    return {op: len(re.findall(rf"\b{op}\b", sass)) for op in ("HGMMA", "QGMMA", "LDL", "STL", "BAR", "MUFU")}


def _launcher_builds(kernel) -> str:
    """Whether the driver can build the kernel's launcher from its signature (on the GPU that happens at the first
    launch, after compiling): Triton's CUDA launcher counts tensor descriptors at the signature's top level only,
    so a descriptor inside a tuple argument compiles and then fails there."""
    from triton.backends.nvidia import driver as cuda_driver

    signature, meta = dict(kernel.src.signature), getattr(kernel.metadata, "tensordesc_meta", None)
    try:
        if hasattr(cuda_driver, "expand_signature"):
            cuda_driver.expand_signature(signature.values(), meta)
        else:  # triton 3.6 expands it while writing the launcher's C source
            cuda_driver.make_launcher({}, signature, meta)
    except AssertionError:
        return "no"
    return "yes"


def _parse(argv: list[str]) -> dict:
    if any(a in ("-h", "--help") for a in argv):
        sys.exit(__doc__)
    opts = {"mask": "causal", "act": "softmax", "d": "128", "h": "8", "bias": "0", "dtype": "bf16", "rows": "8",
            "len": "300", "precision": "bf16"}
    for a in argv:
        k, _, v = a.partition("=")
        if k not in opts:
            sys.exit(f"unknown option {k!r}; options: {', '.join(f'{k}={v}' for k, v in opts.items())}")
        opts[k] = v
    return opts


def main(argv: list[str]) -> None:
    opts = _parse(argv)
    driver.set_active(_TargetOnlyDriver())
    compiled = _compile_only()
    from kernels.attention_spec import RelativeBias

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[opts["dtype"]]
    h, d, rows, length = int(opts["h"]), int(opts["d"]), int(opts["rows"]), int(opts["len"])
    offsets = torch.arange(rows + 1, dtype=torch.int32) * length
    n = rows * length
    q, k, v = (torch.randn(n, h, d, dtype=dtype, requires_grad=True) for _ in range(3))
    kwargs = dict(activation=opts["act"], causal=opts["mask"] != "full")
    if opts["mask"].startswith("window:"):
        kwargs["window"] = int(opts["mask"].split(":")[1])
    if opts["mask"].startswith("block:"):
        kwargs["block_size"] = int(opts["mask"].split(":")[1])
    if opts["bias"] == "1":
        ts = torch.arange(n, dtype=torch.int64)
        kwargs["bias"] = RelativeBias(pos_weight=torch.zeros(129, h, requires_grad=True),
                                      time_weight=torch.zeros(32, h, requires_grad=True),
                                      q_timestamps=ts, kv_timestamps=ts)
    from kernels import attention_fp8_op, attention_op

    call = dict(scale=d**-0.5, bias=kwargs.pop("bias", None), block_size=kwargs.pop("block_size", None),
                window=kwargs.pop("window", None), num_targets=None, pointwise_norm="row", max_q_len=length,
                max_kv_len=length, **kwargs)
    if opts["precision"] == "fp8":
        out = attention_fp8_op.jagged_attention_fp8_triton(q, k, v, offsets, offsets, quant_block=128,
                                                         fp8_backward=True, **call)
    else:
        out = attention_op.jagged_attention_triton(q, k, v, offsets, offsets, **call)
    out.backward(torch.ones_like(out))

    print(f"sm_{ARCH}a, triton {triton.__version__}, {opts}")
    print("| kernel | warps | stages | regs | spill st/ld B | smem B | HGMMA | QGMMA | MUFU | LDL | STL | local_alloc (ttgir) | launcher |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in compiled:
        if c is None:
            continue
        md = c.metadata
        res = _ptxas_report(c.asm["ptx"])
        sass = _sass_counts(c.asm["cubin"])
        allocs = len(re.findall(r"ttg\.local_alloc", c.asm["ttgir"]))
        print(f"| {md.name} | {md.num_warps} | {md.num_stages} | {res['regs']} | {res['spill']} | {md.shared} | "
              f"{sass['HGMMA']} | {sass['QGMMA']} | {sass['MUFU']} | {sass['LDL']} | {sass['STL']} | {allocs} | {_launcher_builds(c)} |")
        dump = os.environ.get("KERNEL_RESOURCES_DUMP")
        if dump:
            Path(dump).mkdir(parents=True, exist_ok=True)
            for ext in ("ttgir", "ptx"):
                (Path(dump) / f"{md.name}.{ext}").write_text(without_locations(c.asm[ext], ext))


def without_locations(text: str, ext: str) -> str:
    """TTGIR or PTX without source locations and debug info, so that two dumps of one kernel differ only where
    its code does (a refactor that moves source lines, or code into a helper, leaves the dump unchanged)."""
    if ext == "ptx":
        text = text.split("\t.section\t.debug", 1)[0]
        drop = re.compile(r"\s*\.(loc|file)\s|\$L__tmp\d+:$")
    else:
        while "callsite(" in text:  # inlined helpers nest callsite(... at ...) inside loc(...)
            text = re.sub(r"callsite\([^()]*\)", "#loc", text)
        text = re.sub(r'"[^"]*"\(#loc\d*\)', "#loc", text)  # named locations: loc("Q"(#loc))
        text = re.sub(r" loc\([^()]*\)", "", text)
        drop = re.compile(r"#loc")
    return "\n".join(line for line in text.splitlines() if not drop.match(line)) + "\n"


if __name__ == "__main__":
    main(sys.argv[1:])
