"""One rank of the parallel-pieces job: each check compares a parallel piece with the plain layer.

Run on 2 ranks by ``test_pieces.py``. Every check is a function that raises on mismatch; the
worker records, per check, ``"ok"`` or the traceback, in ``<out>/pieces.rank<r>.json``.

    python tests/engine/_pieces.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.testing import assert_close

from distlaunch.engine.model import GPT, GPTConfig, init_weights
from distlaunch.engine.optim import make_optimizer_factory
from distlaunch.engine.parallel.data import ReplicatedDP, full_tensor
from distlaunch.engine.parallel.materialize import local_slice
from distlaunch.engine.parallel.mesh import init_process_group, read_env
from distlaunch.engine.parallel.tensor import apply_tp, cross_entropy, loss_context, tp_plan
from distlaunch.engine.parallel.vocab import ShardedHead, ShardedTokenEmbedding
from distlaunch.engine.parallel.zero import ShardedDP

CFG = GPTConfig(n_layer=2, n_head=4, d_model=32, max_seq_len=16)


def _model() -> GPT:
    model = GPT(CFG)
    init_weights(model, seed=3)
    return model


def _same_input(*shape: int, tokens: bool = False) -> torch.Tensor:
    gen = torch.Generator().manual_seed(11)
    if tokens:
        return torch.randint(0, CFG.vocab_size, shape, generator=gen)
    return torch.randn(*shape, generator=gen)


def _check_layer(prefix: str) -> None:
    """A block's attention or MLP, tp-sharded with the engine's plan, against the plain layer."""
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    plain_model, sharded_model = _model(), _model()
    apply_tp(sharded_model, mesh)
    plain, sharded = plain_model.get_submodule(prefix), sharded_model.get_submodule(prefix)
    x = _same_input(2, 8, CFG.d_model).requires_grad_()
    x_tp = x.detach().clone().requires_grad_()
    out, out_tp = plain(x), sharded(x_tp)
    assert_close(out_tp, out)
    out.pow(2).sum().backward()
    out_tp.pow(2).sum().backward()
    assert_close(x_tp.grad, x.grad)
    tp_params = dict(sharded.named_parameters())
    for name, p in plain.named_parameters():
        assert_close(full_tensor(tp_params[name].grad), p.grad)


def check_tp_attention() -> None:
    _check_layer("blocks.0.attn")


def check_tp_mlp() -> None:
    _check_layer("blocks.0.mlp")


def check_tp_block_backward_does_two_all_reduces() -> None:
    """Megatron's count: one all-reduce for the fused q/k/v input gradient, one for the MLP's."""
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    model = _model()
    apply_tp(model, mesh)
    block = model.blocks["0"]
    x = _same_input(2, 8, CFG.d_model).requires_grad_()
    forward, backward = CommDebugMode(), CommDebugMode()
    with forward:
        out = block(x)
    with backward:
        out.pow(2).sum().backward()
    all_reduce = torch.ops.c10d_functional.all_reduce
    assert forward.get_comm_counts().get(all_reduce, 0) == 2, forward.get_comm_counts()
    assert backward.get_comm_counts().get(all_reduce, 0) == 2, backward.get_comm_counts()
    assert backward.get_total_counts() == 2, backward.get_comm_counts()


def check_vocab_parallel_embedding_head_and_loss() -> None:
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    plain, sharded = _model(), _model()
    apply_tp(sharded, mesh)
    x = _same_input(2, 8, tokens=True)
    y = torch.roll(x, -1, dims=1)
    loss = F.cross_entropy(plain(x).flatten(0, 1), y.flatten())
    loss.backward()
    with loss_context(mesh):
        tp_loss = cross_entropy(sharded(x), y, mesh)
        tp_loss.backward()
    assert_close(tp_loss.full_tensor(), loss)
    for name in ("tok_emb.weight", "head.weight", "pos_emb.weight"):
        assert_close(full_tensor(sharded.get_parameter(name).grad), plain.get_parameter(name).grad)


def check_tp_plan_covers_every_matrix() -> None:
    model = _model()
    planned = set(tp_plan(model))
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) and name != "pos_emb":
            assert name in planned, f"{name} is not tensor-parallel"


def _adam_reference(grads_per_rank: list[torch.Tensor], steps: int) -> torch.Tensor:
    param = torch.nn.Parameter(_same_input(6, 5))
    opt = torch.optim.AdamW([param], lr=1e-2, weight_decay=0.0, foreach=False)
    for _ in range(steps):
        param.grad = torch.stack(grads_per_rank).mean(0)
        opt.step()
    return param.detach()


def _check_zero(zero: int) -> None:
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    rank = dist.get_rank()
    param = torch.nn.Parameter(_same_input(6, 5))  # 30 elements: 15 per rank
    make = make_optimizer_factory(lr=1e-2, weight_decay=0.0)
    dp = ShardedDP([("w", param)], mesh, 1, make, zero=zero) if zero else ReplicatedDP([("w", param)], mesh, 1, make)
    grads = [torch.full((6, 5), 0.1) * (r + 1) + torch.arange(30.0).view(6, 5) / 30 for r in range(2)]
    for _ in range(3):
        dp.zero_grad()
        (param * grads[rank]).sum().backward()  # the gradient is grads[rank]
        dp.sync_grads()
        dp.step()
    assert_close(param.detach(), _adam_reference(grads, 3))
    if zero:
        state = dp.optimizer.state[dp.shards[0].master]
        assert state["exp_avg"].numel() == 15, "Adam state must be this rank's half only"


def check_zero0_allreduce_matches_adam() -> None:
    _check_zero(0)


def check_zero1_sharded_optimizer_matches_adam() -> None:
    _check_zero(1)


def check_zero2_sharded_gradients_match_adam() -> None:
    _check_zero(2)


def check_pipeline_stages_compose_to_the_model() -> None:
    from distlaunch.engine.parallel.pipeline import split_stage

    model = _model()
    x = _same_input(2, 8, tokens=True)
    for n_stages in (1, 2):
        h = x
        for stage in range(n_stages):
            h = split_stage(model, stage, n_stages)(h)
        assert_close(h, model(x))


def _lookup_job(vocab: int, dim: int, compute_dtype: torch.dtype = torch.float32):
    """(table, full weight, this rank's ids, every rank's ids): a ShardedTokenEmbedding over both ranks
    holding the rows of the same full weight, and different token ids on each rank."""
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    table = ShardedTokenEmbedding(vocab, dim, mesh, compute_dtype).to_empty(device="cpu")
    full = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        table.weight.to_local().copy_(local_slice(full, table.weight))
    gen = torch.Generator().manual_seed(9)
    every = [torch.randint(0, vocab, (3, 5), generator=gen) for _ in range(2)]
    every[1][0, :2] = torch.tensor([0, vocab - 1])  # the first and the last row (the shorter shard's)
    return table, full, every[dist.get_rank()], every


def check_sharded_lookup_matches_a_plain_embedding() -> None:
    """Rows split 4 + 3 over the two dp ranks; each rank looks up its own tokens and gets the rows of
    its shard's gradient of the dp mean, as FSDP's reduce-scatter would give it."""
    for compute_dtype in (torch.float32, torch.bfloat16):
        table, full, ids, every = _lookup_job(7, 6, compute_dtype)
        out = table(ids)
        assert out.dtype == compute_dtype, out.dtype
        assert_close(out, F.embedding(ids, full).to(compute_dtype), rtol=0, atol=0)
        grads = [torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(20 + r)) for r in range(2)]
        out.backward(grads[dist.get_rank()].to(compute_dtype))
        plain = full.clone().requires_grad_(True)
        looked_up = [F.embedding(i, plain).to(compute_dtype) for i in every]
        sum((e * g.to(compute_dtype)).sum() for e, g in zip(looked_up, grads, strict=True)).backward()
        mine = table.weight.grad.to_local()
        assert_close(mine, local_slice(plain.grad / 2, table.weight), rtol=1e-6, atol=1e-6)


def check_sharded_lookup_refuses_a_token_outside_the_table_on_every_rank() -> None:
    """Rank 1's batch holds an id one past the last row: no rank holds that row, so without a check it
    would embed as zeros. Both ranks see it (the ids are gathered) and both raise, neither waits."""
    table, _, ids, _ = _lookup_job(7, 6)
    if dist.get_rank() == 1:
        ids = ids.clone()
        ids[2, 4] = 7
    try:
        table(ids)
    except IndexError as err:
        assert "token id 7 is outside the vocabulary (0..6)" in str(err), err
    else:
        raise AssertionError("an id outside the table was embedded")


def check_sharded_head_and_loss_match_a_plain_head() -> None:
    """The head's rows split 4 + 4 over the two dp ranks, each rank with tokens of its own: every
    rank's loss is the mean over both ranks' tokens, the weight's gradient is this rank's rows of
    that mean's, and the hidden states' gradient is that of the rank's own tokens' mean (what the
    rest of its backward expects under FSDP, which averages over dp after)."""
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    head = ShardedHead(8, 6, mesh, torch.float32).to_empty(device="cpu")
    full = torch.randn(8, 6, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        head.weight.to_local().copy_(local_slice(full, head.weight))
    gen = torch.Generator().manual_seed(9)
    hidden = [torch.randn(3, 5, 6, generator=gen) for _ in range(2)]
    targets = [torch.randint(0, 8, (3, 5), generator=gen) for _ in range(2)]
    rank = dist.get_rank()
    mine = hidden[rank].clone().requires_grad_(True)
    with loss_context(mesh):
        loss = cross_entropy(head(mine), targets[rank], mesh, every_rank=True)
        loss.backward()
    plain = full.clone().requires_grad_(True)
    plain_hidden = [h.clone().requires_grad_(True) for h in hidden]
    per_rank = [
        F.cross_entropy((h @ plain.T).flatten(0, 1), t.flatten()) for h, t in zip(plain_hidden, targets, strict=True)
    ]
    (sum(per_rank) / 2).backward()
    assert_close(loss.to_local(), (sum(per_rank) / 2).detach())
    assert_close(head.weight.grad.to_local(), local_slice(plain.grad, head.weight))
    assert_close(mine.grad, plain_hidden[rank].grad * 2)  # d(own mean)/dh = dp x d(dp mean)/dh


def check_sharded_lookup_never_holds_the_whole_table() -> None:
    """A 16 MiB table over 2 ranks: a forward and backward allocate this rank's gradient (8 MiB) and
    buffers of a few tokens, never a whole-table copy (FSDP's unit: the gathered table, then a
    whole-table gradient and its reduce-scatter buffer, 32 MiB at once)."""
    from tests.live_memory import PeakLiveBytes, count_allocations

    count_allocations()
    table, full, ids, _ = _lookup_job(65536, 64)
    table_bytes = full.numel() * 4
    with PeakLiveBytes() as window:
        table(ids).sum().backward()
    grown = window.peak - window.start
    assert table_bytes // 2 <= grown < table_bytes * 0.6, (grown, table_bytes)


CHECKS = {name: fn for name, fn in globals().items() if name.startswith("check_")}


def main(out_dir: str) -> None:
    env = read_env()
    init_process_group(env, torch.device("cpu"))
    results = {}
    for name, check in CHECKS.items():
        try:
            check()
            results[name] = "ok"
        except Exception:  # recorded and reported by the test, one result per check
            results[name] = traceback.format_exc()
        dist.barrier()
    (Path(out_dir) / f"pieces.rank{env.rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
