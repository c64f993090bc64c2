"""A learner's group with ``learners.sharding: fsdp``: parameters, gradients and AdamW state
sharded over the ranks with FSDP2 (``torch.distributed.fsdp.fully_shard``; PyTorch docs,
"FSDP2"), so each device holds 1/N of them instead of a whole replica.

Between sessions (chunks) a learner is whole in its process's host memory (``Learner.model``
on the CPU): that is what rank 0 checkpoints, adopts into and sends to a rank that starts. A
session shards it (``shard``): every rank copies the host model, wraps each block and then
the root with ``fully_shard`` on its training device, and takes its slice of rank 0's
parameters, anchors and AdamW moments (``distribute_tensor`` scattering from rank 0, so the
helpers' own copies only give the shapes). While the session runs, ``Learner.params``,
``Learner.anchor`` and ``Learner.opt`` are the sharded ones (DTensors, ``Shard(0)``), and the
gradients FSDP2 reduce-scatters are averaged over the ranks, as DDP's all-reduce is.

DiLoCo's outer step needs two things across the shards, each a collective that every rank
joins when rank 0's control word says so (training.engine.distributed.group):

* ``fragment_delta``: Δ = anchor − θ per shard, on each rank's own slice; only the finished Δ
  of one parameter at a time is gathered, and rank 0 keeps it on the host to compress and push.
  No rank ever holds the whole model on its device.
* ``fragment_adopt``: rank 0 scatters the adopted global fragment, one parameter at a time, and
  every rank applies replace, mix or rebase to its slice and its slice of the anchor.

``unshard`` ends the session: the shards are gathered, parameter by parameter, into every
rank's host model (so a kept helper can go on with its replica next session), and the host
optimizer takes the gathered moments.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from training.engine.learner import apply_adoption, make_inner_optimizer

if TYPE_CHECKING:
    from collections.abc import Mapping

    from training.engine.learner import Adopt, Learner

HOW = {"replace": 0, "mix": 1, "rebase": 2}  # an adoption's kind in the control word


@dataclass
class _Host:
    """What the session replaced on the learner, restored by ``unshard``."""

    params: dict[str, nn.Parameter]
    anchor: dict[str, torch.Tensor]
    opt: torch.optim.Optimizer
    device: torch.device


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated layers FSDP2 wraps one by one (every ModuleList's children: GPT's
    ``blocks``, GPT-2's ``h``, Llama's ``model.layers``), so a forward gathers one at a time."""
    return [child for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]


def _scatter(full: torch.Tensor | None, like: DTensor) -> DTensor:
    """Rank 0's ``full`` tensor, sharded like ``like`` (the other ranks pass None)."""
    local = like.to_local()
    src = full if full is not None else torch.empty(like.shape, dtype=local.dtype)
    src = src.to(local.device, local.dtype)
    return distribute_tensor(src, like.device_mesh, like.placements, src_data_rank=0)


def shard(learner: Learner, *, rank: int, world: int, device: torch.device) -> None:
    """Start a sharded session on every rank (each calls it, rank 0 with the real state)."""
    mesh = init_device_mesh(device.type, (world,))
    host = _Host(dict(learner.params), dict(learner.anchor), learner.opt, learner.device)
    net = copy.deepcopy(learner.model)
    for block in _blocks(net):
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)
    params: dict[str, Any] = dict(net.named_parameters())
    anchor: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, p in params.items():
            full = host.params[name].detach() if rank == 0 else None
            p.to_local().copy_(_scatter(full, p).to_local())
            ref = host.anchor[name] if rank == 0 else None
            anchor[name] = _scatter(ref, p).to(torch.float32)
    opt = make_inner_optimizer(list(params.values()), learner.inner)
    host_state = {name: host.opt.state.get(p, {}) for name, p in host.params.items()}
    keys = _opt_keys(host_state, rank, device)
    for name, p in params.items():
        if not keys.get(name):
            continue
        state: dict[str, Any] = {}
        for key in keys[name]:
            value = host_state[name].get(key) if rank == 0 else None
            if key == "step":  # a CPU scalar, the same on every rank
                state[key] = _broadcast_scalar(value, device)
            else:
                state[key] = _scatter(value, p)
        opt.state[p] = state
    learner.sharded = host
    learner.net, learner.params, learner.anchor, learner.opt = net, params, anchor, opt
    learner.device = device


