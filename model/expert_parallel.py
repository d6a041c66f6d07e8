"""Expert parallelism for the MoE MLP: experts spread over an expert-parallel group, tokens moved by all-to-all.

`ExpertParallelMoE` replaces a `model.moe.MoE`: each rank keeps num_experts / ep of the experts,
tokens are dispatched to the ranks holding their experts and combined back with `all_to_all_single`,
and the load-balance loss uses the routing statistics of the global batch, so the result equals the
single-device MoE. Applied from outside the model code by `model.parallelize.parallelize`.
"""

from __future__ import annotations

import torch
from torch import nn


class ExpertParallelMoE(nn.Module):
    """`model.moe.MoE` with its experts spread over an expert-parallel process group.

    Rank r of the EP group keeps experts [r*E/ep, (r+1)*E/ep). Each rank routes its own tokens with
    the (replicated) router, sends every (token, expert) assignment to the expert's owner with one
    `all_to_all_single` (split sizes exchanged first), the owners run their experts, and a second
    all-to-all brings the outputs back, where they are gated and summed per token exactly as `MoE`
    does. The load-balance loss uses the routing statistics of all ranks (all-reduced, with
    gradients), so it equals the single-device loss on the global batch.

    Gradients: the router is replicated, averaged over all ranks; an expert's gradient collects every
    rank's tokens through the all-to-all backward, so it is summed over the expert's replicas (the
    "ep_replicate" group) and divided by the world size: the gradient of the mean of the ranks' losses.
    State-dict keys carry the global expert index (`experts.5.fc1.weight`), so checkpoints load at any
    EP size.
    """

    precision_kind = "mlp"
    expert_parallel = True

    def __init__(self, moe: nn.Module, ep_group, replicate_group=None):
        import torch.distributed as dist

        super().__init__()
        ep = dist.get_world_size(ep_group)
        r = dist.get_rank(ep_group)
        e = moe.num_experts
        if e % ep:
            from model.parallelize import ParallelConfigError  # defined beside the config it checks

            raise ParallelConfigError(f"MoE with {e} experts cannot be spread over expert_parallel={ep} ranks; "
                                      "make num_experts a multiple of it")
        self.num_experts, self.top_k, self.load_balance_weight = e, moe.top_k, moe.load_balance_weight
        self.ep, self.ep_group, self.replicate_group = ep, ep_group, replicate_group
        self.local = e // ep
        self.first = r * self.local
        self.router = moe.router
        self.experts = nn.ModuleList(list(moe.experts)[self.first:self.first + self.local])
        self._register_grad_sync()
        self._register_state_dict_hook(_ep_state_dict_hook)
        self._register_load_state_dict_pre_hook(_ep_load_hook, with_module=True)

    def _register_grad_sync(self) -> None:
        import torch.distributed as dist

        world = dist.get_world_size()

        def router_hook(p):
            dist.all_reduce(p.grad)
            p.grad.div_(world)

        def expert_hook(p):
            if self.replicate_group is not None:
                dist.all_reduce(p.grad, group=self.replicate_group)
            p.grad.div_(world)

        for p in self.router.parameters():
            p.register_post_accumulate_grad_hook(router_hook)
        for p in self.experts.parameters():
            p.register_post_accumulate_grad_hook(expert_hook)
            p._ep_replicas = world // self.ep  # ranks holding this expert (for a global gradient norm)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch.distributed as dist
        import torch.distributed.nn.functional as dnf

        k, e = self.top_k, self.num_experts
        probs = torch.softmax(self.router(x).float(), dim=-1)
        top_p, top_i = probs.topk(k, dim=-1)
        gates = top_p / top_p.sum(dim=-1, keepdim=True)
        # global routing statistics: counts without gradient, probability sums with
        counts = torch.zeros(e + 1, device=x.device, dtype=torch.float32)
        counts[:e] = counts[:e].index_add(0, top_i.reshape(-1), torch.ones(top_i.numel(), device=x.device))
        counts[e] = x.shape[0]
        dist.all_reduce(counts)
        prob_sum = dnf.all_reduce(probs.sum(dim=0))
        n_total = counts[e]
        frac = counts[:e] / (n_total * k).clamp_min(1)
        aux = e * (frac * prob_sum / n_total.clamp_min(1)).sum() * self.load_balance_weight

        flat_e = top_i.reshape(-1)
        order = torch.argsort(flat_e, stable=True)
        token = order // k
        sorted_e = flat_e[order]
        if self.ep == 1:  # every expert is here: MoE's own dispatch
            sizes = torch.bincount(flat_e, minlength=e).tolist()
            ys = [expert(c) for expert, c in zip(self.experts, x.index_select(0, token).split(sizes))]
            y = torch.cat(ys, dim=0) * gates.reshape(-1)[order][:, None].to(ys[0].dtype)
            return y.new_zeros(x.shape[0], y.shape[1]).index_add(0, token, y), aux
        dest = sorted_e // self.local
        send = torch.bincount(dest, minlength=self.ep)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.ep_group)
        send_l, recv_l = send.tolist(), recv.tolist()
        xs = x.index_select(0, token)
        n_recv = sum(recv_l)
        recv_x = dnf.all_to_all_single(xs.new_empty(n_recv, x.shape[1]), xs, recv_l, send_l, group=self.ep_group)
        recv_e = torch.empty(n_recv, dtype=sorted_e.dtype, device=x.device)
        dist.all_to_all_single(recv_e, sorted_e - dest * self.local, recv_l, send_l, group=self.ep_group)
        # run the local experts on what arrived, grouped by expert
        o2 = torch.argsort(recv_e, stable=True)
        sizes = torch.bincount(recv_e, minlength=self.local).tolist()
        chunks = recv_x.index_select(0, o2).split(sizes)
        ys = torch.cat([expert(c) for expert, c in zip(self.experts, chunks)], dim=0)
        out_recv = ys.new_zeros(n_recv, ys.shape[1]).index_copy(0, o2, ys)
        back = dnf.all_to_all_single(out_recv.new_empty(len(token), ys.shape[1]), out_recv, send_l, recv_l,
                                     group=self.ep_group)
        y = back * gates.reshape(-1)[order][:, None].to(back.dtype)
        out = y.new_zeros(x.shape[0], y.shape[1]).index_add(0, token, y)
        return out, aux

    def flops(self, tokens: int) -> int:
        e = self.experts[0]
        return 2 * tokens * self.router.in_features * self.num_experts + self.top_k * e.flops(tokens)


