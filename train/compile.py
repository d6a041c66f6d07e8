"""`torch.compile` of the model's dense blocks (`train.compile: true`).

Compiled: every `MLP` (the encoder layers' and the cross attention's), the interaction, the top tower's
MLP blocks and the heads; each in place (`nn.Module.compile`), so parameter names and checkpoints do not
change. Not compiled: the embeddings (torchrec) and the attention blocks, whose Triton kernels are custom
ops that a compiled graph could only call as opaque nodes anyway. MoE blocks stay eager (their routing is
data-dependent).

Shapes: every block is compiled with ``dynamic=True``, so the jagged token dimension (``ΣL``, different in
every batch) and the batch size are symbolic from the first call and a new batch does not recompile.

CUDA graphs are not used: the jagged blocks change shape every step, so a graph would be captured per
shape; only the top tower ([B, top_dim]) has a fixed shape, and it is a small share of a step.
"""

from __future__ import annotations

from torch import nn

from model.layers import MLP


def compilable_blocks(model: nn.Module) -> dict[str, nn.Module]:
    """The blocks `compile_dense_blocks` compiles, by qualified name (outermost only, no nesting)."""
    from model.gem import Head, TopBlock
    from model.interaction import Interaction

    out: dict[str, nn.Module] = {}
    for name, mod in model.named_modules():
        if any(name.startswith(f"{p}.") for p in out):
            continue  # inside a block already chosen
        if isinstance(mod, TopBlock):
            if isinstance(mod.ffn, MLP):  # an MoE stays eager
                out[name] = mod
        elif isinstance(mod, MLP | Interaction | Head):
            out[name] = mod
    return out


def compile_dense_blocks(model: nn.Module, *, backend: str = "inductor") -> list[str]:
    """Compiles the dense blocks of `model` in place (dynamic shapes); returns their names."""
    blocks = compilable_blocks(model)
    for mod in blocks.values():
        mod.compile(backend=backend, dynamic=True)
    return list(blocks)


def compile_for_run(model: nn.Module, enabled: bool, distributed: bool, log) -> list[str]:
    """`train.compile` in the trainer: the names compiled (after the precision policy swapped layers)."""
    if not enabled:
        return []
    if distributed:  # FSDP2/DMP wrap the blocks after this; compiling under them is not covered yet
        log("train.compile: ignored in a distributed run (the dense blocks stay eager)")
        return []
    names = compile_dense_blocks(model)
    log(f"train.compile: {len(names)} dense blocks compiled with dynamic shapes (attention and "
        "embeddings stay eager)")
    return names