def _opt_keys(
    host_state: Mapping[str, Mapping[str, Any]], rank: int, device: torch.device
) -> dict[str, list[str]]:
    """Rank 0's AdamW state keys per parameter (empty before its first step), told to every
    rank (as JSON bytes: nothing a rank receives is unpickled)."""
    data = json.dumps({n: sorted(st) for n, st in host_state.items()}).encode() if rank == 0 else b""
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    torch.distributed.broadcast(size, src=0)
    buf = torch.zeros(int(size), dtype=torch.uint8, device=device)
    if rank == 0:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    torch.distributed.broadcast(buf, src=0)
    keys: dict[str, list[str]] = json.loads(bytes(buf.cpu().tolist()))
    return keys


def _broadcast_scalar(value: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    t = torch.zeros(1, dtype=torch.float64, device=device)
    if value is not None:
        t[0] = float(value)
    torch.distributed.broadcast(t, src=0)
    return torch.tensor(float(t[0]))  # AdamW keeps its step count as a CPU float tensor


@torch.no_grad()
def unshard(learner: Learner, *, gather: bool = True) -> None:
    """End a sharded session on every rank: gather the shards into the host model, anchors
    and optimizer (every rank calls it, in the same order). Without ``gather`` (the group
    failed and cannot gather) the learner goes back to its host state from before the session."""
    host = learner.sharded
    assert host is not None  # noqa: S101 (a sharded session is under way)
    sharded_params, sharded_opt, opt = learner.params, learner.opt, host.opt
    if gather:
        for name, p in sharded_params.items():
            host.params[name].copy_(p.full_tensor().to(host.device, host.params[name].dtype))  # type: ignore[attr-defined]
            host.anchor[name] = learner.anchor[name].full_tensor().to(host.device, torch.float32)  # type: ignore[attr-defined]
        opt = make_inner_optimizer(list(host.params.values()), learner.inner)
        for name, p in sharded_params.items():
            state = sharded_opt.state.get(p)
            if state:
                opt.state[host.params[name]] = {
                    k: v.clone() if k == "step" else v.full_tensor().to(host.device) for k, v in state.items()
                }
    learner.params, learner.anchor, learner.opt = host.params, host.anchor, opt
    learner.net, learner.device, learner.sharded = learner.model, host.device, None


@torch.no_grad()
def fragment_delta(learner: Learner, fragment: int, *, keep: bool) -> dict[str, torch.Tensor]:
    """Δ = anchor − θ of a fragment from each rank's shards (every rank calls it); the anchor
    moves to θ. Rank 0 (``keep``) gets each parameter's whole Δ on the host, one at a time."""
    raw: dict[str, torch.Tensor] = {}
    for name in learner.fragments[fragment]:
        local = learner.params[name].detach().float()
        delta = learner.anchor[name] - local
        whole = delta.full_tensor()  # type: ignore[attr-defined]  # a DTensor's gather
        if keep:
            raw[name] = whole.cpu()
        del whole
        learner.anchor[name] = local.clone()
    return raw


@torch.no_grad()
def fragment_adopt(
    learner: Learner, fragment: int, params: Mapping[str, torch.Tensor] | None, how: Adopt, alpha: float
) -> None:
    """Adopt a global fragment into every rank's shards (every rank calls it; rank 0 passes
    ``params``, whole on its host, and scatters them one parameter at a time)."""
    for name in learner.fragments[fragment]:
        g = _scatter(None if params is None else params[name].float(), learner.anchor[name])  # type: ignore[arg-type]
        apply_adoption(learner.params[name], g, learner.anchor[name], how, alpha)
        learner.anchor[name] = g.clone()


def local_numel(learner: Learner) -> int:
    """Elements of parameters this rank holds now (1/N of the model's while sharded)."""
    return sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in learner.params.values())


__all__ = ["HOW", "fragment_adopt", "fragment_delta", "local_numel", "shard", "unshard"]