def _ep_state_dict_hook(module, state_dict, prefix, _local_metadata):
    """experts.<local i> -> experts.<global first + i>."""
    renamed = {}
    for key in list(state_dict):
        if key.startswith(prefix + "experts."):
            rest = key[len(prefix + "experts."):]
            i, _, tail = rest.partition(".")
            renamed[f"{prefix}experts.{int(i) + module.first}.{tail}"] = state_dict.pop(key)
    state_dict.update(renamed)
    return state_dict


def _ep_load_hook(module, state_dict, prefix, *_args):
    """Keeps this rank's experts from a full state dict, renamed to local indices."""
    for key in list(state_dict):
        if key.startswith(prefix + "experts."):
            rest = key[len(prefix + "experts."):]
            i, _, tail = rest.partition(".")
            g = int(i)
            value = state_dict.pop(key)
            if module.first <= g < module.first + module.local:
                state_dict[f"{prefix}experts.{g - module.first}.{tail}"] = value


def _has_moe(model: nn.Module) -> bool:
    from model.moe import MoE

    return any(isinstance(m, MoE) for m in model.modules())


def apply_expert_parallel(model: nn.Module, ep_group, replicate_group=None) -> int:
    """Replaces every `model.moe.MoE` in `model` by an `ExpertParallelMoE`; returns how many."""
    from model.moe import MoE

    n = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, MoE):
                setattr(parent, name, ExpertParallelMoE(child, ep_group, replicate_group))
                n += 1
    return n
